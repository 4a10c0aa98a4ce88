"""Natural-split builds streamed (issue #31, deliverable 6): rows written as record batches
of whole clients and read across them; the readers' pool of processes gives the same entry
as the calling process; a build that fails part-way leaves nothing in the cache; a killed
build's spool folder is removed by the next build."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from test_leaf import USERS, assert_cache_empty, leaf_cfg, write_leaf
from test_tff_h5 import tff_cfg, write_tff
from test_tff_text import cfg_of, write_text

from fedray.core.spec import ConfigError
from fedray.data import natural, tff
from fedray.data.population import build_client_data

WORDS = ["python", "list", "sort", "a", "b", "dict", "zzz", "key", "value", "loop"]


def so_clients(n: int, seed: int = 0) -> dict[str, tuple[list[str], list[str]]]:
    g = np.random.default_rng(seed)

    def sentence() -> str:
        return " ".join(g.choice(WORDS, int(g.integers(1, 25))))

    return {f"u{i:03d}": ([sentence() for _ in range(int(g.integers(1, 5)))],
                          [sentence() for _ in range(int(g.integers(0, 3)))])
            for i in range(n)}


def batches(pop) -> int:
    return pa.ipc.open_file(pa.memory_map(pop.path)).num_record_batches


def assert_same_entry(a, b) -> None:
    assert a.natural_ids.tolist() == b.natural_ids.tolist()
    assert a.info["classes"] == b.info["classes"] and a.input_shape == b.input_shape
    for k in ("offsets", "split", "x_test", "y_test"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    for c in range(a.num_clients):
        for split in ("train", "test"):
            for u, v in zip(a.client_arrays(c, 1, split), b.client_arrays(c, 1, split),
                            strict=True):
                assert u.dtype == v.dtype and np.array_equal(u, v), (c, split)


def assert_global_test_is_the_clients_test_rows(pop, seed: int = 0) -> None:
    """x_test / y_test are the rows the seeded draw picks from the kept clients' test rows
    (read back from the written batches)."""
    from fedray.core.seeding import rng

    xs, ys, test_rows, at = [], [], [], 0
    for c in range(pop.num_clients):
        for split in ("train", "test"):
            x, y = pop.client_arrays(c, 1, split)
            xs.append(x)
            ys.append(y)
            if split == "test":
                test_rows.append(np.arange(at, at + len(y)))
            at += len(y)
    test_rows = np.concatenate(test_rows)
    pick = np.sort(rng(seed, -1, -1, "population-global-test").choice(
        test_rows, min(10_000, len(test_rows)), replace=False))
    assert len(pick) and np.array_equal(np.concatenate(xs)[pick], pop.x_test)
    assert np.array_equal(np.concatenate(ys)[pick], pop.y_test)


def test_pool_and_one_batch_per_client_give_the_same_stackoverflow_entry(tmp_path,
                                                                         monkeypatch):
    root = tmp_path / "so"
    write_text(root, "tokens", so_clients(30), "stackoverflow")  # vocabulary counted
    extra = ("clients.num_clients=20", "data.vocab_size=6")  # min_samples 2 skips some
    here = build_client_data(cfg_of(root, tmp_path / "here", *extra))
    assert batches(here) == 1
    monkeypatch.setattr(natural, "POOL_MIN_UNITS", 2)
    monkeypatch.setattr(natural, "BATCH_BYTES", 1)
    monkeypatch.setattr(tff, "UNIT_CLIENTS", 4)  # 8 units, counted and converted in a pool
    pooled = build_client_data(cfg_of(root, tmp_path / "pool", *extra))
    assert batches(pooled) >= 5  # each unit of 4 clients its own record batch
    assert_same_entry(here, pooled)
    assert_global_test_is_the_clients_test_rows(pooled)
    assert here.info["classes"][1:7] == pooled.info["classes"][1:7]
    again = build_client_data(cfg_of(root, tmp_path / "pool", *extra))  # the cache, mapped
    assert again.path == pooled.path
    assert_same_entry(pooled, again)


def test_leaf_shards_spooled_in_a_pool_give_the_same_entry(tmp_path, monkeypatch):
    root = tmp_path / "leaf"
    data = write_leaf(root, USERS, shards=3)
    here = build_client_data(leaf_cfg(root, tmp_path / "here"))
    monkeypatch.setattr(natural, "POOL_MIN_UNITS", 2)
    monkeypatch.setattr(natural, "BATCH_BYTES", 1)
    pooled = build_client_data(leaf_cfg(root, tmp_path / "pool"))
    assert batches(pooled) == 3
    assert_same_entry(here, pooled)
    assert_global_test_is_the_clients_test_rows(pooled)
    x, y = pooled.client_arrays(2, 1, "test")  # f0003_12: its own test rows, as written
    assert np.array_equal(x.reshape(len(x), -1), data["f0003_12"]["test"][0].astype(np.float32))
    assert np.array_equal(y, data["f0003_12"]["test"][1])
    assert not [n for n in os.listdir(tmp_path / "pool" / "cache" / "populations")
                if ".tmp-" in n]  # the spool folder removed


def test_a_build_failing_part_way_leaves_nothing(tmp_path, monkeypatch):
    root = tmp_path / "tff"
    clients = {f"c{i:02d}": (3, 1) for i in range(12)}
    write_tff(root, clients)
    import h5py

    with h5py.File(root / "fed_emnist_train.h5", "a") as f:  # the last client: other images
        del f["examples/c11/pixels"]
        f.create_dataset("examples/c11/pixels", data=np.zeros((3, 14, 14), np.float32))
    monkeypatch.setattr(natural, "BATCH_BYTES", 1)  # batches written before the bad client
    monkeypatch.setattr(natural, "POOL_MIN_UNITS", 2)  # raised in a pool worker
    monkeypatch.setattr(tff, "UNIT_CLIENTS", 2)
    with pytest.raises(ConfigError, match=r"client c11.*one shape \(1, 28, 28\)"):
        build_client_data(tff_cfg(root, tmp_path, "clients.num_clients=12"))
    assert_cache_empty(tmp_path)


def test_a_killed_builds_spool_folder_is_removed(tmp_path):
    root = tmp_path / "leaf"
    write_leaf(root, USERS)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    folder = tmp_path / "cache" / "populations"
    spool = folder / f"{'0' * 32}.spool.tmp-{socket.gethostname()}-{gone}"
    os.makedirs(spool)
    (spool / "0.bin").write_bytes(b"\0" * 64)
    held = [folder / f"{'1' * 32}.test.{ext}.tmp-{socket.gethostname()}-{gone}"
            for ext in ("arrow", "index.npz")]  # a held-out entry's, killed mid-write
    for path in held:
        path.write_bytes(b"\0" * 64)
    build_client_data(leaf_cfg(root, tmp_path))
    assert not spool.exists() and not any(p.exists() for p in held)


@pytest.mark.parametrize("group_bytes", [1, 16 << 20])  # a CSV call per user, or one
def test_leafs_numeric_rows_read_fast_equal_json_then_numpy(tmp_path, monkeypatch,
                                                            group_bytes):
    """The Arrow CSV path of fedray.data.leaf._parsed gives the float32s json.load and
    np.asarray give, for awkward numbers too, and rows it cannot read as one table fall
    back to json (and its checks)."""
    from fedray.data import leaf
    from fedray.data.leaf import _parsed, _shard

    monkeypatch.setattr(leaf, "CSV_GROUP_BYTES", group_bytes)

    odd = [0.1, 1e-45, 3.4028235e38, 16777217.0, 0.12300000339746475, -0.0, 5e-324,
           1e-7, 2.5e-39, 123456789.123, 1 / 3]
    x = [odd[i:] + odd[:i] for i in range(len(odd))]
    doc = {"users": ["a", "b"], "num_samples": [len(x), 2],
           "user_data": {"a": {"x": x, "y": [0] * len(x)},
                         "b": {"x": [[1, 2e3, -4] + [0] * 8, [5] * 11], "y": [1, 2]}}}
    path = tmp_path / "shard.json"
    for text, fast in ((json.dumps(doc), True), (json.dumps(doc, separators=(",", ":")), True),
                       (json.dumps(doc, indent=2), False)):  # indented: json's path
        path.write_text(text)
        assert (_parsed(path.read_bytes())[1] is not None) == fast
        got = _shard(str(path))
        for user in ("a", "b"):
            want = np.asarray(doc["user_data"][user]["x"], np.float32)
            assert got[user][0].dtype == np.float32
            assert np.array_equal(got[user][0].view(np.uint32), want.view(np.uint32)), user
    doc["user_data"]["b"]["x"][1] = [5] * 10  # ragged: json's path names the user
    path.write_text(json.dumps(doc))
    assert _parsed(path.read_bytes())[1] is None
    with pytest.raises(ConfigError, match="user b.*equal-length lists"):
        _shard(str(path))


@pytest.mark.parametrize("bad", ["[[1 2, 3]]", "[[--1, 2]]", "[[1, 2], [3 4]]"])
def test_leaf_rows_json_refuses_are_refused_on_the_fast_path_too(tmp_path, bad):
    """Text that is not JSON and that Arrow's CSV reader would misread (a space inside a
    number: 12) or refuse goes to json: one error naming the file. (+1, .5, 1. and 01 are
    read as the numbers they spell: the documented leniency.)"""
    from fedray.data.leaf import _parsed, _shard

    path = tmp_path / "shard.json"
    path.write_text('{"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": ' + bad
                    + ', "y": [1]}}}')
    with pytest.raises(ValueError):
        _parsed(path.read_bytes())
    with pytest.raises(ConfigError, match="does not parse"):
        _shard(str(path))


def test_clients_without_test_rows_give_an_empty_global_test_set(tmp_path):
    root = tmp_path / "leaf"
    write_leaf(root, {u: (n, 0) for u, (n, _) in USERS.items()})
    pop = build_client_data(leaf_cfg(root, tmp_path))
    assert pop.x_test.shape == (0, 1, 28, 28) and len(pop.y_test) == 0
    assert all(pop.num_samples(c, "test") == 0 for c in range(pop.num_clients))


def test_an_entry_whose_batches_split_a_client_is_rebuilt(tmp_path, monkeypatch):
    from fedray.data.population import TablePopulation

    root = tmp_path / "leaf"
    write_leaf(root, USERS, shards=3)
    monkeypatch.setattr(natural, "BATCH_BYTES", 1)  # one record batch per client
    pop = build_client_data(leaf_cfg(root, tmp_path))
    index = pop.path.replace(".arrow", ".index.npz")
    with np.load(index, allow_pickle=False) as z:
        parts = dict(z)
    parts["offsets"] = parts["offsets"] + np.array([0, 1, 1, 0])  # boundaries inside clients
    parts["split"] = np.minimum(parts["split"], parts["offsets"][1:])
    with open(index, "wb") as fh:
        np.savez(fh, **parts)
    with pytest.raises(ValueError, match="does not match its index"):
        TablePopulation._from_cache(pop.path, index)
    again = build_client_data(leaf_cfg(root, tmp_path))  # rebuilt, not served split
    assert_same_entry(pop, again)


def test_the_pool_keeps_results_in_order():
    assert list(natural.ordered_map(abs, list(range(0, -40, -1)))) == list(range(40))


def test_a_script_without_a_main_guard_can_use_the_pool(tmp_path):
    """The pool's spawned workers do not run the caller's script again (they would start
    their own build and break the pool): a plain script builds through the pool."""
    import subprocess
    import sys

    root = tmp_path / "tff"
    write_tff(root, {f"c{i:02d}": (3, 1) for i in range(8)})
    script = tmp_path / "build.py"
    script.write_text(f"""
