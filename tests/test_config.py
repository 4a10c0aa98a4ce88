import pytest

from fedray.core.config import ConfigError, load_config


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: x\nrounds: 4\nlocal:\n  lr: 0.1\nmodel:\n  name: cnn\n")
    cfg = load_config(f, ["local.lr=0.2", "clients.num_clients=7", "model.hidden=32"])
    assert cfg.rounds == 4 and cfg.local.lr == 0.2 and cfg.clients.num_clients == 7
    assert cfg.model == {"name": "cnn", "hidden": 32}
    assert cfg.algorithm == {"name": "fedavg", "weighted": True, "base": None}
    assert cfg.server == {"optimizer": "sgd", "lr": 1.0}


def test_toml_and_algorithm_params(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('rounds = 2\n[algorithm]\nname = "fedprox"\nmu = 0.1\n')
    cfg = load_config(f)
    assert cfg.algorithm["mu"] == 0.1 and cfg.algorithm["name"] == "fedprox"


def test_tier_list_override():
    cfg = load_config(None, ["runtime.tiers=[{name: a, executors: 1}, {name: b, num_gpus: 0.25}]",
                             "clients.num_clients=3", "clients.tiers=[a, b, b]"])
    assert [t.name for t in cfg.runtime.tiers] == ["a", "b"]
    assert cfg.runtime.tiers[1].num_gpus == 0.25
    assert [cfg.tier_of(c) for c in range(3)] == ["a", "b", "b"]
    rr = load_config(None, ["runtime.tiers=[{name: a}, {name: b}, {name: c}]",
                            "clients.num_clients=10"])
    assert [rr.tier_of(c) for c in range(10)].count("a") == 4


BAD = [
    (["nonsense=1"], "nonsense", "known keys"),
    (["local.lrr=0.1"], "local.lrr", "known keys"),
    (["local.lr=-1"], "local.lr", "> 0"),
    (["local.lr=fast"], "local.lr", "a number"),
    (["rounds=2.5"], "rounds", "an integer"),
    (["rounds=0"], "rounds", ">= 1"),
    (["clients.fraction=1.5"], "clients.fraction", "<= 1"),
    (["data.partition=zipf"], "data.partition", "'dirichlet'"),
    (["data.alpha=0"], "data.alpha", "> 0"),
    (["model.name=vgg"], "model.name", "resnet18"),
    (["model.depth=3"], "model.depth", "known keys"),
    (["algorithm.name=fedsgd"], "algorithm.name", "fedavg"),
    (["algorithm.mu=0.1"], "algorithm.mu", "known keys"),
    (["algorithm.name=fedprox", "algorithm.mu=-0.1"], "algorithm.mu", ">= 0"),
    (["clients.num_clients=5", "clients.per_round=6"], "clients.per_round", "at most"),
    (["eval.global_test=1"], "eval.global_test", "true or false"),
    (["data.dataset=cifar10", "data.root=/does/not/exist"], "data.root", "existing directory"),
    (["runtime.tiers=[{name: a}, {name: a}]"], "runtime.tiers", "unique"),
    (["clients.num_clients=2", "clients.tiers=[default, gpu]"], "clients.tiers[1]", "one of"),
    (["runtime.tiers=[{name: a, num_gpus: 2}]"], "runtime.tiers[0].num_gpus", "<= 1"),
    (["payload.upload=int2"], "payload.upload", "'int4'"),
    (["data.drift_round=50", "rounds=10"], "data.drift_round", "rounds"),
    (["local.momentum=1"], "local.momentum", "< 1"),
    (["runtime.tiers=[{name: a, resources: {tier_full: x}}]"],
     "runtime.tiers[0].resources.tier_full", "a number"),
]


@pytest.mark.parametrize("overrides,field,allowed", BAD, ids=[b[1] for b in BAD])
def test_bad_inputs_name_field_value_and_rule(overrides, field, allowed):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.path == field
    msg = str(e.value)
    assert field in msg and allowed in msg
    assert repr(e.value.value) in msg


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="existing"):
        load_config(tmp_path / "missing.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(f)
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["rounds"])


def test_every_shipped_config_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    paths = sorted((root / "fedray" / "configs").glob("*.yaml"))
    assert len(paths) >= 5
    # one copy of each: configs/ is the packaged directory itself (a link), not a duplicate
    assert (root / "configs").resolve() == (root / "fedray" / "configs").resolve()
    for p in paths:
        try:
            cfg = load_config(p)
        except ConfigError as e:  # FLITE's config names the base `fedray pretrain` writes
            assert e.path == "algorithm.base" and "pretrain" in str(e), p
            continue
        assert cfg.rounds >= 1, p


def test_config_errors_survive_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(ConfigError("a.b", 3, "at most 2")))
    assert (e.path, e.value, e.allowed) == ("a.b", 3, "at most 2") and "a.b" in str(e)
