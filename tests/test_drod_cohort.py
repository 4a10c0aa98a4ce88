"""The sub-model methods' cohorts (``runtime.vectorize``): one tier's clients trained as one
batched computation equal the clients trained one at a time (uploads, metrics, client
state), for every rule and the objectives that run as cohorts; the replaying ones are
refused in one line."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from conftest import full_and_resumed
from test_drod import TIERS, drod_cfg
from test_drod import context as context32
from test_runtime import assert_same_outputs, final_state, run_outputs

from fedray.core.config import ConfigError
from fedray.core.registry import build_method
from fedray.data import build_data
from fedray.methods.drod.selection import od_choices
from fedray.runtime import run_experiment

# The comparisons run in float64. In float32 a batched (grouped) convolution adds in another
# order than the per-client one (≈ 2e-5 of a tensor's largest entry after one step), and
# these width-8 GroupNorm ResNets on 8×8 digits are chaotic: a 1e-5 relative change of the
# parameters moves the next gradient by up to 4 % (a deep group with almost no variance
# divides rounding noise by √eps), so after a few steps float32 cohorts and clients differ
# by ≈ 3e-3 — and so does the sequential path from itself under such a change. In float64
# the same code agrees to the float32 rounding of the uploads.
TOL = 1e-6
TOL32 = 1e-4  # one float32 step
# one tier of everything: the cohort is that tier's clients
TIER = "[{name: t100, executors: 1, num_cpus: 0.25, capacity: 1.0}]"
SMALL = ("[{name: t100, executors: 1, num_cpus: 0.25, capacity: 1.0},"
         " {name: t025, executors: 1, num_cpus: 0.25, capacity: 0.251}]")


def rel(a, b) -> float:
    """The largest difference over the tensor's largest entry, less one float32 rounding of
    a small entry (1e-7: a few 1e-4 deltas differ in their last bits)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not a.size:
        return 0.0
    return float(max(np.abs(a - b).max() - 1e-7, 0.0) / max(np.abs(b).max(), 1e-12))


@pytest.fixture(autouse=True)
def float64(request):
    """Unit tests compute in float64 (see :data:`TOL`); the Ray test's executors in float32."""
    if request.node.get_closest_marker("ray"):
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def context(*args, **kwargs):
    """:func:`test_drod.context` with the samples in the default dtype."""
    ctx = context32(*args, **kwargs)
    dtype = torch.tensor(0.0).numpy().dtype
    ctx.x_train, ctx.x_test = ctx.x_train.astype(dtype), ctx.x_test.astype(dtype)
    return ctx


def setup(**extra):
    cfg = drod_cfg(**{"continual.method": "none", "runtime.tiers": TIER,
                      "local.momentum": 0.5, "local.weight_decay": 1e-3, "local.batch_size": 32,
                      "clients.num_clients": 24, "continual.ewc_samples": 16, **extra})
    data = build_data(cfg)
    alg = build_method(cfg)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    return cfg, data, alg, res


