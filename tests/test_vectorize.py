"""Vectorized cohorts (``runtime.vectorize``): the batched local SGD equals the sequential
one client by client, the runtime's cohorts keep runs bitwise the same across executor
counts and resumes, a failing or NaN client inside a cohort fails alone, and a config that
cannot vectorize is refused before any Ray work."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import full_and_resumed
from ray import cloudpickle as ray_cloudpickle
from test_runtime import (
    assert_bitwise_equal,
    assert_same_outputs,
    final_state,
    run_outputs,
    runs_across_executors,
)
from torch import nn

from fedray.core import registry
from fedray.core.config import load_config
from fedray.core.registry import make_method
from fedray.core.spec import ConfigError
from fedray.methods.base import (
    AUTO_WORK,
    COHORT_BYTES,
    COHORT_FLOOR,
    ClientContext,
    ClientResult,
    Status,
    cohort_size,
)
from fedray.methods.fedavg.method import FedAvg
from fedray.models import build_model
from fedray.models.cohort import cohort_problems, train_cohort
from fedray.models.training import get_state, set_state, train_local
from fedray.runtime import run_experiment

ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])  # FlakyCohort, in the actors
TOL = 1e-5


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − b‖ / ‖b‖ (0 when both are 0)."""
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den else float(np.linalg.norm(a))


def client_data(sizes, shape, classes=10, seed=0):
    r = np.random.default_rng(seed)
    return [(r.standard_normal((n, *shape)).astype(np.float32),
             r.integers(0, classes, n).astype(np.int64)) for n in sizes]


def sequential(model, data, clients, start, states=None, hook=None, **kw):
    """train_local client by client from ``start``: (params, metrics, optimizer state)."""
    out = []
    for i, ((x, y), c) in enumerate(zip(data, clients, strict=True)):
        set_state(model, start)
        metrics, state = train_local(model, x, y, client=c, grad_hook=hook and hook(model),
                                     optimizer_state=states[i] if states else None, **kw)
        out.append((get_state(model), metrics, state))
    set_state(model, start)
    return out


def assert_equivalent(batched, seq, start, names):
    for got, (params, metrics, state) in zip(batched, seq, strict=True):
        assert got.metrics["steps"] == metrics["steps"]
        assert got.metrics["train_loss"] == pytest.approx(metrics["train_loss"], rel=TOL,
                                                          abs=1e-7)
        want = np.concatenate([(params[n] - start[n]).ravel() for n in names])
        have = np.concatenate([(got.params[n] - start[n]).ravel() for n in names])
        assert rel(have, want) <= TOL, rel(have, want)
        if state is None:
            assert got.optimizer_state is None or \
                all(b is None for b in got.optimizer_state["momentum_buffers"])
        else:
            for b, w in zip(got.optimizer_state["momentum_buffers"],
                            state["momentum_buffers"], strict=True):
                assert (b is None) == (w is None)
                if w is not None:
                    assert rel(b, w) <= TOL


# the GroupNorm ResNet at 16x16 (at 8x8 its last stage normalizes 1x1 maps, whose rounding
# the sequential path itself amplifies past 1e-5 within a few momentum steps)
MODELS = [("mlp", (12,), {"hidden": [16]}), ("cnn", (1, 12, 12), {}),
          ("lstm", (6, 5), {"hidden": 8}), ("resnet18", (3, 16, 16), {"width": 16})]


@pytest.mark.parametrize("name,shape,kwargs", MODELS, ids=[m[0] for m in MODELS])
def test_every_clients_delta_equals_the_sequential_one(name, shape, kwargs):
    """Random client sizes, including an empty client, one smaller than a batch and one
    cut by max_steps; momentum and weight decay; every delta within 1e-5 relative."""
    torch.manual_seed(0)
    model = build_model(name, shape, 10, **kwargs)
    assert cohort_problems(model, shape, 10) == []
    sizes = [0, 3, 20] if name in ("resnet18", "lstm") else [0, 3, 7, 19, 40, 1]
    data = client_data(sizes, shape)
    clients = [5, 9, 2, 14, 3, 8][:len(sizes)]
    kw = dict(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, seed=4,
              round=3, max_steps=5)
    start = get_state(model)
    batched = train_cohort(model, data, clients, **kw)
    assert get_state(model).keys() == start.keys()
    assert all(np.array_equal(v, start[k]) for k, v in get_state(model).items())
    seq = sequential(model, data, clients, start, **kw)
    steps = [s[1]["steps"] for s in seq]  # empty; 2 epochs of one short batch; cut at 5
    assert steps[:2] == [0.0, 2.0] and max(steps) == 5.0
    assert_equivalent(batched, seq, start, [n for n, _ in model.named_parameters()])


