"""FLITE's clients as cohorts (:mod:`fedray.methods.flite.cohort`): each client's uploaded
latent and metrics equal its own client update's (stored and regenerated factors, both
quantizer scopes, weight decay and an active clip), a vectorized run is bitwise the same
across executor counts and the sequential run up to float32 rounding, and what cannot be
vectorized is one line before Ray."""

from __future__ import annotations

import numpy as np
import pytest
from test_flite import PRE, base  # noqa: F401 — the tiny pretrained CNN base
from test_runtime import final_state, runs_across_executors

from fedray.core import registry
from fedray.core.config import load_config
from fedray.core.registry import make_method
from fedray.core.spec import ConfigError
from fedray.methods.base import ClientContext, cohort_size
from fedray.models import training

TOL = 1e-5
CLIP = 0.08  # the latent gradients of this setting: norms 0.06–0.15, some clipped
FLITE = ["algorithm.name=flite", "algorithm.d=16", "algorithm.r=8", "local.batch_size=16",
         "local.epochs=2", "local.max_steps=6", "algorithm.weight_decay=0.01",
         f"algorithm.clip={CLIP}"]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − b‖ / ‖b‖ (‖a‖ when b is 0)."""
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den else float(np.linalg.norm(a))


def latent(upload: dict, layout: list[tuple[str, int]]) -> np.ndarray:
    return upload["z"] if "z" in upload else np.concatenate([upload[f"z/{n}"]
                                                            for n, _ in layout])


def config(base: str, *extra: str):  # noqa: F811
    return load_config(None, PRE + FLITE + [f"algorithm.base={base}", *extra])


@pytest.fixture(scope="module")
def setting(base):  # noqa: F811
    """The base, the config's data, and client shards of every kind: empty (no step),
    smaller than a batch, a short last batch, one cut by local.max_steps."""
    cfg = config(base)
    data = registry.method("flite").build_data(cfg)
    parts = [data.client_arrays(c, 1, "train") for c in range(data.num_clients)]
    x, y = (np.concatenate(a) for a in zip(*parts, strict=True))
    cuts = np.cumsum([0, 0, 5, 23, 40, 150])
    assert cuts[-1] <= len(x)
    shards = [(x[a:b], y[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    return base, data, shards, data.client_arrays(0, 1, "test")


@pytest.mark.parametrize("mode", ["stored", "regenerated"])
@pytest.mark.parametrize("scope", ["vector", "layer"])
def test_every_clients_latent_equals_its_client_update(setting, mode, scope, monkeypatch):
    base, data, shards, (xt, yt) = setting  # noqa: F811
    cfg = config(base, f"algorithm.mode={mode}", f"algorithm.quant_scope={scope}")
    method = make_method(registry.method("flite"), cfg)
    resident = method.build_resident(data.input_shape, data.num_classes, "cpu")
    layout = resident.latent_layout()
    z0 = np.random.default_rng(0).normal(0, 0.05, resident.D).astype(np.float32)
    ctxs = [ClientContext(c, 3, cfg.seed, "default", xs, ys, xt, yt, resident)
            for c, (xs, ys) in zip([4, 9, 2, 7, 5], shards, strict=True)]
    batched = method.cohort_update(ctxs, {"z": z0})
    assert np.array_equal(resident.latent_vector().numpy(), np.zeros(resident.D, np.float32))

    clipped = []  # per sequential step: was the latent's gradient clipped?
    step = training.Adam.step

    def recording(opt):
        norm = np.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in opt.params))
        clipped[-1].append(norm > opt.clip)
        step(opt)

    monkeypatch.setattr(training.Adam, "step", recording)
    for ctx, got in zip(ctxs, batched, strict=True):
        clipped.append([])
        want = method.client_update(ctx, {"z": z0})
        assert got.num_samples == want.num_samples == len(ctx.x_train)
        assert list(got.metrics) == list(want.metrics)
        assert got.metrics["steps"] == want.metrics["steps"]
        assert got.metrics["train_loss"] == pytest.approx(want.metrics["train_loss"], rel=TOL)
        assert got.upload.keys() == want.upload.keys()
        assert all(v.dtype == np.float32 for v in got.upload.values())
        delta = rel(latent(got.upload, layout) - z0, latent(want.upload, layout) - z0)
        assert delta <= TOL, (ctx.client_id, delta)
    steps = [o.metrics["steps"] for o in batched]
    assert steps == [0.0, 2.0, 4.0, 6.0, 6.0]  # empty; 2 epochs of one short batch; cut at 6
    assert np.array_equal(latent(batched[0].upload, layout), z0)  # no step: z̄ itself
    assert any(any(c) for c in clipped) and not all(all(c) for c in clipped if c)


def test_on_takes_flite_and_auto_follows_the_measured_rule(setting):
    """on: the tiny CNN's cohorts (its probe passes, its bytes are sized); auto: where the
    factor products are at least 1/20 of the network's multiply-adds per step — the FLITE
    digits study's width-8 ResNet-18 on 8×8 inputs, not the same network on 32×32 nor the
    tiny CNN at d = 16, r = 8."""
    base, data, _, _ = setting  # noqa: F811
    flite, shape = registry.method("flite"), (data.input_shape, data.num_classes)
    on = config(base, "runtime.vectorize=on", "runtime.cohort_size=3")
    assert cohort_size(on, flite, *shape).size == 3
    fit = flite.cohort_fit(on, *shape)
    assert fit.problems == [] and fit.client_bytes > 0 and fit.pays is False
    assert cohort_size(config(base, "runtime.vectorize=auto"), flite, *shape) is None
    study = load_config(None, ["algorithm.name=flite", "algorithm.identity_check=false",
                               "model.name=resnet18", "model.width=8", "algorithm.d=64",
                               "algorithm.r=32", "local.batch_size=16", "data.dataset=digits",
                               "runtime.vectorize=auto", "runtime.cohort_size=8"])
    assert cohort_size(study, flite, (1, 8, 8), 10).size == 8
    assert cohort_size(study, flite, (3, 32, 32), 10) is None


def test_bf16_under_on_is_one_line(base):  # noqa: F811
    with pytest.raises(ConfigError) as e:
        config(base, "runtime.vectorize=on", "local.bf16=true")
    assert e.value.path == "runtime.vectorize" and "bf16" in str(e.value)
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.ray
def test_vectorized_runs_are_bitwise_across_executor_counts(ray_session, tiny_cfg, base,  # noqa: F811
                                                            tmp_path):
    """cohorts of 2 on 1 and 2 executors: the same bits; the sequential run up to float32
    rounding."""
    run = {"model.name": "cnn", "model.channels": "[8,16]", "model.hidden": 32,
           "algorithm.name": "flite", "algorithm.base": base, "algorithm.d": 16,
           "algorithm.r": 8, "data.split_seed": 0, "rounds": 2, "runtime.vectorize": "on",
           "runtime.cohort_size": 2}
    cfg = tiny_cfg(**run)
    flite = registry.method("flite")
    assert cohort_size(cfg, flite, *flite.input_of(cfg)).size == 2
    states, _ = runs_across_executors(tiny_cfg, tmp_path, [1, 2], **run)
    from fedray.runtime import run_experiment

    run_experiment(tiny_cfg(**run | {"runtime.vectorize": "off"}), str(tmp_path / "seq"),
                   progress=False)
    seq = final_state(tmp_path / "seq")
    for k, v in seq.items():
        assert np.allclose(states[0][k], v, rtol=1e-4, atol=1e-6), k
        assert np.abs(v).sum() > 0
    # the batched products add in another order: other bits, so the cohorts did run (a
    # cohort that raises is re-run client by client, which would give the same bits)
    assert any(not np.array_equal(states[0][k], v) for k, v in seq.items())
