"""LEAF's JSON format (issue #31): a FEMNIST-shaped LEAF dataset written here exactly as
LEAF's preprocessing writes it (train/ and test/ folders of JSON shards), read back one
client per user with LEAF's own split — the same user behind a client id in both splits —
from the population cache on a second build; every malformed shard one error naming the
file and the user before Ray; and a run through Ray on it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data


def write_leaf(root, users: dict[str, tuple[int, int]], seed: int = 0, shards: int = 2,
               width: int = 784) -> dict:
    """LEAF FEMNIST-format shards under root/train and root/test: each user with its
    (train, test) sample counts, x in [0, 1], y in 0..61; users dealt to ``shards`` files per
    split. Returns {user: {"train": (x, y), "test": (x, y)}}."""
    g = np.random.default_rng(seed)
    data = {u: {s: (g.random((n, width)).round(4), g.integers(0, 62, n))
                for s, n in zip(("train", "test"), sizes, strict=True)}
            for u, sizes in users.items()}
    for split in ("train", "test"):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        names = list(users)
        for k in range(shards):
            part = names[k::shards]
            doc = {"users": part, "num_samples": [len(data[u][split][1]) for u in part],
                   "user_data": {u: {"x": data[u][split][0].tolist(),
                                     "y": data[u][split][1].tolist()} for u in part}}
            with open(os.path.join(root, split, f"all_data_{k}_niid_0_keep_0_{split}_9.json"),
                      "w") as f:
                json.dump(doc, f)
    return data


USERS = {"f0003_12": (6, 2), "f0001_40": (5, 2), "f0000_14": (8, 3), "f0002_07": (1, 1),
         "f0004_33": (7, 2)}


def leaf_cfg(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=leaf", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=3",
                              *extra])


def test_each_client_is_one_leaf_user_with_leafs_own_split(tmp_path):
    root = tmp_path / "femnist"
    data = write_leaf(root, USERS)
    cfg = leaf_cfg(root, tmp_path)
    pop = build_client_data(cfg)
    # f0002_07 has 2 < data.min_samples = 4 samples: skipped; the rest in sorted id order
    assert pop.natural_ids.tolist() == ["f0000_14", "f0001_40", "f0003_12"]
    assert pop.input_shape == (1, 28, 28)
    assert pop.num_classes == 1 + max(int(v[s][1].max()) for v in data.values() for s in v)
    for c, user in enumerate(pop.natural_ids):
        for split in ("train", "test"):
            x, y = pop.client_arrays(c, 1, split)
            want_x, want_y = data[user][split]
            assert x.shape == (len(want_y), 1, 28, 28)
            assert np.array_equal(x.reshape(len(x), -1), want_x.astype(np.float32))
            assert np.array_equal(y, want_y)
    assert pop.summary()["ids_too_small"] == 1 and len(pop.y_test) == 7
    stamp = os.stat(pop.path).st_mtime_ns  # the second build maps the cache, no JSON read
    again = build_client_data(cfg)
    assert again.path == pop.path and os.stat(pop.path).st_mtime_ns == stamp
    assert np.array_equal(again.client_arrays(2, 1)[0], pop.client_arrays(2, 1)[0])


def test_a_flat_vector_stays_flat(tmp_path):
    write_leaf(tmp_path / "flat", USERS, width=60)
    pop = build_client_data(leaf_cfg(tmp_path / "flat", tmp_path))
    assert pop.input_shape == (60,) and pop.client_arrays(0, 1)[0].shape == (8, 60)


def _edit(root, split, k, change):
    path = os.path.join(root, split, f"all_data_{k}_niid_0_keep_0_{split}_9.json")
    with open(path) as f:
        doc = json.load(f)
    text = change(doc)
    with open(path, "w") as f:
        f.write(text if isinstance(text, str) else json.dumps(doc))
    return path


@pytest.mark.parametrize("split, change, rule", [
    ("train", lambda d: d["num_samples"].__setitem__(0, 99), "num_samples = the length"),
    ("test", lambda d: d["user_data"][d["users"][0]]["y"].pop(), "x and y lists of one "
                                                                 "length"),
    ("train", lambda d: json.dumps(d)[:500], "does not parse"),
    ("train", lambda d: d["user_data"][d["users"][0]].update(
        x=["hello", "world!"] + ["a"] * (len(d["user_data"][d["users"][0]]["y"]) - 2),
        y=["x"] * len(d["user_data"][d["users"][0]]["y"])), "Shakespeare's text"),
    ("train", lambda d: d["user_data"][d["users"][0]].__setitem__(
        "x", ["hello world"] * len(d["user_data"][d["users"][0]]["y"])), "CelebA's images"),
    ("train", lambda d: d["user_data"][d["users"][0]].__setitem__(
        "x", [["id", "date", "q", "u"]] * len(d["user_data"][d["users"][0]]["y"])),
     "Sent140's tweet records"),
    ("test", lambda d: d["user_data"][d["users"][0]]["y"].__setitem__(0, -1),
     "integer labels in 0..1048575"),
    ("train", lambda d: d["user_data"][d["users"][0]]["y"].__setitem__(0, 1e15),
     "integer labels in 0..1048575"),
    ("train", lambda d: d["user_data"][d["users"][0]].__setitem__(
        "x", [[]] * len(d["user_data"][d["users"][0]]["y"])), "non-empty lists"),
])
def test_a_malformed_shard_is_one_error_naming_file_and_user(tmp_path, split, change, rule):
    root = tmp_path / "bad"
    write_leaf(root, USERS)
    path = _edit(root, split, 0, change)
    with pytest.raises(ConfigError) as e:
        build_client_data(leaf_cfg(root, tmp_path))
    msg = str(e.value)
    assert rule in msg and path in msg and "\n" not in msg
    if "parse" not in rule:
        assert "'user f0003_12'" in msg  # the first user of shard 0
    assert_cache_empty(tmp_path)


def assert_cache_empty(tmp_path) -> None:
    """Nothing, not even half, written to the population cache under tmp_path/cache."""
    cache = tmp_path / "cache" / "populations"
    assert not cache.exists() or not os.listdir(cache)


def test_layout_and_links_are_checked_before_ray(tmp_path):
    root = tmp_path / "leaf"
    write_leaf(root, USERS)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    os.symlink(outside, root / "train" / "planted.json")
    with pytest.raises(ConfigError, match="a regular file inside"):
        leaf_cfg(root, tmp_path)
    os.remove(root / "train" / "planted.json")
    os.rename(root / "test", root / "held_out")
    with pytest.raises(ConfigError, match="test/ folder"):
        leaf_cfg(root, tmp_path)
    with pytest.raises(ConfigError, match="at most the 4 users"):
        os.rename(root / "held_out", root / "test")
        build_client_data(leaf_cfg(root, tmp_path, "clients.num_clients=5"))


def test_the_leaf_femnist_cnn_has_leafs_parameter_count():
    """LEAF's layers (models/femnist/cnn.py): 5x5x1x32 + 32, 5x5x32x64 + 64,
    7x7x64x2048 + 2048, 2048x62 + 62."""
    from fedray.models import build_model

    model = build_model("leaf_cnn", (1, 28, 28), 62)
    assert sum(p.numel() for p in model.parameters()) == 6_603_710 == (
        5 * 5 * 32 + 32 + 5 * 5 * 32 * 64 + 64 + 7 * 7 * 64 * 2048 + 2048 + 2048 * 62 + 62)
    import torch

    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
    flat = build_model("leaf_cnn", (784,), 62)  # flat rows are unflattened
    assert flat(torch.zeros(2, 784)).shape == (2, 62)


def test_the_benchmarks_femnist_workload_is_what_fedray_reads(tmp_path):
    """``benchmarks/femnist_workload.py`` (what Flower and pfl-research train in
    ``sim_overhead.py --workload femnist``) hands every client the rows fedray's LEAF reader
    hands it, in the same client order, and its plain CNN is ``leaf_cnn`` layer for layer."""
    import sys

    import torch

    from fedray.models import build_model

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
    import femnist_workload as fw

    root = fw.write(str(tmp_path / "femnist"), clients=5, seed=3)
    rows = fw.read_train(root)
    assert len(rows) == 5 and all(100 <= len(y) <= 300 for _, y in rows)
    cfg = load_config(None, fw.fedray_overrides(root, 5, 1, 3, str(tmp_path / "cache")))
    pop = build_client_data(cfg)
    assert pop.input_shape == (1, 28, 28) and pop.num_classes == fw.CLASSES
    for c, (x, y) in enumerate(rows):
        fx, fy = pop.client_arrays(c, 1, "train")
        assert np.array_equal(np.asarray(fx).reshape(x.shape), x) and np.array_equal(fy, y)
    ours, theirs = build_model("leaf_cnn", (1, 28, 28), fw.CLASSES), fw.leaf_cnn()
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in theirs.named_parameters()]
    theirs.load_state_dict(ours.state_dict())
    probe = torch.from_numpy(rows[0][0][:3])
    assert torch.equal(ours(probe), theirs(probe))
    assert sum(p.numel() for p in theirs.parameters()) == fw.EXPECTED_PARAMS


@pytest.mark.ray
def test_fedavg_runs_on_a_leaf_dataset(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    write_leaf(tmp_path / "femnist", USERS)
    cfg = leaf_cfg(tmp_path / "femnist", tmp_path, "model.name=leaf_cnn", "model.dense=64",
                   "rounds=2",
                   "local.batch_size=4",
                   "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2 and summary["dataset"] == "leaf"
    assert 0 <= summary["final_global_accuracy"] <= 1


def write_shakespeare(root, roles: dict[str, tuple[int, int]], seed: int = 0) -> dict:
    """LEAF Shakespeare-format shards: per speaking role 80-character strings and their next
    characters (drawn from a text with a letter outside LEAF's 80, '~')."""
    g = np.random.default_rng(seed)
    alphabet = "ABCdef ghi,.'\n~"
    data = {}
    for split in ("train", "test"):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        doc = {"users": list(roles), "num_samples": [], "user_data": {}}
        for role, sizes in roles.items():
            n = sizes[0] if split == "train" else sizes[1]
            text = "".join(g.choice(list(alphabet), n + 80))
            x = [text[i:i + 80] for i in range(n)]
            y = [text[i + 80] for i in range(n)]
            doc["num_samples"].append(n)
            doc["user_data"][role] = {"x": x, "y": y}
            data.setdefault(role, {})[split] = (x, y)
        with open(os.path.join(root, split, f"shakespeare_{split}.json"), "w") as f:
            json.dump(doc, f)
    return data


def test_shakespeare_is_read_as_leafs_letter_indices(tmp_path):
    from fedray.data.leaf import LETTERS

    roles = {"THE_TEMPEST_PROSPERO": (9, 3), "HAMLET_HAMLET": (6, 2), "LEAR_FOOL": (7, 2)}
    data = write_shakespeare(tmp_path / "shakespeare", roles)
    pop = build_client_data(leaf_cfg(tmp_path / "shakespeare", tmp_path))
    assert pop.input_shape == (80,) and pop.num_classes == 81  # '~' is outside the 80
    assert pop.natural_ids.tolist() == sorted(roles)
    for c, role in enumerate(pop.natural_ids):
        x, y = pop.client_arrays(c, 1, "test")
        want_x, want_y = data[role]["test"]
        assert x.tolist() == [[float(LETTERS.find(ch) if ch in LETTERS else 80) for ch in s]
                              for s in want_x]
        assert y.tolist() == [LETTERS.find(ch) if ch in LETTERS else 80 for ch in want_y]


def test_the_leaf_shakespeare_lstm_is_leafs_with_torchs_second_bias():
    """LEAF's stacked_lstm (TF BasicLSTMCell: one bias per gate): 80x8 embedding,
    4*256*(8+256) + 4*256, 4*256*(256+256) + 4*256, 256*80 + 80 = 817,872; PyTorch's LSTM
    adds a second bias vector per layer (2 x 1,024)."""
    import torch

    from fedray.models import build_model

    model = build_model("char_lstm", (80,), 80)
    leaf = 80 * 8 + (4 * 256 * 264 + 1024) + (4 * 256 * 512 + 1024) + (256 * 80 + 80)
    assert leaf == 817_872
    assert sum(p.numel() for p in model.parameters()) == leaf + 2 * 1024
    assert model(torch.randint(0, 80, (3, 80)).float()).shape == (3, 80)


@pytest.mark.ray
def test_fedavg_trains_the_char_lstm_on_leaf_shakespeare(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    write_shakespeare(tmp_path / "sh", {"A_ROLE": (12, 3), "B_ROLE": (10, 3), "C_ROLE": (9, 2)})
    cfg = leaf_cfg(tmp_path / "sh", tmp_path, "model.name=char_lstm", "model.hidden=16",
                   "model.layers=1", "rounds=1", "local.batch_size=4",
                   "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 1 and 0 <= summary["final_global_accuracy"] <= 1


@pytest.mark.parametrize("key,value", [("data.partition", "dirichlet"), ("data.alpha", "0.1"),
                                       ("data.feature_skew", "0.5"),
                                       ("data.drift_round", "1")])
def test_a_natural_split_refuses_the_label_partition_knobs(tmp_path, key, value):
    """One client per LEAF user: a label partition, skew or drift would change nothing, so
    the config names the key instead of running another experiment than asked for."""
    root = tmp_path / "leaf"
    write_leaf(root, {"u0": (6, 2), "u1": (5, 2)})
    with pytest.raises(ConfigError) as e:
        leaf_cfg(root, tmp_path, f"{key}={value}")
    assert e.value.path == key and "one client per natural id" in str(e.value), str(e.value)
    assert leaf_cfg(root, tmp_path).data.partition == "iid"