def test_kept_momentum_and_the_proximal_hook_match_round_after_round():
    """``local.keep_optimizer_state``: round 2 starts from each client's stacked buffers (a
    client that took no step has none); FedProx's grad hook runs unchanged on the stack."""
    torch.manual_seed(1)
    model = build_model("mlp", (10,), 4, hidden=[8])
    data = client_data([9, 0, 20], (10,), classes=4)
    clients = [1, 2, 3]
    kw = dict(epochs=1, batch_size=4, lr=0.1, momentum=0.5, weight_decay=0.0, seed=0)
    start = get_state(model)
    anchors = {n: torch.from_numpy(start[n]) for n, _ in model.named_parameters()}

    def hook(m):
        names = [n for n, p in m.named_parameters() if p.requires_grad]

        def edit(params):
            for n, p in zip(names, params, strict=True):
                p.grad.add_(p.detach() - anchors[n], alpha=0.3)
        return edit

    names = list(anchors)
    first = train_cohort(model, data, clients, round=1, grad_hook=hook(model), **kw)
    seq1 = sequential(model, data, clients, start, hook=hook, round=1, **kw)
    assert_equivalent(first, seq1, start, names)
    states = [s[2] for s in seq1]
    assert states[1]["momentum_buffers"] == [None] * len(names)
    second = train_cohort(model, data, clients, round=2, grad_hook=hook(model),
                          optimizer_states=[t.optimizer_state for t in first], **kw)
    seq2 = sequential(model, data, clients, start, states, hook=hook, round=2, **kw)
    assert_equivalent(second, seq2, start, names)


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.spare = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def test_models_that_cannot_train_as_cohorts_are_named():
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    drop = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    assert "BatchNorm1d" in cohort_problems(bn, (4,), 2)[0]
    assert "Dropout" in cohort_problems(drop, (4,), 2)[0]
    # SGD skips a parameter without a gradient; a batched gradient of 0 would decay it
    assert "spare.weight" in cohort_problems(_Unused(), (4,), 2, probe=False)[0]
    assert cohort_problems(build_model("mlp", (4,), 2), (4,), 2) == []


class _OwnClient(FedAvg):
    """Overrides the client hook only: a cohort must not bypass it."""

    name = "own-client"

    def client_update(self, ctx, broadcast):
        return super().client_update(ctx, broadcast)


def test_a_subclass_with_its_own_client_code_is_not_vectorized(tiny_cfg):
    with pytest.raises(ConfigError, match="overrides client_update but not cohort_update"):
        cohort_size(tiny_cfg(**{"runtime.vectorize": "on"}), _OwnClient, (64,), 10)
    assert cohort_size(tiny_cfg(**{"runtime.vectorize": "auto"}), _OwnClient, (64,), 10) \
        is None


def test_sweep_values_read_like_config_values():
    from fedray.front.tune import _value

    assert _value("on") == "on" and _value("off") == "off" and _value("true") is True
    assert _value("1e-3") == 0.001


def contexts(cfg, method, data, clients, round=1):
    return [ClientContext(c, round, cfg.seed, "default", *data.client_arrays(c, round, "train"),
                          *data.client_arrays(c, round, "test"), method.resident, "cpu")
            for c in clients]