def assert_same(cohort, one_by_one, tol=None):
    for got, want in zip(cohort, one_by_one, strict=True):
        assert got.num_samples == want.num_samples
        assert list(got.metrics) == list(want.metrics)
        for k, v in want.metrics.items():
            assert got.metrics[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
        assert got.upload.keys() == want.upload.keys()
        for k, v in want.upload.items():
            assert got.upload[k].shape == v.shape, k
            assert rel(got.upload[k], v) <= (tol or TOL), k


def drew_several_rungs(cfg, clients, outputs, round, rungs) -> bool:
    """Whether some step of the cohort had its clients on different rungs."""
    draws = [od_choices(cfg.seed, round, c, int(o.metrics["steps"]), rungs)
             for c, o in zip(clients, outputs, strict=True)]
    return any(len({int(d[t]) for d in draws if t < len(d)}) > 1
               for t in range(max(len(d) for d in draws)))


def compare(cfg, data, alg, res, clients, round=1, states=None):
    g = alg.init_global_state(res, cfg.seed)
    sent = alg.make_policy().broadcast(g, round, cfg.tier_of(clients[0]))
    states = states or {}
    ctxs = [context(cfg, data, alg, c, round, res, states.get(c)) for c in clients]
    cohort = alg.cohort_update(ctxs, sent)
    ctxs = [context(cfg, data, alg, c, round, res, states.get(c)) for c in clients]
    assert_same(cohort, [alg.client_update(c, sent) for c in ctxs])
    return cohort


@pytest.mark.parametrize("algorithm, extra", [
    ("drod", {"algorithm.kd": "true"}),  # od over (s, b) with FjORD's self-distillation
    ("heterofl", {}),
    ("fiarse", {}),
    ("scalefl", {"model.exits": "true"}),
    ("depth_fjord", {"model.exits": "true"}),
], ids=["drod-kd", "heterofl", "fiarse", "scalefl", "depth_fjord"])
def test_a_tiers_cohort_equals_its_clients_one_at_a_time(algorithm, extra):
    """Every rule, momentum and weight decay on, clients of unequal sizes (each with a last
    short batch), Ordered Dropout drawing several rungs in one step."""
    tiers = SMALL if algorithm != "scalefl" else TIER.replace("1.0}", "0.5}")
    cfg, data, alg, res = setup(**{"algorithm.name": algorithm, "runtime.tiers": tiers,
                                   "local.batch_size": 32, **extra})
    tier = cfg.tier_of(0)
    clients = [c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == tier][:5]
    assert len(clients) >= 3
    sizes = {len(data.client_arrays(c, 1)[0]) for c in clients}
    assert len(sizes) > 1  # unequal: padding and masks
    out = compare(cfg, data, alg, res, clients)
    if alg.params.rule == "od":
        nested = [r for r in res.grid if r.geometry.within(res.tiers[tier].geometry)]
        assert drew_several_rungs(cfg, clients, out, 1, len(nested))


def test_augmented_cohorts_draw_each_clients_own_crops(monkeypatch):
    """``augment``: every client's crops and flips are its sequential ones (its generator,
    its order, its unpadded batch): the inputs bitwise, the Δ within :data:`TOL` (crops of
    8×8 digits padded by 4 leave near-empty images, the most chaotic case in float32)."""
    import fedray.models.training as training

    seen: list = []
    real = training.random_crop_flip

    def spy(x, gen, pad=4):
        out = real(x, gen, pad)
        seen.append(out.clone())
        return out

    import fedray.methods.drod.cohort as cohort

    monkeypatch.setattr(training, "random_crop_flip", spy)  # the sequential path's
    monkeypatch.setattr(cohort, "random_crop_flip", spy)
    cfg, data, alg, res = setup(**{"runtime.tiers": SMALL, "algorithm.augment": "true",
                                   "local.max_steps": 2})
    clients = [c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == "t100"][:4]
    g = alg.init_global_state(res, cfg.seed)
    sent = alg.make_policy().broadcast(g, 1, "t100")
    cohort = alg.cohort_update([context(cfg, data, alg, c, 1, res) for c in clients], sent)
    batched, seen[:] = list(seen), []
    one = [alg.client_update(context(cfg, data, alg, c, 1, res), sent) for c in clients]
    # the cohort draws step by step (by drawn rung within a step), the sequential path
    # client by client: the same batches, bit for bit, in another order
    assert len(batched) == len(seen) == sum(int(o.metrics["steps"]) for o in one) > 4
    assert Counter(t.numpy().tobytes() for t in batched) == \
        Counter(t.numpy().tobytes() for t in seen)
    assert_same(cohort, one)


def test_float32_cohorts_equal_one_step_within_rounding():
    """The executors' dtype: one step (before rounding compounds) within :data:`TOL32`."""
    torch.set_default_dtype(torch.float32)  # the fixture restores it
    cfg, data, alg, res = setup(**{"runtime.tiers": SMALL, "local.max_steps": 1})
    clients = [c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == "t100"][:4]
    g = alg.init_global_state(res, cfg.seed)
    sent = alg.make_policy().broadcast(g, 1, "t100")
    cohort = alg.cohort_update([context(cfg, data, alg, c, 1, res) for c in clients], sent)
    assert cohort[0].upload["stem.conv.weight"].dtype == np.float32
    assert_same(cohort, [alg.client_update(context(cfg, data, alg, c, 1, res), sent)
                         for c in clients], TOL32)


def test_max_steps_and_a_smaller_tier():
    cfg, data, alg, res = setup(**{"runtime.tiers": SMALL, "local.max_steps": 3,
                                   "local.batch_size": 4})
    small = [c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == "t025"][:4]
    out = compare(cfg, data, alg, res, small)
    steps = [-(-len(data.client_arrays(c, 1)[0]) // 4) for c in small]
    assert [o.metrics["steps"] for o in out] == [min(3, n) for n in steps]
    assert max(steps) > 3  # the cap cut a client's schedule


def test_ewc_cohorts_keep_each_clients_fisher_and_anchor():
    """EWC: the Fisher of a task's last round and the penalty of the next task's rounds
    (a client without a Fisher yet beside ones with) as one cohort."""
    cfg, data, alg, res = setup(**{"continual.method": "ewc", "continual.ewc_lambda": 50.0,
                                   "runtime.tiers": SMALL})
    clients = [c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == "t100"][:6]
    g = alg.init_global_state(res, cfg.seed)
    sent = alg.make_policy().broadcast(g, 2, "t100")
    # round 2 ends task 0: the Fisher is estimated (clients 0-2 only: 3-5 have none)
    first = alg.cohort_update([context(cfg, data, alg, c, 2, res) for c in clients[:3]], sent)
    seq = [alg.client_update(context(cfg, data, alg, c, 2, res), sent) for c in clients[:3]]
    assert_same(first, seq)
    for got, want in zip(first, seq, strict=True):
        for k, v in want.state["fisher"].items():  # at the broadcast: no training before it
            assert rel(got.state["fisher"][k], v) <= TOL, k
    states = {c: o.state for c, o in zip(clients[:3], first, strict=True)}
    out = compare(cfg, data, alg, res, clients, round=3, states=states)
    assert all(o.state["anchor_task"] == 1 for o in out)
    # the full tier draws its own model or the smaller rung: a pulled client moves the
    # parameters the smaller rung does not reach, an unpulled one leaves them
    assert drew_several_rungs(cfg, clients, out, 3, len(res.grid))


@pytest.mark.parametrize("method", ["er", "derpp", "bic"])
def test_replaying_objectives_are_refused_in_one_line(method):
    with pytest.raises(ConfigError) as e:
        drod_cfg(**{"continual.method": method, "runtime.vectorize": "on"})
    assert e.value.path == "runtime.vectorize"
    assert f"continual.method={method}" in str(e.value) and "\n" not in str(e.value)


def test_auto_never_takes_the_convolutional_sliceable_resnet():
    from fedray.methods.base import cohort_size

    cfg = drod_cfg(**{"continual.method": "none", "runtime.vectorize": "auto"})
    alg = build_method(cfg)
    assert cohort_size(cfg, type(alg), (1, 8, 8), 10) is None
    on = drod_cfg(**{"continual.method": "none", "runtime.vectorize": "on"})
    rule = cohort_size(on, type(alg), (1, 8, 8), 10)  # unset: a big model keeps the floor
    assert rule.size is None and rule.of(4) == rule.of(100_000) == 256


@pytest.mark.ray
@pytest.mark.timeout(1500)  # five short runs; 11 min on this machine at load 35
def test_vectorized_tiers_are_bitwise_across_executor_counts_and_resume(ray_session, tmp_path):
    """DROD with EWC over two one-round tasks, three tiers, cohorts of 2: the same bits with one or
    two executors on the full tier and after a resume; the sequential run within float32
    rounding."""
    vec = {"continual.method": "ewc", "runtime.vectorize": "on", "runtime.cohort_size": 2,
           "local.batch_size": 32, "rounds": 2, "continual.rounds_per_task": 1,
           "eval.every": 1}
    cfg = drod_cfg(**vec)
    two = drod_cfg(**vec, **{"runtime.tiers": TIERS.replace(
        "executors: 1, num_cpus: 0.25, capacity: 1.0",
        "executors: 2, num_cpus: 0.25, capacity: 1.0")})
    full_and_resumed(cfg, tmp_path, stop_after=1)
    run_experiment(two, str(tmp_path / "two"), progress=False)
    a, b, c = (final_state(tmp_path / d) for d in ("full", "cut", "two"))
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k
    assert_same_outputs(run_outputs(tmp_path / "full"), run_outputs(tmp_path / "two"))
    clients = run_outputs(tmp_path / "full")["clients"]
    assert (clients["status"] == "ok").all() and clients["upload_bytes"].gt(0).all()
    # the cohorts ran (a cohort that raises is re-run client by client, also bitwise): the
    # sequential run differs in its last bits, which this chaotic float32 model (see TOL)
    # amplifies (round 2's losses differ by up to 6 %), so what must agree is what each
    # client did, and the first round's losses (from the same broadcast)
    run_experiment(drod_cfg(**{**vec, "runtime.vectorize": "off"}), str(tmp_path / "seq"),
                   progress=False)
    seq = final_state(tmp_path / "seq")
    assert any(not np.array_equal(a[k], v) for k, v in seq.items())
    got, want = clients, run_outputs(tmp_path / "seq")["clients"]
    exact = ["round", "client_id", "tier", "status", "num_samples", "upload_bytes",
             "download_bytes", "steps", "task", "sub_param_ratio"]
    assert got[exact].equals(want[exact])
    first = got["round"] == 1
    assert np.allclose(got["train_loss"][first], want["train_loss"][first], rtol=1e-3)


def test_augmented_one_channel_batches_have_plain_strides():
    """A crop-and-flip batch of one-channel images is plain NCHW, not the permuted strides
    that also read as channels-last (oneDNN's channels-last convolution backward corrupted
    the heap on those: DROD with ``augment`` on digits crashed)."""
    from fedray.models.training import random_crop_flip

    out = random_crop_flip(torch.randn(5, 1, 8, 8), torch.Generator().manual_seed(0))
    assert out.stride() == (64, 64, 8, 1)
