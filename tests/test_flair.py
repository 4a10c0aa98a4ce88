"""FLAIR as pfl-research prepares it (issue #31): an HDF5 file written here in exactly the
layout of pfl-research's ``benchmarks/dataset/flair/prepare_dataset.py`` (``/<partition>/
<user>/images`` uint8 (N, H, W, 3), ``labels_row`` uint16 / ``labels_col`` uint8, the
fine-grained pair in uint16, ``image_ids``, ``/metadata/*label_mapping`` JSON), read back
one client per train user with multi-hot targets, the global test set from the test users;
pfl's averaged precision checked against an independent formulation and scikit-learn;
the multi-label loss through local training and a batched cohort; malformed and hostile
files one error each, before Ray, with nothing in the cache."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import torch
from test_leaf import assert_cache_empty

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data

COARSE = [f"coarse_{i:02d}" for i in range(17)]
FINE = [f"fine_{i:03d}" for i in range(40)]


def write_flair(path, users: dict[str, tuple[str, int]] | None = None, size: int = 12,
                seed: int = 0) -> dict[str, dict]:
    """A FLAIR HDF5 file: ``users`` maps a user id to (partition, images). Returns each
    user's images and label index lists, as written."""
    g = np.random.default_rng(seed)
    users = users or USERS
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = {}
    with h5py.File(path, "w") as h5:
        for user, (part, n) in users.items():
            images = g.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
            coarse = [sorted(g.choice(17, int(g.integers(1, 4)), replace=False).tolist())
                      for _ in range(n)]
            fine = [sorted(g.choice(40, int(g.integers(1, 3)), replace=False).tolist())
                    for _ in range(n)]
            for prefix, labels, dtype in (("labels", coarse, np.uint8),
                                          ("fine_grained_labels", fine, np.uint16)):
                h5[f"/{part}/{user}/{prefix}_row"] = np.asarray(
                    [j for j, ls in enumerate(labels) for _ in ls], np.uint16)
                h5[f"/{part}/{user}/{prefix}_col"] = np.asarray(
                    [c for ls in labels for c in ls], dtype)
            h5[f"/{part}/{user}/image_ids"] = np.asarray([f"{user}-{j}" for j in range(n)],
                                                        dtype="S")
            h5.create_dataset(f"/{part}/{user}/images", data=images)
            out[user] = {"images": images, "labels": coarse, "fine_grained_labels": fine}
        h5["/metadata/label_mapping"] = json.dumps({k: i for i, k in enumerate(COARSE)})
        h5["/metadata/fine_grained_label_mapping"] = json.dumps(
            {k: i for i, k in enumerate(FINE)})
    return out


USERS = {"u07": ("train", 5), "u02": ("train", 3), "u11": ("train", 1), "u05": ("train", 4),
         "u01": ("val", 2), "u03": ("test", 3), "u09": ("test", 4)}


def flair_cfg(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=flair", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=3",
                              "data.min_samples=2", "model.name=flair_resnet18", *extra])


def multi_hot(labels: list[list[int]], width: int) -> np.ndarray:
    y = np.zeros((len(labels), width), np.float32)
    for j, ls in enumerate(labels):
        y[j, ls] = 1
    return y


def test_each_train_user_is_a_client_with_multi_hot_targets(tmp_path):
    data = write_flair(str(tmp_path / "flair" / "flair_federated.hdf5"))
    pop = build_client_data(flair_cfg(tmp_path / "flair", tmp_path))
    assert pop.natural_ids.tolist() == ["u02", "u05", "u07"]  # u11: 1 image < 2
    assert pop.input_shape == (3, 12, 12) and pop.num_classes == 17
    assert pop.info["classes"] == COARSE and pop.info["task"] == "multilabel"
    for c, user in enumerate(pop.natural_ids):
        x, y = pop.client_arrays(c, 1)
        want = np.transpose(data[user]["images"], (0, 3, 1, 2)).astype(np.float32) / 255
        assert x.dtype == np.float32 and np.allclose(x, want, atol=1e-7)
        assert np.array_equal(y, multi_hot(data[user]["labels"], 17))
        assert pop.num_samples(c, "test") == 0  # FLAIR splits users, not their images
    # the global test set: every image of the test users (7 < the cap), none of train's
    test_images = np.concatenate([data[u]["images"] for u in ("u03", "u09")])
    got = np.rint(pop.x_test * 255).astype(np.uint8).transpose(0, 2, 3, 1)
    assert len(got) == 7 and np.array_equal(got, test_images)
    assert np.array_equal(pop.y_test, np.concatenate(
        [multi_hot(data[u]["labels"], 17) for u in ("u03", "u09")]))
    # the 8-bit images stay 8-bit in the cache: a quarter of float32's bytes
    assert pop._parts[1][0].dtype == np.uint8