@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "orders", "fedavgm"])
def test_methods_cohort_update_equals_client_update(algo, tiny_cfg):
    """Each FedAvg-family method's cohort hook against its own client hook on real
    clients of the digits data: uploads (ORDERS' float64 norm included), metrics, sizes."""
    cfg = tiny_cfg(**{"algorithm.name": algo, "eval.local_before_after": "true",
                      "local.epochs": 2})
    cls = registry.method(algo)
    method = make_method(cls, cfg)
    data = cls.build_data(cfg)
    method.resident = method.build_resident(data.input_shape, data.num_classes, "cpu")
    broadcast = method.init_global_state(method.resident, cfg.seed)
    ctxs = contexts(cfg, method, data, range(6))
    batched = method.cohort_update(ctxs, broadcast)
    for ctx, got in zip(ctxs, batched, strict=True):
        want = method.client_update(ctx, broadcast)
        assert got.num_samples == want.num_samples
        assert list(got.metrics) == list(want.metrics)
        for k, v in want.metrics.items():
            assert got.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
        assert got.upload.keys() == want.upload.keys()
        for k, v in want.upload.items():
            if k == "orders.norm":
                g, w = (np.asarray(a).view(np.float64) for a in (got.upload[k], v))
                assert g == pytest.approx(w, rel=TOL)
            else:
                assert rel(got.upload[k], v) <= 2 * TOL, k  # one tensor of Δ


# ----------------------------------------------------------------------------- config


def test_vectorize_keys_are_listed_and_round_trip():
    from fedray.core.config import keys

    listed = {k.key: k for k in keys()}
    assert "auto" in listed["runtime.vectorize"].type and listed["runtime.vectorize"].help
    assert listed["runtime.cohort_size"].help
    cfg = load_config(None, ["runtime.vectorize=on", "runtime.cohort_size=7"])
    assert cfg.runtime.vectorize == "on" and cfg.runtime.cohort_size == 7
    again = load_config(None, [], base=cfg.to_dict())
    assert again.runtime.vectorize == "on" and again.runtime.cohort_size == 7


def test_auto_follows_the_documented_rule(tiny_cfg):
    """auto: on for a small step (the tiny MLP), off above AUTO_WORK multiply-adds per
    client step, off for a method without the capability; the rule reads the config only."""
    small = tiny_cfg(**{"runtime.vectorize": "auto", "runtime.cohort_size": 5})
    assert cohort_size(small, FedAvg, (64,), 10).size == 5
    hidden = AUTO_WORK // (64 * 16) + 1  # 64 inputs, batch 16: just above the rule
    big = tiny_cfg(**{"runtime.vectorize": "auto", "model.hidden": f"[{hidden}]"})
    assert cohort_size(big, FedAvg, (64,), 10) is None
    drod = load_config(None, ["algorithm.name=drod", "model.name=sliceable_resnet18",
                              "runtime.vectorize=auto"])
    assert cohort_size(drod, registry.method("drod"), (3, 32, 32), 10) is None
    assert cohort_size(tiny_cfg(), FedAvg, (64,), 10) is None  # the default: off



def test_cohorts_are_sized_by_the_round_unless_set(tiny_cfg):
    """runtime.cohort_size unset: max(256, ⌈n / 16⌉) clients for a tier's n, growing past
    256 only as far as COHORT_BYTES holds of the method's per-client bytes (a big model
    keeps 256); set: that size whatever n. A call's clients are cut into near-equal
    cohorts: no short tail (2,100 clients in 8 summation groups of 262-263 were 256 + 6
    each)."""
    from fedray.runtime.dispatch import summation_groups
    from fedray.runtime.jobs import cohort_runs

    cfg = tiny_cfg(**{"runtime.vectorize": "auto"})
    assert cfg.runtime.cohort_size is None
    rule = cohort_size(cfg, FedAvg, (64,), 10)
    fit = FedAvg.cohort_fit(cfg, (64,), 10)
    assert rule.size is None and rule.cap == COHORT_BYTES // fit.client_bytes > 625
    assert [rule.of(n) for n in (1, 1000, 4096, 4097, 10_000)] == [256, 256, 256, 257, 625]
    assert rule.of(10**9) == rule.cap
    big = cohort_size(tiny_cfg(**{"runtime.vectorize": "on", "model.hidden": "[4096]"}),
                      FedAvg, (64,), 10)
    assert big.cap < COHORT_FLOOR and big.of(10_000) == big.of(10**9) == COHORT_FLOOR
    set_ = cohort_size(tiny_cfg(**{"runtime.vectorize": "on", "runtime.cohort_size": 7}),
                       FedAvg, (64,), 10)
    assert set_.of(1) == set_.of(10_000) == 7
    ids = list(range(2100))
    groups = summation_groups(ids, None, rule.of(len(ids)))
    assert [len(g) for g in groups] == [263] * 4 + [262] * 4
    assert [[len(c) for c in cohort_runs(g, rule.of(len(ids)))] for g in groups[3:5]] == \
        [[132, 131], [131, 131]]
    assert [len(c) for c in cohort_runs(ids[:7], 3)] == [3, 2, 2]
    assert sum(cohort_runs(ids, 256), []) == ids and cohort_runs([], 3) == []


