"""The conformance suite every registered method inherits (``fedray/methods/``, plugins
included): a new method's own tests then cover only its own rule.

For each method, on its smallest config (:data:`SMALLEST`, which a new method must join):

- its capabilities are honoured: each setting that needs a capability it lacks is refused
  before any Ray work, naming that setting; each one it has is not refused for it; its
  policy is asynchronous exactly when it declares ``asynchronous``;
- its config round-trips: the stored ``config.yaml`` loads back to the same config;
- a run on two executors and a run on one executor stopped after round 1 then resumed end
  bitwise equal (global model and every checkpoint part: policy, optimizer, ledger, client
  manifest) with equal metrics rows;
- the bytes add up: each round's upload and download bytes are the sums over its clients
  and the cumulative columns and the summary totals are their running sums.

Shared keys mean one thing: two methods with the same ``algorithm.*`` key give it one type
and one help text (their defaults may differ).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedray.core import registry
from fedray.core.config import ConfigError, keys, load_config

TINY = ["rounds=2", "seed=5", "clients.num_clients=4", "clients.fraction=1.0",
        "local.batch_size=16", "local.epochs=1", "local.max_steps=3", "eval.every=2",
        "eval.clients=sampled",
        "runtime.keep_warm=true", "runtime.placement_timeout_s=300"]
MLP = ["model.hidden=[16]"]
HETERO = ["model.name=sliceable_resnet18", "model.width=4", "local.lr=0.05",
          "data.partition=dirichlet"]  # what a task stream splits each task by
FLITE_PRE = ["model.name=cnn", "model.channels=[8,16]", "model.hidden=32",
             "pretrain.epochs=1", "pretrain.batch_size=64", "pretrain.warmup_epochs=1",
             "data.split_seed=0", "pretrain.fraction=0.5"]


def tiers(n: int, hetero: bool = False) -> str:
    if hetero:  # one executor per capacity tier; n of the full-width one
        return (f"runtime.tiers=[{{name: t100, executors: {n}, num_cpus: 0.25, capacity: 1.0}},"
                " {name: t025, executors: 1, num_cpus: 0.25, capacity: 0.251}]")
    return f"runtime.tiers=[{{name: default, executors: {n}, num_cpus: 0.5}}]"


# method -> its smallest config beyond TINY (``{base}``, ``{lm}``, ``{asce}``, ``{csv}`` are
# the module fixtures' paths)
SMALLEST: dict[str, list[str]] = {
    **{m: MLP for m in ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
                        "orders", "topk", "powersgd", "feddyn", "scaffold", "fednova",
                        "moon")},
    "fedbuff": MLP + ["algorithm.concurrency=2", "algorithm.buffer_size=2"],
    "fedasync": MLP + ["algorithm.concurrency=2"],
    "flite": FLITE_PRE + ["algorithm.base={base}", "algorithm.d=4", "algorithm.r=2"],
    **{m: HETERO for m in ("hetero", "drod", "fjord", "heterofl", "fedrolex", "fiarse",
                           "shortcut_fedavg", "shortcut_fjord")},
    **{m: HETERO + ["model.exits=true"] for m in ("depth_fedavg", "depth_fjord", "scalefl")},
    "favor": ["algorithm.base={lm}", "algorithm.asce={asce}", "algorithm.lora_rank=2",
              "algorithm.lora_alpha=4", "algorithm.micro_batch=2", "algorithm.accumulation=1",
              "algorithm.proj_hidden=8", "algorithm.max_steps=1", "algorithm.asce_authors=0",
              "algorithm.min_tokens=1", "algorithm.block_length=16", "algorithm.prompt_tokens=8",
              "algorithm.new_tokens=12", "algorithm.reference_texts=3",
              "algorithm.eval_prompts=2", "data.dataset=blogtext", "data.root={csv}",
              "eval.every=0"],
}

# capability -> a setting that needs it (key, overrides)
NEEDS = {
    "dp": ("dp.enabled", ["dp.enabled=true", "dp.noise_multiplier=1.0"]),
    "dp_sgd": ("local.dp_noise_multiplier", ["local.dp_noise_multiplier=1.0"]),
    "transforms": ("payload.transforms", ["payload.transforms=[int8]"]),
    "linear": ("runtime.reduce", ["runtime.reduce=executors"]),
    "server_optimizer": ("server.optimizer", ["server.optimizer={other}"]),
    "continual": ("continual.tasks", ["continual.tasks=2", "continual.rounds_per_task=2",
                                      "continual.class_order=[0,1,2,3,4,5,6,7,8,9]"]),
    "robust": ("robust.rule", ["robust.rule=median"]),
    "attack": ("adversary.attack", ["adversary.attack=sign_flip", "adversary.clients=[0]"]),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """FLITE's pretrained base; FAVoR's tiny LM, tiny ASCE and a 4-author corpus."""
    from test_asce import tiny_backbone
    from test_favor import save_tiny_lm
    from transformers import AutoModel, AutoTokenizer

    from fedray.data.authors import generate_corpus
    from fedray.methods.favor.asce import StyleEncoder, save_asce
    from fedray.models.pretrain import pretrain

    root = tmp_path_factory.mktemp("conformance")
    pretrain(load_config(None, FLITE_PRE), str(root / "base"), progress=False)
    save_tiny_lm(root / "lm")
    bb = tiny_backbone(root / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(root / "asce"), {})
    csv = generate_corpus(root / "blog.csv", num_authors=4, seed=0, posts=(10, 12))
    return {"base": str(root / "base"), "lm": str(root / "lm"), "asce": str(root / "asce"),
            "csv": str(csv)}


def smallest(name: str, paths: dict[str, str] | None = None, executors: int = 2,
             extra: list[str] = ()) -> list[str]:
    cls = registry.method(name)
    hetero = "continual" in cls.capabilities
    over = [o.format(**(paths or {})) for o in SMALLEST[name]]
    tiny = [o for o in TINY  # a local.* knob the method does not read is refused
            if o.split("=")[0].removeprefix("local.") not in cls.unread_local]
    return tiny + over + [tiers(executors, hetero), f"algorithm.name={name}", *extra]


def test_every_method_has_a_smallest_config():
    assert set(SMALLEST) == set(registry.methods()), \
        "a new method joins the conformance suite with its smallest config in SMALLEST"


def test_a_shared_key_means_one_thing():
    rows = [k for k in keys() if k.key.startswith(("algorithm.", "server."))]
    seen: dict[str, list[str]] = {}
    for k in rows:
        seen.setdefault(k.key, []).append(f"{k.type} / {k.help!r} for {k.applies_to}")
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


@pytest.fixture(scope="module", autouse=True)
def _release_warm_actors():
    yield
    from fedray.runtime import release_warm

    release_warm()


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_capabilities_are_honoured_before_any_ray_work(name, paths):
    from fedray.core.registry import make_method

    cls = registry.method(name)
    other = "yogi" if cls.server_optimizer != "yogi" else "adam"  # not the method's own
    for cap, (key, settings) in NEEDS.items():
        try:
            load_config(None, smallest(name, paths, extra=[o.format(other=other)
                                                           for o in settings]))
        except ConfigError as e:  # a preset's fixed optimizer is refused as fixed
            refused = e.path == key and ("lacks the" in str(e) or "is fixed" in str(e))
            assert refused == (cap not in cls.capabilities), (cap, str(e))
            if refused:
                assert name in str(e) and len(str(e).splitlines()) == 1
        else:
            assert cap in cls.capabilities, f"{name} took {key} without {cap!r}"
    policy = make_method(cls, load_config(None, smallest(name, paths))).make_policy()
    assert (policy.buffer_size is not None) == ("asynchronous" in cls.capabilities)
    assert (policy.optimizer is not None) == (cls.server_optimizer is not None)


def _rows(run_dir: Path, kind: str) -> list[dict]:
    from fedray.observe.metrics import read_metrics

    drop = {"seconds", "executor"}
    return [{k: v for k, v in r.items() if k not in drop}
            for r in read_metrics(str(run_dir), kind).to_pylist()]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k])
                                                                    for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def check_bytes(run_dir: Path, summary: dict, asynchronous: bool) -> None:
    """Rows sum to rounds, rounds to the running totals, the totals to the summary. An
    asynchronous rule charges a download when its client is dispatched, so the running
    download total also holds the clients still in flight (at least the rows' sum)."""
    rounds, clients = _rows(run_dir, "rounds"), _rows(run_dir, "clients")
    up = down = 0
    for r in rounds:
        mine = [c for c in clients if c["round"] == r["round"] and c["sampled"]]
        assert r["upload_bytes"] == sum(c["upload_bytes"] for c in mine), r["round"]
        assert r["download_bytes"] == sum(c["download_bytes"] for c in mine), r["round"]
        up, down = up + r["upload_bytes"], down + r["download_bytes"]
        assert r["cum_upload_bytes"] == up
        assert r["cum_download_bytes"] >= down if asynchronous else \
            r["cum_download_bytes"] == down
    assert summary["total_upload_bytes"] == up
    assert summary["total_download_bytes"] == rounds[-1]["cum_download_bytes"]
    assert up > 0 and down > 0


@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_resume_and_executor_count_change_no_bit(ray_session, paths, name, tmp_path):
    from fedray.core import checkpoint
    from fedray.core.storage import Storage
    from fedray.runtime import Experiment, run_experiment

    two = load_config(None, smallest(name, paths, executors=2))
    one = load_config(None, smallest(name, paths, executors=1))
    full = run_experiment(two, str(tmp_path / "full"), progress=False)
    exp = Experiment(one, str(tmp_path / "cut"))
    try:
        exp.start()
        exp.step()
    finally:
        exp.release()
    resumed = run_experiment(one, str(tmp_path / "cut"), resume=True, progress=False)
    assert full["rounds"] == resumed["rounds"] == two.rounds
    assert resumed["rounds_this_session"] == two.rounds - 1
    a = checkpoint.read(Storage(str(tmp_path / "full")))
    b = checkpoint.read(Storage(str(tmp_path / "cut")))
    for part in ("server", "policy", "ledger", "clients", "loop", "optimizer"):
        assert (part in a) == (part in b) and _same(a.get(part), b.get(part)), part
    assert all(np.isfinite(v).all() for v in a["server"]["params"].values())
    assert _same(_rows(tmp_path / "full", "rounds"), _rows(tmp_path / "cut", "rounds"))
    assert _same(_rows(tmp_path / "full", "clients"), _rows(tmp_path / "cut", "clients"))
    check_bytes(tmp_path / "full", full, "asynchronous" in registry.method(name).capabilities)
    stored = yaml.safe_load((tmp_path / "full" / "config.yaml").read_text())
    assert load_config(None, base=stored).to_dict() == stored  # the config round-trips
