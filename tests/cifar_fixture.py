"""A tiny fake CIFAR-10/100 in torchvision's real on-disk format, for offline loader tests.

:func:`write_fake_cifar` writes the same pickle files torchvision reads
(``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta`` or
``cifar-100-python/train``, ``test``, ``meta``). torchvision checks each file's md5, so
:func:`patch_cifar_md5` points the classes' ``train_list``/``test_list``/``meta`` at the
generated files' md5 sums (through pytest's ``monkeypatch``, undone after the test).
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Literal

import numpy as np

CIFAR10_FILES = {"folder": "cifar-10-batches-py",
                 "train": [f"data_batch_{i}" for i in range(1, 6)],
                 "test": ["test_batch"], "meta": "batches.meta"}
CIFAR100_FILES = {"folder": "cifar-100-python", "train": ["train"], "test": ["test"],
                  "meta": "meta"}


def _files(name: str) -> dict:
    return CIFAR10_FILES if name == "cifar10" else CIFAR100_FILES


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _batch(name: str, n: int, gen: np.random.Generator) -> tuple[dict, np.ndarray]:
    num_classes = 10 if name == "cifar10" else 100
    data = gen.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = (np.arange(n) % num_classes).astype(int)
    if name == "cifar10":
        return {"batch_label": "fake", "data": data, "labels": labels.tolist()}, labels
    return {"data": data, "fine_labels": labels.tolist(),
            "coarse_labels": (labels // 5).tolist()}, labels


def write_fake_cifar(root: str | Path, name: Literal["cifar10", "cifar100"],
                     train_per_file: int = 20, num_test: int = 20, seed: int = 0) -> dict:
    """Write a fake ``name`` under ``root``; returns {"x_train", "y_train", "x_test", "y_test"}.

    The returned arrays are the raw uint8 NHWC images and int labels in torchvision's order,
    so a test can check what a loader read. CIFAR-100 writes one train file of
    ``5 * train_per_file`` samples, CIFAR-10 five files of ``train_per_file`` each.
    """
    files = _files(name)
    folder = Path(root) / files["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(seed)
    per_file = train_per_file if name == "cifar10" else 5 * train_per_file
    xs, ys = [], []
    for fname in files["train"]:
        batch, labels = _batch(name, per_file, gen)
        _dump(folder / fname, batch)
        xs.append(batch["data"])
        ys.append(labels)
    test, y_test = _batch(name, num_test, gen)
    _dump(folder / files["test"][0], test)
    if name == "cifar10":
        meta = {"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": per_file,
                "num_vis": 3072}
    else:
        meta = {"fine_label_names": [f"fine{i}" for i in range(100)],
                "coarse_label_names": [f"coarse{i}" for i in range(20)]}
    _dump(folder / files["meta"], meta)

    def nhwc(raw: np.ndarray) -> np.ndarray:
        return raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)

    return {"x_train": nhwc(np.vstack(xs)), "y_train": np.concatenate(ys),
            "x_test": nhwc(test["data"]), "y_test": y_test}


def md5(path: str | Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def patch_cifar_md5(monkeypatch, root: str | Path, name: Literal["cifar10", "cifar100"]) -> None:
    """Make torchvision's integrity check accept the fake files written under ``root``."""
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    files = _files(name)
    folder = Path(root) / files["folder"]
    monkeypatch.setattr(cls, "train_list", [[f, md5(folder / f)] for f in files["train"]])
    monkeypatch.setattr(cls, "test_list", [[f, md5(folder / f)] for f in files["test"]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(folder / files["meta"])})