def test_the_dispatcher_gives_each_call_the_rounds_cohort_size(tiny_cfg):
    """Both reduce modes: the cohort size comes from the tier's clients in the pass, every
    call holds at most one cohort (reduce=driver) or whole near-equal cohorts (reduce=
    executors), and the calls cover the sample in client order. A group re-run after its
    executor died keeps its key and its cohort size, whatever the pass holds besides."""
    from fedray.runtime.dispatch import Dispatcher
    from fedray.runtime.roster import Tiers

    ids = list(range(0, 20_000, 2))
    for reduce in ("driver", "executors"):
        cfg = tiny_cfg(**{"runtime.vectorize": "auto", "runtime.reduce": reduce})
        d = Dispatcher(cfg, None, Tiers(cfg), None, cohort_size(cfg, FedAvg, (64,), 10))
        calls = ([(m, c) for _, m, c in d._batches(ids, rule=d.cohort)] if reduce == "driver"
                 else [(m, c) for _, _, m, c in d._groups(ids, 1, {}, set())])
        assert {c for _, c in calls} == {625}
        assert sum((m for m, _ in calls), []) == ids
        assert [len(m) for m, _ in calls] == ([625] * 16 if reduce == "driver"
                                              else [1250] * 8)
    died = calls[2][0]
    again = list(d._groups(sorted(died + [1, 3, 5]), 2, {tuple(died): ((1, died[0]), 625)},
                           set()))
    assert [(key, members, c) for _, key, members, c in again] == \
        [((1, died[0]), died, 625), ((2, 1), [1, 3, 5], 256)]


@pytest.fixture
def batchnorm_model():
    def bn_mlp(input_shape, num_classes, *, hidden: int = 8):
        """An MLP with BatchNorm (test only)."""
        import math

        d = math.prod(input_shape)
        return nn.Sequential(nn.Flatten(), nn.Linear(d, hidden), nn.BatchNorm1d(hidden),
                             nn.ReLU(), nn.Linear(hidden, num_classes))

    registry.MODELS["bn_mlp"] = bn_mlp
    yield "bn_mlp"
    registry.MODELS.pop("bn_mlp")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_model_that_cannot_vectorize_is_one_cli_line_before_ray(batchnorm_model, tmp_path,
                                                                  as_json):
    """`fedray run -s runtime.vectorize=on` with a BatchNorm model: exit 2 and one line (one
    JSON object with --json) naming the field, the model and why, with Ray forbidden and
    nothing in the run dir; under auto the same config simply trains one client at a time."""
    from test_hostile_inputs import one_json, run_cli

    run_dir = tmp_path / "run"
    rc, out, err = run_cli(["run", "fedray/configs/fedavg_digits.yaml", "-s",
                            f"model.name={batchnorm_model}", "-s", "model.hidden=8", "-s",
                            "runtime.vectorize=on",
                            "-o", str(run_dir), *(["--json"] if as_json else [])])
    text = one_json(out)["error"] if as_json else \
        "\n".join(line for line in err.splitlines() if line.startswith("error: "))
    assert rc == 2 and len(text.splitlines()) == 1, (rc, out, err)
    assert "runtime.vectorize" in text and "BatchNorm1d" in text and batchnorm_model in text
    assert not run_dir.exists()
    auto = load_config("fedray/configs/fedavg_digits.yaml",
                       [f"model.name={batchnorm_model}", "model.hidden=8",
                        "runtime.vectorize=auto"])
    assert cohort_size(auto, FedAvg, (64,), 10) is None


# ----------------------------------------------------------------------------- runtime


VEC = {"runtime.vectorize": "on", "runtime.cohort_size": 2, "clients.fraction": 1.0,
       "local.momentum": 0.5, "local.keep_optimizer_state": "true"}