def test_fine_labels_size_cap_and_resize(tmp_path):
    data = write_flair(str(tmp_path / "f" / "flair.h5"))
    pop = build_client_data(flair_cfg(tmp_path / "f" / "flair.h5", tmp_path,
                                      "data.label_column=fine_grained_labels",
                                      "data.max_client_samples=4", "data.image_size=8"))
    assert pop.num_classes == 40 and pop.input_shape == (3, 8, 8)
    x, y = pop.client_arrays(2, 0)  # u07: 5 images, its first 4 kept
    assert x.shape == (4, 3, 8, 8) and np.array_equal(
        y, multi_hot(data["u07"]["fine_grained_labels"][:4], 40))
    from PIL import Image

    want = np.asarray(Image.fromarray(data["u07"]["images"][0]).resize(
        (8, 8), Image.Resampling.BILINEAR)).transpose(2, 0, 1) / np.float32(255)
    assert np.allclose(x[0], want, atol=1e-7)
    with pytest.raises(ConfigError, match="data.label_column"):
        flair_cfg(tmp_path / "f", tmp_path, "data.label_column=label_col")


def test_the_global_test_set_is_capped_by_bytes(tmp_path, monkeypatch):
    import fedray.data.population as population

    write_flair(str(tmp_path / "f" / "flair.h5"))
    monkeypatch.setattr(population, "GLOBAL_TEST_BYTES", 5 * 4 * 3 * 12 * 12)
    pop = build_client_data(flair_cfg(tmp_path / "f", tmp_path))
    assert len(pop.y_test) == 5  # of 7 test images, drawn with the seed
    again = build_client_data(flair_cfg(tmp_path / "f", tmp_path, "data.cache_dir="
                                        f"{tmp_path / 'other'}"))
    assert np.array_equal(pop.x_test, again.x_test)