from fedray.core.config import load_config
from fedray.data import natural, tff
from fedray.data.population import build_client_data
natural.POOL_MIN_UNITS, tff.UNIT_CLIENTS = 2, 2
pop = build_client_data(load_config(None, ["data.dataset=tff", "data.root={root}",
                                           "data.cache_dir={tmp_path / 'cache'}",
                                           "clients.num_clients=8"]))
print("clients", pop.num_clients)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "clients 8" and "Traceback" not in out.stderr


@pytest.mark.parametrize("batch_bytes", [1, 1 << 30])  # a record batch per client, or one
def test_the_test_partition_streams_every_kept_clients_test_rows(tmp_path, monkeypatch,
                                                                 batch_bytes):
    """``eval.global_test_set=all`` (:meth:`TablePopulation.test_partition`): every kept
    client's LEAF test rows in client order, whatever the record batches; any slice of the
    streamed rows equals the same slice of their concatenation, as does what every
    ``evaluate`` loop computes from it, while the in-memory sample stays a seeded draw."""
    import torch

    import fedray.data.population as population
    from fedray.data.population import Rows, global_test_set
    from fedray.models.training import evaluate

    monkeypatch.setattr(natural, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(population, "GLOBAL_TEST_MAX", 4)
    users = {f"f{i:04d}_00": (int(n), int(t)) for i, (n, t) in enumerate(
        np.random.default_rng(3).integers(0, 6, (9, 2)) + [4, 0])}
    write_leaf(tmp_path / "leaf", users)
    pop = build_client_data(leaf_cfg(tmp_path / "leaf", tmp_path, "clients.num_clients=7"))
    parts = [pop.client_arrays(c, 0, "test") for c in range(7)]
    want_x, want_y = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
    x, y = pop.test_partition()
    assert isinstance(x, Rows) and len(x) == len(y) == len(want_y) == \
        pop.test_partition_size() == pop.summary()["test_partition_size"] > 4
    assert x.shape == want_x.shape and x.dtype == np.float32 and y.ndim == 1
    n = len(want_y)
    for a in range(-n - 2, n + 3):
        for b in [None, *range(-n - 2, n + 3)]:
            assert np.array_equal(x[a:b], want_x[a:b]) and np.array_equal(y[a:b], want_y[a:b])
    assert np.array_equal(np.asarray(x), want_x) and np.array_equal(y[::2], want_y[::2])
    assert np.array_equal(x[[3, 0]], want_x[[3, 0]]) and np.array_equal(x[1:4, 0, 2],
                                                                        want_x[1:4, 0, 2])
    assert np.array_equal(np.asarray(y, np.float64), want_y) and int(y[-1]) == want_y[-1]
    with pytest.raises(ValueError, match="copy"):
        np.asarray(x, copy=False)
    assert len(pop.y_test) == 4  # the sample: GLOBAL_TEST_MAX of the same rows
    assert global_test_set(pop, "sample")[1] is pop.y_test
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 62))
    assert evaluate(model, x, y, batch_size=3) == evaluate(model, want_x, want_y, batch_size=3)