def test_vectorized_runs_are_bitwise_across_executor_counts(ray_session, tiny_cfg, tmp_path):
    """With vectorize on, 1, 2 and 3 executors give the same bits (state and every metric
    file); the vectorized run is the sequential run up to float32 rounding."""
    states, outputs = runs_across_executors(tiny_cfg, tmp_path, [1, 3, 2], **VEC)
    clients = pq.read_table(tmp_path / "r1" / "clients.parquet").to_pandas()
    assert clients["executor"].dropna().nunique() == 3
    seq = tiny_cfg(**{**VEC, "runtime.vectorize": "off"})
    run_experiment(seq, str(tmp_path / "seq"), progress=False)
    for k, v in final_state(tmp_path / "seq").items():
        assert np.allclose(states[0][k], v, rtol=1e-4, atol=1e-6), k
    # stacked uploads: each client's bytes are still its own encoded size, exactly
    one = run_outputs(tmp_path / "seq")["clients"]
    for col in ("upload_bytes", "download_bytes", "status", "num_samples"):
        assert outputs[0]["clients"][col].equals(one[col]), col
    assert outputs[0]["summary"]["total_upload_bytes"] == \
        run_outputs(tmp_path / "seq")["summary"]["total_upload_bytes"]


def test_vectorized_resume_is_bitwise(ray_session, tiny_cfg, tmp_path):
    cfg = tiny_cfg(**VEC, **{"runtime.reduce": "executors"})
    full, resumed = full_and_resumed(cfg, tmp_path, stop_after=1)
    assert_bitwise_equal(final_state(tmp_path / "full"), final_state(tmp_path / "cut"))
    assert_same_outputs(run_outputs(tmp_path / "full"), run_outputs(tmp_path / "cut"))


class FlakyCohort(FedAvg):
    """Client 1's data breaks the batched update (and its own); client 2 uploads NaN."""

    name = "flaky-cohort"

    def cohort_update(self, contexts, broadcast):
        if any(c.client_id == 1 for c in contexts):
            raise RuntimeError("disk on fire")
        out = super().cohort_update(contexts, broadcast)
        for c, o in zip(contexts, out, strict=True):
            if c.client_id == 2:
                o.upload[next(iter(o.upload))][...] = np.nan
        return out

    def client_update(self, ctx, broadcast):  # client 1's cohort re-runs client by client
        if ctx.client_id == 1:
            raise RuntimeError("disk on fire")
        out = super().client_update(ctx, broadcast)
        if ctx.client_id == 2:
            out.upload[next(iter(out.upload))][...] = np.nan
        return out


@pytest.mark.parametrize("reduce", ["driver", "executors"])
def test_a_failing_or_nan_client_in_a_cohort_fails_alone(ray_session, tiny_cfg, tmp_path,
                                                         reduce):
    cfg = tiny_cfg(**{"runtime.vectorize": "on", "runtime.cohort_size": 3, "rounds": 2,
                      "runtime.max_client_retries": 1, "runtime.reduce": reduce})
    run_experiment(cfg, str(tmp_path / "f"), progress=False, algorithm_cls=FlakyCohort)
    clients = pq.read_table(tmp_path / "f" / "clients.parquet").to_pandas()
    sampled = clients[clients["sampled"]]
    c1 = sampled[sampled["client_id"] == 1]
    assert (c1["status"] == "error").all() and (c1["attempts"] == 2).all()
    assert c1["error"].str.contains("disk on fire").all()
    c2 = sampled[sampled["client_id"] == 2]
    assert (c2["status"] == "rejected").all()
    rest = sampled[~sampled["client_id"].isin([1, 2])]
    assert (rest["status"] == "ok").all() and (rest["attempts"] == 1).all()
    assert (rest["upload_bytes"] > 0).all()
    assert all(np.isfinite(v).all() for v in final_state(tmp_path / "f").values())


def test_a_compressing_method_keeps_its_chain_per_client(ray_session, tiny_cfg, tmp_path):
    """top-k with error feedback: the cohort trains batched, then each client's update goes
    through its own chain (its error memory kept between rounds); bytes are each client's
    own and the state is the sequential run's up to float32 rounding."""
    runs = {}
    for mode in ("on", "off"):
        cfg = tiny_cfg(**{"algorithm.name": "topk", "algorithm.density": 0.1, "rounds": 2,
                          "runtime.vectorize": mode, "runtime.cohort_size": 4})
        run_experiment(cfg, str(tmp_path / mode), progress=False)
        runs[mode] = run_outputs(tmp_path / mode)["clients"]
    assert runs["on"]["upload_bytes"].equals(runs["off"]["upload_bytes"])
    assert (runs["on"]["state_bytes"] > 0).any()
    on, off = final_state(tmp_path / "on"), final_state(tmp_path / "off")
    for k, v in off.items():
        assert np.allclose(on[k], v, rtol=1e-4, atol=1e-6), k