def test_the_test_users_are_a_held_out_entry_streamed_whole(tmp_path, monkeypatch):
    """FLAIR's test partition is its test users' images, every one (no per-user cap),
    written once as an entry of their own beside the clients' (``<key>.test``); the
    in-memory sample is a seeded draw of its rows; ``test_partition`` streams all of them
    and scores as their concatenation does; an entry whose held-out rows are gone is
    rebuilt, and a pickle carries no mapping of them."""
    import pickle

    import fedray.data.population as population
    from fedray.core.seeding import rng
    from fedray.data.population import global_test_set
    from fedray.models.training import evaluate

    data = write_flair(str(tmp_path / "f" / "flair.h5"))
    monkeypatch.setattr(population, "GLOBAL_TEST_BYTES", 5 * 4 * 3 * 12 * 12)
    cfg = flair_cfg(tmp_path / "f", tmp_path, "data.max_client_samples=2")
    pop, pop_seed = build_client_data(cfg), cfg.seed
    name = pop.info["held_out_entry"]
    assert name.endswith(".test") and os.path.isfile(os.path.join(os.path.dirname(pop.path),
                                                                  name + ".arrow"))
    assert pop.info["held_out_rows"] == 7 and pop.test_partition_size() == 7
    x, y = global_test_set(pop, "all")
    want_x = np.concatenate([data[u]["images"] for u in ("u03", "u09")])
    want_y = np.concatenate([multi_hot(data[u]["labels"], 17) for u in ("u03", "u09")])
    assert len(x) == 7 and x.dtype == np.float32 and np.array_equal(  # 4 > the cap of 2
        np.rint(np.asarray(x) * 255).astype(np.uint8).transpose(0, 2, 3, 1), want_x)
    assert np.array_equal(np.asarray(y), want_y) and np.array_equal(x[2:6], np.asarray(x)[2:6])
    # the sample: 5 of those 7 rows, the draw the global test set always was
    pick = np.sort(rng(pop_seed, -1, -1, "population-global-test").choice(7, 5, replace=False))
    assert np.array_equal(pop.x_test, np.asarray(x)[pick])
    assert np.array_equal(pop.y_test, want_y[pick])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 12 * 12, 17))
    assert evaluate(model, x, y) == evaluate(model, np.asarray(x), want_y)
    assert pickle.loads(pickle.dumps(pop))._held is None and pop._held is not None
    # one held-out entry for every client count, seed and cap of the same file and labels
    held_paths = population.entry_paths(os.path.dirname(pop.path), name)
    stamp = os.stat(held_paths[0]).st_mtime_ns
    other = build_client_data(flair_cfg(tmp_path / "f", tmp_path, "clients.num_clients=2",
                                        "seed=5"))
    assert other.path != pop.path and other.info["held_out_entry"] == name
    assert os.stat(held_paths[0]).st_mtime_ns == stamp  # kept, not written again
    fine = build_client_data(flair_cfg(tmp_path / "f", tmp_path,
                                       "data.label_column=fine_grained_labels"))
    assert fine.info["held_out_entry"] != name
    # held-out rows gone, damaged or another entry's: the entry is rebuilt
    for damage in ("remove", "truncate", "other"):
        if damage == "remove":
            for path in held_paths:
                os.remove(path)
        elif damage == "truncate":
            with open(held_paths[0], "r+b") as fh:
                fh.truncate(100)
        else:
            for mine, theirs in zip(held_paths, population.entry_paths(
                    os.path.dirname(pop.path), fine.info["held_out_entry"]), strict=True):
                os.replace(mine, mine + ".keep")
                os.symlink(theirs, mine)  # resolves inside the cache, but 40 fine labels
        again = build_client_data(cfg)
        assert again.info["held_out_entry"] == name and np.array_equal(
            np.asarray(again.test_partition()[1]), want_y)
        assert np.array_equal(again.x_test, pop.x_test)


def _bad_file(tmp_path, plant: str) -> str:
    path = str(tmp_path / "bad" / "flair.hdf5")
    write_flair(path)
    other = str(tmp_path / "other.h5")
    with h5py.File(other, "w") as f:
        f.create_dataset("images", data=np.zeros((2, 12, 12, 3), np.uint8))
    with h5py.File(path, "a") as f:
        user = f["train/u05"]
        if plant == "no_metadata":
            del f["metadata"]
        elif plant == "mapping":
            del f["metadata/label_mapping"]
            f["metadata/label_mapping"] = json.dumps({"a": 0, "b": 2})
        elif plant == "col":
            user["labels_col"][0] = 17
        elif plant == "row":
            user["labels_row"][0] = 9
        elif plant == "float_images":
            del user["images"]
            user.create_dataset("images", data=np.zeros((4, 12, 12, 3), np.float32))
        elif plant == "size":
            del user["images"]
            user.create_dataset("images", data=np.zeros((4, 10, 10, 3), np.uint8))
        elif plant == "no_images":
            del user["images"]
        elif plant == "external_link":
            del user["images"]
            user["images"] = h5py.ExternalLink(other, "/images")
        elif plant == "soft_user":
            del f["train/u05"]
            f["train/u05"] = h5py.SoftLink("/train/u07")
        elif plant == "virtual":
            del user["images"]
            layout = h5py.VirtualLayout(shape=(2, 12, 12, 3), dtype="u1")
            layout[:] = h5py.VirtualSource(other, "images", shape=(2, 12, 12, 3))
            user.create_virtual_dataset("images", layout)
        elif plant == "huge":
            del user["images"]
            user.create_dataset("images", shape=(10 ** 7, 256, 256, 3), dtype="u1",
                                chunks=(1, 256, 256, 3))
        elif plant == "no_test":
            del f["test"]
        elif plant == "deep_json":
            del f["metadata/label_mapping"]
            f["metadata/label_mapping"] = "[" * 100_000 + "]" * 100_000
        elif plant == "pairs":
            del user["labels_row"], user["labels_col"]
            user["labels_row"] = np.zeros(4 * 17 + 1, np.uint16)
            user["labels_col"] = np.zeros(4 * 17 + 1, np.uint8)
    return path