def test_an_empty_test_partition_streams_nothing(tmp_path):
    write_leaf(tmp_path / "leaf", {"f0000_00": (5, 0), "f0001_00": (4, 0)})
    pop = build_client_data(leaf_cfg(tmp_path / "leaf", tmp_path, "clients.num_clients=2"))
    x, y = pop.test_partition()
    assert len(x) == 0 and x[0:5].shape == (0, 1, 28, 28) and np.asarray(y).shape == (0,)


def test_next_word_scores_over_the_streamed_partition_equal_the_concatenation(tmp_path,
                                                                             monkeypatch):
    """A next-word task's test partition (TFF StackOverflow, a record batch per 2 clients):
    per-token targets of shape (rows, steps) stream like inputs, and TFF's token scores
    over them equal those over the concatenated clients' test rows."""
    import torch

    from fedray.models.training import evaluate

    monkeypatch.setattr(natural, "BATCH_BYTES", 1)
    monkeypatch.setattr(tff, "UNIT_CLIENTS", 2)  # a record batch per 2 clients
    write_text(tmp_path / "so", "tokens", so_clients(12, seed=4), "stackoverflow")
    pop = build_client_data(cfg_of(tmp_path / "so", tmp_path, "clients.num_clients=8",
                                   "data.vocab_size=6"))
    assert batches(pop) >= 4
    parts = [pop.client_arrays(c, 0, "test") for c in range(8)]
    want_x, want_y = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
    x, y = pop.test_partition()
    assert y.ndim == 2 and y.shape == want_y.shape and np.array_equal(y[3:-2], want_y[3:-2])

    class Tokens(torch.nn.Module):  # per-token logits (N, vocab, steps), as word_lstm's
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(len(pop.info["classes"]) + 4, 5)
            self.out = torch.nn.Linear(5, len(pop.info["classes"]))

        def forward(self, t):
            return self.out(self.emb(t.long())).transpose(1, 2)  # stored as float32

    torch.manual_seed(0)
    model = Tokens()
    got, want = evaluate(model, x, y, batch_size=3), evaluate(model, want_x, want_y,
                                                             batch_size=3)
    assert got == want and got["n"] > 0