def test_a_reduced_cohort_adds_its_stack_as_each_client_alone(ray_session, tiny_cfg, tmp_path):
    """``runtime.reduce=executors`` with cohorts: the stack decoded once and its clean rows
    added in client order give the partial sum that adding each client's own decoded
    upload gives, bit for bit; the NaN client is named and left out, the failing one
    fails alone, and each client's bytes are its own."""
    import ray

    from fedray.runtime.executor import ClientExecutor
    from fedray.runtime.jobs import Broadcast, ClientSlot, TrainJob

    class OneByOne(ClientExecutor):
        def _stacked(self, slots, round, outputs):
            return None  # every upload encoded, decoded and added on its own

    cfg = tiny_cfg(**{"runtime.vectorize": "on", "runtime.cohort_size": 3,
                      "runtime.reduce": "executors"})
    data = FlakyCohort.build_data(cfg)
    out = []
    for cls in (ClientExecutor, OneByOne):
        ex = ray.remote(num_cpus=0)(cls).remote(cfg, FlakyCohort, data,
                                                str(tmp_path / cls.__name__), "default", 0)
        params = ray.get(ex.init_global_state.remote(cfg.seed))
        job = TrainJob("default", Broadcast("1:train:default", ray.put(params), params.nbytes),
                       1, [ClientSlot(c) for c in range(6)], reduce=True, cohort=3)
        out.append(ray.get(ex.run_clients.remote(job)))
        ray.kill(ex)
    stacked, alone = out
    assert stacked.partial.nonfinite == alone.partial.nonfinite == [2]
    assert stacked.partial.weight == alone.partial.weight > 0
    assert stacked.partial.total.keys() == alone.partial.total.keys()
    for k, v in alone.partial.total.items():
        assert stacked.partial.total[k].tobytes() == v.tobytes(), k
    for a, b in zip(stacked.results, alone.results, strict=True):
        assert (a.client_id, a.status, a.upload_bytes, a.num_samples) == \
            (b.client_id, b.status, b.upload_bytes, b.num_samples)
    assert [r.status for r in stacked.results].count(Status.ERROR) == 1
    assert all(r.payload is None for r in stacked.results)


def test_jobs_and_results_cross_the_object_store_as_columns():
    """A job's clients and a batch's results pickle as plain lists and come back equal,
    every field and status included."""
    import pickle

    from ray import cloudpickle

    from fedray.runtime.jobs import Broadcast, ClientSlot, Partial, TrainBatch, TrainJob
    from fedray.wire.payload import Payload

    results = [ClientResult(c, 4, s, 16 + c, Payload.encode({"w": np.full(3, c, np.float32)},
                                                            "fp32") if c == 1 else None,
                            {"train_loss": 0.5 * c}, "boom" if s is Status.ERROR else "",
                            100 + c, 0.25, "default/1", None if c % 2 else 3, 7 * c)
               for c, s in enumerate([Status.OK, Status.OK, Status.ERROR, Status.REJECTED])]
    batch = TrainBatch(results, Partial({"w": np.ones(3)}, 2.0, [3]))
    back = pickle.loads(cloudpickle.dumps(batch))
    assert back.results[1].payload.decode()["w"].tolist() == [1.0, 1.0, 1.0]
    back.results[1].payload = batch.results[1].payload
    assert back.results == batch.results and back.partial.nonfinite == [3]
    assert [r.status for r in back.results] == [Status.OK, Status.OK, Status.ERROR,
                                                Status.REJECTED]
    job = TrainJob("default", Broadcast("k", None, 1), 2, [ClientSlot(5), ClientSlot(9, 1)],
                   True, 4)
    assert pickle.loads(cloudpickle.dumps(job)) == job
    assert "ClientSlot" not in str(pickle.dumps(job))  # the slots travel as two lists