@pytest.mark.parametrize("plant, where, rule", [
    ("no_metadata", "/metadata", "a group 'metadata'"),
    ("mapping", "/metadata/label_mapping", "index 0..L-1"),
    ("col", "/train/u05", "labels_col in 0..16"),
    ("row", "/train/u05", "labels_row in 0..3"),
    ("float_images", "/train/u05", "images uint8 (N, H, W, 3)"),
    ("size", "/train/u05", "one size"),
    ("no_images", "/train/u05", "a dataset 'images'"),
    ("external_link", "/train/u05", "stored in the file"),
    ("soft_user", "/train/u05", "stored in the file"),
    ("virtual", "/train/u05", "not a virtual or an external dataset"),
    ("huge", "/train/u05", "at most 1 GiB"),
    ("no_test", "/test", "FLAIR's test partition"),
    ("deep_json", "/metadata/label_mapping", "index 0..L-1"),
    ("pairs", "/train/u05", "at most images x labels"),
])
def test_malformed_and_hostile_files_are_one_error(tmp_path, plant, where, rule):
    path = _bad_file(tmp_path, plant)
    with pytest.raises(ConfigError) as e:
        build_client_data(flair_cfg(path, tmp_path))
    msg = str(e.value)
    assert rule in msg and where in msg and "flair.hdf5" in msg and "\n" not in msg, msg
    assert_cache_empty(tmp_path)


def test_the_file_must_be_inside_the_root_and_readable(tmp_path):
    write_flair(str(tmp_path / "elsewhere" / "flair.hdf5"))
    (tmp_path / "root").mkdir()
    os.symlink(tmp_path / "elsewhere" / "flair.hdf5", tmp_path / "root" / "flair.hdf5")
    with pytest.raises(ConfigError, match="a regular file inside"):
        flair_cfg(tmp_path / "root", tmp_path)
    (tmp_path / "trunc").mkdir()
    (tmp_path / "trunc" / "flair.hdf5").write_bytes(
        (tmp_path / "elsewhere" / "flair.hdf5").read_bytes()[:700])
    with pytest.raises(ConfigError, match="a readable HDF5 file"):
        build_client_data(flair_cfg(tmp_path / "trunc", tmp_path))
    assert_cache_empty(tmp_path)


def test_methods_without_multi_label_training_are_refused(tmp_path):
    write_flair(str(tmp_path / "f" / "flair.hdf5"))
    for method in ("flite", "drod"):
        with pytest.raises(ConfigError, match="multilabel") as e:
            flair_cfg(tmp_path / "f", tmp_path, f"algorithm.name={method}")
        assert "data.dataset" in str(e.value)
    with pytest.raises(ConfigError, match="model-poisoning"):
        flair_cfg(tmp_path / "f", tmp_path, "adversary.attack=label_flip",
                  "adversary.fraction=0.3")
    for method in ("fedavg", "fedprox", "orders", "fedadam"):
        flair_cfg(tmp_path / "f", tmp_path, f"algorithm.name={method}")


