"""The FEMNIST-shaped workload of issue #28, shared by fedray's side and the peers' scripts.

A LEAF-format FEMNIST directory (``train/`` and ``test/`` JSON shards, as LEAF's
``preprocess.sh`` writes them and ``data.dataset=leaf`` reads them): ``clients`` writers,
each with 100–300 training rows (drawn from ``seed``) and a tenth as many test rows, every
row 784 floats in [0, 1] (one 28×28 grey image) and a label in 0..61. The model is LEAF's
FEMNIST CNN (two 5×5 'same' convolutions of 32 and 64 channels, each with ReLU and a 2×2
max-pool, a dense layer of 2,048 units, 62 classes: 6,603,710 parameters), fedray's
``leaf_cnn``. Local training: one epoch of SGD, batch 10, lr 0.05.

Every system reads the same files: fedray through its LEAF reader (one client per writer in
sorted writer order), Flower and pfl-research through :func:`read_train` here (same order),
so each trains the same clients on the same rows. This module needs numpy and torch only
(the peers' virtualenvs have nothing of fedray's).
"""

from __future__ import annotations

import json
import os

import numpy as np

SIDE = 28
CLASSES = 62
DENSE = 2048
BATCH_SIZE = 10
LR = 0.05
SIZES = (100, 300)
EXPECTED_PARAMS = 6_603_710


def write(root: str, clients: int = 100, seed: int = 0, shards: int = 4) -> str:
    """Write the dataset under ``root`` unless a complete copy for (clients, seed) is there;
    returns ``root``."""
    stamp = os.path.join(root, "workload.json")
    want = {"clients": clients, "seed": seed, "shards": shards, "sizes": list(SIZES)}
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == want:
                return root
    g = np.random.default_rng(seed)
    sizes = g.integers(SIZES[0], SIZES[1] + 1, clients)
    users = [f"f{c:04d}_{int(g.integers(0, 100)):02d}" for c in range(clients)]
    # the rows' JSON text from a table of the 1,001 values a 3-decimal pixel takes: json.dump
    # of lists would take half an hour at LEAF's size; the values parse to the same float32s
    text = np.array([str(v) for v in
                     np.arange(1001, dtype=np.float32) / np.float32(1000)], dtype=object)
    for split in ("train", "test"):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        for k in range(shards):
            part = users[k::shards]
            counts, blobs = [], []
            for u in part:
                n = int(sizes[users.index(u)])
                n = n if split == "train" else max(1, n // 10)
                x = g.random((n, SIDE * SIDE), dtype=np.float32).round(3)
                y = g.integers(0, CLASSES, n)
                idx = np.rint(x * 1000).astype(np.int64)
                rows = ",".join("[" + ",".join(r) + "]" for r in text[idx].tolist())
                counts.append(n)
                blobs.append(f'{json.dumps(u)}: {{"x": [{rows}], "y": {json.dumps(y.tolist())}}}')
            path = os.path.join(root, split, f"all_data_{k}_niid_0_keep_0_{split}_9.json")
            with open(path, "w") as f:
                f.write(f'{{"users": {json.dumps(part)}, "num_samples": {json.dumps(counts)}, '
                        f'"user_data": {{{", ".join(blobs)}}}}}')
    with open(stamp, "w") as f:
        json.dump(want, f)
    return root


def read_train(root: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every writer's training rows, writers in sorted id order (fedray's client order):
    x as (n, 1, 28, 28) float32, y as int64."""
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    folder = os.path.join(root, "train")
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            doc = json.load(f)
        for u in doc["users"]:
            d = doc["user_data"][u]
            users[u] = (np.asarray(d["x"], np.float32).reshape(-1, 1, SIDE, SIDE),
                        np.asarray(d["y"], np.int64))
    return [users[u] for u in sorted(users)]


_TRAIN: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}


def client_train(root: str, client: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client``'s training rows, the files read once per process (a Flower client
    actor keeps them between calls, as a Flower Datasets partition would be kept)."""
    if root not in _TRAIN:
        _TRAIN[root] = read_train(root)
    return _TRAIN[root][client]


def leaf_cnn():
    """LEAF's FEMNIST CNN in plain torch, layer for layer fedray's ``leaf_cnn``."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, DENSE), nn.ReLU(),
                         nn.Linear(DENSE, CLASSES))


def fedray_overrides(root: str, clients: int, rounds: int, seed: int, cache: str) -> list[str]:
    """fedray's config for the workload (all clients every round, no evaluation)."""
    return [
        "name=femnist-overhead", f"seed={seed}", f"rounds={rounds}",
        "data.dataset=leaf", f"data.root={root}", f"data.cache_dir={cache}",
        f"clients.num_clients={clients}", "clients.fraction=1.0",
        "model.name=leaf_cnn", f"model.dense={DENSE}",
        "local.epochs=1", f"local.batch_size={BATCH_SIZE}", f"local.lr={LR}",
        "eval.every=0", "eval.clients=none", "eval.global_test=false",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]",
    ]
