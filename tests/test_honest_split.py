"""No test sample in training (issue #29, deliverable 1).

The FLITE and DP studies once pretrained their base on the seed-0 split while each run's test
split followed its seed, so seeds 1 and 2 were scored partly on the base's training images.
Here: the datasets number their samples, a base records the ids it was trained on, a run
refuses a base that saw its test samples (before Ray), and the studies' own configs are
checked seed by seed against the ids their runs really train and test on.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from fedray.core import registry
from fedray.core.config import ConfigError, load_config
from fedray.data import load_dataset
from fedray.models.pretrain import base_samples, check_base_split, evaluated_ids, pretrain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["pretrain.epochs=1", "pretrain.warmup_epochs=0"]


def study(name: str):
    spec = importlib.util.spec_from_file_location(f"study_{name}",
                                                  os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def flite_study():
    return study("flite_study")


@pytest.fixture(scope="module")
def dp_study():
    return study("dp_study")


@pytest.fixture(scope="module")
def study_base(tmp_path_factory, flite_study, dp_study):
    """The studies' base recipe (one epoch): both studies pretrain the same way."""
    assert (dp_study.SPLIT, dp_study.MODEL, dp_study.PRETRAIN) == \
        (flite_study.SPLIT, flite_study.MODEL, flite_study.PRETRAIN)
    out = str(tmp_path_factory.mktemp("base") / "base")
    pretrain(load_config(None, flite_study.base_overrides("orthogonal") + QUICK), out,
             progress=False)
    return out


def client_data(cfg):
    cls = registry.method(cfg.algorithm["name"])
    return cls, cls.build_data(cfg)


def trained_ids(data) -> np.ndarray:
    return np.asarray(data.train_ids)[np.concatenate(data.train_idx)]


def test_digits_ids_name_the_samples_each_row_holds():
    from sklearn.datasets import load_digits

    raw = load_digits().data.astype(np.float32).reshape(-1, 1, 8, 8) / 16.0
    for seed in (0, 3):
        d = load_dataset(load_config(None, [f"seed={seed}"]).data, seed)
        assert np.intersect1d(d.train_ids, d.test_ids).size == 0
        assert np.array_equal(np.sort(np.concatenate([d.train_ids, d.test_ids])),
                              np.arange(len(raw)))
        mean, std = float(raw[d.train_ids].mean()), float(raw[d.train_ids].std())
        assert np.allclose(d.x_test, (raw[d.test_ids] - mean) / std, atol=1e-5)
        assert np.allclose(d.x_train, (raw[d.train_ids] - mean) / std, atol=1e-5)


def test_split_seed_fixes_the_split_and_leaves_the_partition_to_the_seed():
    a = load_config(None, ["seed=1", "data.split_seed=0", "clients.num_clients=8"])
    b = load_config(None, ["seed=0", "clients.num_clients=8"])
    da, db = load_dataset(a.data, a.seed), load_dataset(b.data, b.seed)
    assert np.array_equal(da.test_ids, db.test_ids) and np.array_equal(da.x_test, db.x_test)
    fa, fb = client_data(a)[1], client_data(b)[1]
    assert not all(np.array_equal(x, y) for x, y in zip(fa.train_idx, fb.train_idx, strict=True))
    c = load_config(None, ["seed=1"])
    assert not np.array_equal(load_dataset(c.data, c.seed).test_ids, db.test_ids)