def _reference_ap(y: np.ndarray, s: np.ndarray, thresholds: int = 200) -> np.ndarray:
    """pfl-research's AveragedPrecision written as its thresholds read: predicted positive
    when s > t_i, t = (−1e-7, 1/(T−1), ..., (T−2)/(T−1), 1 + 1e-7); per label."""
    t = np.r_[-1e-7, np.arange(1, thresholds - 1) / (thresholds - 1), 1 + 1e-7]
    aps = []
    for j in range(y.shape[1]):
        prec, rec = [], []
        for ti in t:
            pred = s[:, j] > ti
            tp = float((pred & (y[:, j] == 1)).sum())
            fp = float((pred & (y[:, j] == 0)).sum())
            fn = float((~pred & (y[:, j] == 1)).sum())
            prec.append(tp / (tp + fp) if tp + fp else 0.0)
            rec.append(tp / (tp + fn) if tp + fn else 0.0)
        aps.append(-np.sum(np.diff(rec) * np.array(prec)[:-1]))
    return np.array(aps)


def test_averaged_precision_is_pfls():
    from sklearn.metrics import average_precision_score

    from fedray.models.training import averaged_precision

    g = np.random.default_rng(3)
    y = (g.random((60, 5)) < 0.3).astype(np.float32)
    y[:, 4] = 0  # a label without positives scores 0 in pfl's macro mean
    s = g.random((60, 5)).astype(np.float32)
    ref = _reference_ap(y, s)
    assert averaged_precision(y, s, True) == pytest.approx(ref.mean(), abs=1e-12)
    assert averaged_precision(y, s, False) == pytest.approx(
        _reference_ap(y.reshape(-1, 1), s.reshape(-1, 1))[0], abs=1e-12)
    # with every score in its own bucket the curve is scikit-learn's exact one
    yy = np.array([[1], [0], [1], [0], [0], [1]], np.float32)
    ss = np.array([[0.91], [0.72], [0.55], [0.33], [0.12], [0.05]], np.float32)
    assert averaged_precision(yy, ss, True) == pytest.approx(
        average_precision_score(yy[:, 0], ss[:, 0]), abs=1e-12)
    assert averaged_precision(yy, np.where(yy > 0, 0.9, 0.1), False) == pytest.approx(1.0)
    # over the labels that have a positive only: label 4's 0 left out of the mean
    present = averaged_precision(y, s, True, present_only=True)
    assert present == pytest.approx(ref[:4].mean(), abs=1e-12)
    assert present > averaged_precision(y, s, True)
    assert np.isnan(averaged_precision(np.zeros_like(y), s, True, present_only=True))


def test_evaluate_and_train_take_multi_hot_targets():
    from fedray.models import build_model
    from fedray.models.training import evaluate, task_loss, train_local

    g = np.random.default_rng(0)
    x = g.random((10, 3, 8, 8)).astype(np.float32)
    y = (g.random((10, 17)) < 0.2).astype(np.float32)
    model = build_model("flair_resnet18", (3, 8, 8), 17)
    assert sum(p.numel() for p in model.parameters()) == 11_185_233
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    out = model(torch.from_numpy(x))
    assert torch.equal(task_loss(out, torch.from_numpy(y)),
                       torch.nn.BCEWithLogitsLoss()(out, torch.from_numpy(y)))
    scores = evaluate(model, x, y)
    p = torch.sigmoid(out).detach().numpy()
    assert scores["accuracy"] == pytest.approx(float((np.round(p) == y).mean()))
    assert scores["loss"] == pytest.approx(float(torch.nn.BCEWithLogitsLoss()(out.detach(),
        torch.from_numpy(y))), rel=1e-5)
    assert {"macro_ap", "macro_ap_present", "micro_ap"} <= set(scores) and scores["n"] == 10
    assert scores["macro_ap_present"] >= scores["macro_ap"]
    metrics, _ = train_local(model, x, y, epochs=1, batch_size=4, lr=0.01, seed=0, round=0,
                             client=0)
    assert metrics["steps"] == 3 and np.isfinite(metrics["train_loss"])


def test_a_cohort_trains_multi_hot_targets_as_one_client_at_a_time():
    """Every client's parameters after a batched cohort equal its own sequential run
    within 1e-5 (unequal sizes, one smaller than a batch)."""
    from fedray.models import build_model
    from fedray.models.cohort import train_cohort
    from fedray.models.training import get_state, set_state, train_local

    g = np.random.default_rng(1)
    data = [(g.random((n, 12)).astype(np.float32),
             (g.random((n, 5)) < 0.3).astype(np.float32)) for n in (7, 3, 10)]
    torch.manual_seed(0)
    model = build_model("mlp", (12,), 5, hidden=(8,))
    start = get_state(model)
    kw = dict(epochs=2, batch_size=4, lr=0.1, momentum=0.9, seed=5, round=2)
    trained = train_cohort(model, data, [0, 1, 2], **kw)
    for c, (x, y) in enumerate(data):
        set_state(model, start)
        train_local(model, x, y, client=c, **kw)
        for name, p in model.named_parameters():
            assert np.allclose(trained[c].params[name], p.detach().numpy(), rtol=1e-5,
                               atol=1e-6), name


@pytest.mark.ray
def test_a_flair_run_reports_averaged_precision(ray_session, tmp_path):
    import pyarrow.parquet as pq

    from fedray.runtime import run_experiment

    write_flair(str(tmp_path / "f" / "flair.hdf5"))
    cfg = flair_cfg(tmp_path / "f", tmp_path, "rounds=2", "model.name=mlp",
                    "model.hidden=[16]", "clients.per_round=2", "local.batch_size=2",
                    "runtime.vectorize=on", "eval.global_test_set=all")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    last = rounds[-1]
    # every image of the test users scored, streamed from the held-out entry
    assert last["global_n"] == 7 and summary["final_global_n"] == 7
    assert summary["global_test_set"] == "all"
    assert 0 <= last["global_macro_ap"] <= 1 and 0 <= last["global_micro_ap"] <= 1
    assert 0 <= summary["final_global_accuracy"] <= 1
    assert summary["final_global_macro_ap"] == pytest.approx(last["global_macro_ap"])
    assert last["global_macro_ap_present"] >= last["global_macro_ap"]
    assert summary["final_global_macro_ap_present"] == pytest.approx(
        last["global_macro_ap_present"])
    from fedray.front.report import _chance

    assert _chance({"data": {"dataset": "flair"}}, {"task": "multilabel",
                                                     "num_classes": 17}) is None


def test_work_units_are_cut_by_users_and_bytes(monkeypatch):
    import fedray.data.flair as flair

    monkeypatch.setattr(flair, "UNIT_USERS", 3)
    monkeypatch.setattr(flair, "UNIT_BYTES", 100)
    users = [f"u{i}" for i in range(7)]
    assert flair._units(users, [10, 10, 10, 10, 95, 500, 1]) == [
        ["u0", "u1", "u2"], ["u3"], ["u4"], ["u5"], ["u6"]]


def test_the_global_test_set_stays_8_bit_until_scored(tmp_path):
    """The index keeps the test images as stored (uint8); ``x_test`` is them scaled to
    float32 on first use, the values the index held before (as_inputs at build); a pickle
    carries the 8-bit rows only; an index written the old way (float32) still loads."""
    import pickle

    from fedray.data.population import TablePopulation, as_inputs

    write_flair(str(tmp_path / "flair" / "flair_federated.hdf5"))
    pop = build_client_data(flair_cfg(tmp_path / "flair", tmp_path))
    assert pop.x_test_rows.dtype == np.uint8 and pop._x_test is None
    x = pop.x_test
    assert x.dtype == np.float32 and x.shape == (7, 3, 12, 12) and pop.x_test is x
    assert np.array_equal(x, pop.x_test_rows.astype(np.float32) * np.float32(1 / 255))
    sent = pickle.dumps(pop)
    assert len(sent) < pop.x_test_rows.nbytes + x.nbytes  # no float32 copy travels
    back = pickle.loads(sent)
    assert back._x_test is None and np.array_equal(back.x_test, x)
    index = pop.path[:-len(".arrow")] + ".index.npz"
    with np.load(index, allow_pickle=False) as z:
        old = {k: z[k] for k in z.files}
    old["x_test"] = as_inputs(old["x_test"])  # what the index held before 2026-12-06
    np.savez(index, **old)
    again = TablePopulation._from_cache(pop.path, index)
    assert again.x_test_rows.dtype == np.float32 and np.array_equal(again.x_test, x)