def study_configs(flite_study, dp_study, base: str, seed: int) -> dict[str, list[str]]:
    flite = {m: flite_study._cache_path(None, p, m, seed, 8, "orthogonal", 10)[1]
             + [f"algorithm.base={base}"]
             for p, m in [("dir0.5", "flite_d64"), ("iid", "fedavg_fp32"),
                          ("dir0.1", "fedavg_int4w")]}
    dp = {f"dp-{m}-{e:g}": dp_study.run_overrides(m, e, seed, base)
          for m, e in [("fedavg", 1.0), ("flite", float("inf"))]}
    return {f"flite_study/{k}": v for k, v in flite.items()} | \
        {f"dp_study/{k}": v for k, v in dp.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_studies_never_train_on_a_sample_they_test_on(flite_study, dp_study, study_base,
                                                          seed):
    """Every pretraining and client-training id of the studies' runs is outside the ids the
    same run is scored on, for each seed; and the run's own check passes."""
    pre = base_samples(study_base)
    assert pre is not None and len(pre) > 0
    for name, overrides in study_configs(flite_study, dp_study, study_base, seed).items():
        cfg = load_config(None, overrides)
        cls, data = client_data(cfg)
        tested = evaluated_ids(cfg, data)
        assert np.array_equal(np.sort(tested), np.sort(data.test_ids)), name  # global test set
        assert np.intersect1d(pre, tested).size == 0, name
        assert np.intersect1d(trained_ids(data), tested).size == 0, name
        cls.check_data(cfg, data)


def test_the_old_recipe_leaks_and_is_refused(flite_study, study_base):
    """Without data.split_seed the seed-1 run tests on samples the seed-0 base trained on:
    the check finds them and refuses, naming the base and the way out."""
    overrides = [o for o in flite_study._cache_path(None, "iid", "flite_d64", 1, 8,
                                                    "orthogonal", 10)[1]
                 if not o.startswith("data.split_seed")] + [f"algorithm.base={study_base}"]
    cfg = load_config(None, overrides)
    cls, data = client_data(cfg)
    leaked = np.intersect1d(base_samples(study_base), evaluated_ids(cfg, data))
    assert leaked.size > 0
    with pytest.raises(ConfigError, match="algorithm.base") as e:
        cls.check_data(cfg, data)
    assert f"{leaked.size} of its" in str(e.value) and "data.split_seed=0" in str(e.value)


def test_local_test_splits_are_scored_on_unseen_samples_only(study_base, flite_study):
    """The clients' shards come from the train split the base was partly pretrained on: the
    method's data cuts every local test split to samples the base never saw (local training
    splits stay as drawn), so a run scoring them passes; the same data built without the cut
    (a prebuilt FederatedData) is refused."""
    from fedray.data.population import build_client_data

    common = flite_study.SPLIT + flite_study.MODEL + ["algorithm.name=fedavg", "seed=0",
                                                      "clients.num_clients=8",
                                                      f"algorithm.base={study_base}"]
    cfg = load_config(None, common + ["eval.clients=all"])
    cls, data = client_data(cfg)
    raw = build_client_data(cfg)
    seen = base_samples(study_base)
    ids = np.asarray(data.train_ids)
    for cut, full, tr, tr_raw in zip(data.test_idx, raw.test_idx, data.train_idx,
                                     raw.train_idx, strict=True):
        assert np.array_equal(tr, tr_raw)
        assert np.intersect1d(ids[cut], seen).size == 0
        assert np.array_equal(cut, full[~np.isin(ids[full], seen)])
    assert sum(map(len, data.test_idx)) < sum(map(len, raw.test_idx))
    cls.check_data(cfg, data)
    with pytest.raises(ConfigError, match="algorithm.base"):
        cls.check_data(cfg, raw)


def test_a_base_from_before_samples_npz_is_checked_by_replaying_its_selection(
        study_base, tmp_path, flite_study):
    """A base written before samples.npz existed: its selection is replayed from base.json
    (its seed, classes and fraction), to exactly the ids a new base records, and checked the
    same way; a damaged samples.npz is a state-file error naming it."""
    import json
    import shutil

    from fedray.models.pretrain import seen_samples

    legacy = tmp_path / "legacy"
    shutil.copytree(study_base, legacy)
    (legacy / "samples.npz").unlink()
    meta = json.loads((legacy / "base.json").read_text())
    meta.pop("split_seed")
    (legacy / "base.json").write_text(json.dumps(meta))
    assert base_samples(str(legacy)) is None
    run = flite_study.MODEL + ["data.dataset=digits", "algorithm.name=fedavg", "seed=1",
                               "clients.num_clients=8", "eval.clients=none",
                               f"algorithm.base={legacy}"]
    cfg = load_config(None, run)
    assert np.array_equal(seen_samples(str(legacy), meta, cfg), base_samples(study_base))
    with pytest.raises(ConfigError, match="global test set"):
        check_base_split(str(legacy), cfg, client_data(cfg)[1])
    cfg = load_config(None, run + ["data.split_seed=0"])
    check_base_split(str(legacy), cfg, client_data(cfg)[1])
    (legacy / "samples.npz").write_bytes(b"not an npz")
    with pytest.raises(Exception, match="samples.npz"):
        base_samples(str(legacy))


def test_a_run_whose_local_tests_the_cut_empties_is_refused(tmp_path, flite_study):
    """pretrain.fraction = 1: the base saw every train sample, so every local test split is
    cut to nothing; scoring them is refused (naming eval.clients), not reported as NaN."""
    out = str(tmp_path / "all")
    pretrain(load_config(None, ["data.dataset=digits", "model.name=mlp", "model.hidden=[8]",
                                "pretrain.epochs=1", "pretrain.warmup_epochs=0"]), out,
             progress=False)
    run = ["data.dataset=digits", "model.name=mlp", "model.hidden=[8]", "seed=0",
           "algorithm.name=fedavg", "clients.num_clients=4", f"algorithm.base={out}"]
    cfg = load_config(None, run)
    cls, data = client_data(cfg)
    assert not any(len(t) for t in data.test_idx)
    with pytest.raises(ConfigError, match="eval.clients"):
        cls.check_data(cfg, data)
    cfg = load_config(None, run + ["eval.clients=none"])
    cls.check_data(cfg, client_data(cfg)[1])


def test_synthetic_ids_name_seed_and_index():
    from fedray.data.datasets import make_synthetic

    a, b = make_synthetic(200, 8, seed=0), make_synthetic(200, 8, seed=1)
    assert np.intersect1d(np.concatenate([a.train_ids, a.test_ids]),
                          np.concatenate([b.train_ids, b.test_ids])).size == 0
    assert np.array_equal(np.sort(np.concatenate([b.train_ids, b.test_ids])) - (1 << 32),
                          np.arange(200))


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_fedray_run_refuses_a_leaking_base_in_one_line_before_ray(study_base, tmp_path,
                                                                 as_json):
    from test_hostile_inputs import one_json, run_cli

    run_dir = tmp_path / "run"
    config = tmp_path / "leak.yaml"
    config.write_text(f"seed: 2\nrounds: 1\nmodel: {{name: resnet18, width: 8}}\n"
                      f"eval: {{clients: none}}\n"
                      f"algorithm: {{name: fedavg, base: '{study_base}'}}\n")
    rc, out, err = run_cli(["run", str(config), "-o", str(run_dir),
                            *(["--json"] if as_json else [])])
    text = one_json(out)["error"] if as_json else \
        "\n".join(line for line in err.splitlines() if line.startswith("error: "))
    assert rc == 2 and len(text.splitlines()) == 1, (rc, out, err)
    assert "algorithm.base" in text and "data.split_seed=0" in text
    assert not run_dir.exists()
