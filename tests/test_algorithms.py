"""FedAvg/FedProx without Ray: the policy against hand-computed values, the client update on
a real tiny model."""

import numpy as np
import pytest

from fedray.core.config import load_config
from fedray.core.registry import build_method
from fedray.data import build_federated
from fedray.methods.base import ClientContext
from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.services.server_opt import SGD


def test_fedavg_policy_hand_computed():
    g = {"w": np.array([1.0, 2.0], np.float32)}
    ups = [(0, 1, {"w": np.array([1.0, 0.0], np.float32)}),
           (3, 3, {"w": np.array([-1.0, 4.0], np.float32)})]
    new, m = FedAvgPolicy(SGD.of(lr=1.0)).aggregate(g, ups, 1)
    assert np.allclose(new["w"], [1.0 + (1 * 1 - 3) / 4, 2.0 + 12 / 4])
    new, _ = FedAvgPolicy(SGD.of(lr=0.5), weighted=False).aggregate(g, ups, 1)
    assert np.allclose(new["w"], [1.0 + 0.5 * 0.0, 2.0 + 0.5 * 2.0])
    assert m["update_norm"] == pytest.approx(np.hypot(-0.5, 3.0))


def _ctx(cfg, algo, data, cid=0):
    resident = algo.build_resident(data.input_shape, data.num_classes, "cpu")
    x, y = data.client_arrays(cid, 1, "train")
    xt, yt = data.client_arrays(cid, 1, "test")
    return ClientContext(cid, 1, cfg.seed, "default", x, y, xt, yt, resident)


def _run(overrides):
    cfg = load_config(None, ["clients.num_clients=4", "model.hidden=[16]", "local.epochs=2",
                             *overrides])
    algo = build_method(cfg)
    data = build_federated(cfg.data, 4, cfg.seed)
    ctx = _ctx(cfg, algo, data)
    g = algo.init_global_state(ctx.resident, cfg.seed)
    return algo, ctx, g, algo.client_update(ctx, g)


def test_client_update_is_deterministic_and_moves():
    _, _, g, a = _run([])
    _, _, _, b = _run([])
    assert a.num_samples > 0 and a.metrics["steps"] > 0
    for k in a.upload:
        assert np.array_equal(a.upload[k], b.upload[k])
    assert sum(float(np.abs(v).sum()) for v in a.upload.values()) > 0


def test_fedprox_mu_zero_equals_fedavg_and_mu_shrinks_update():
    _, _, _, avg = _run([])
    _, _, _, p0 = _run(["algorithm.name=fedprox", "algorithm.mu=0"])
    _, _, _, p1 = _run(["algorithm.name=fedprox", "algorithm.mu=5.0"])
    for k in avg.upload:
        assert np.array_equal(avg.upload[k], p0.upload[k])

    def norm(u):
        return np.sqrt(sum(float((v ** 2).sum()) for v in u.values()))

    assert norm(p1.upload) < norm(avg.upload)


def test_keep_optimizer_state_returns_momentum():
    _, _, _, out = _run(["local.momentum=0.9", "local.keep_optimizer_state=true"])
    assert out.state is not None
    assert all(b is not None for b in out.state["optimizer"]["momentum_buffers"])
    _, _, _, plain = _run(["local.momentum=0.9"])
    assert plain.state is None


def test_bf16_autocast_trains_and_differs_from_fp32():
    _, _, _, fp32 = _run([])
    _, _, _, bf16 = _run(["local.bf16=true"])
    assert all(np.isfinite(v).all() for v in bf16.upload.values())
    assert bf16.metrics["train_loss"] == pytest.approx(fp32.metrics["train_loss"], rel=0.05)
    assert any(not np.array_equal(bf16.upload[k], fp32.upload[k]) for k in fp32.upload)


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3), (0.0, 5e-4)])
def test_sgd_matches_torch_optim(momentum, wd):
    import torch

    from fedray.models.training import SGD

    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    ours = SGD(list(a.parameters()), lr=0.1, momentum=momentum, weight_decay=wd)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    for step in range(4):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        for m, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    state = ours.state_dict()
    again = SGD(list(a.parameters()), lr=0.1, momentum=momentum)
    again.load_state_dict(state)
    assert len(again.buffers) == 2


@pytest.mark.parametrize("wd,clip", [(0.0, None), (1e-4, None), (1e-4, 1.0)])
def test_adam_matches_torch_optim(wd, clip):
    import torch

    from fedray.models.training import Adam

    torch.manual_seed(1)
    a = torch.nn.Linear(6, 4)
    b = torch.nn.Linear(6, 4)
    b.load_state_dict(a.state_dict())
    ours = Adam(list(a.parameters()), lr=1e-2, weight_decay=wd, clip=clip)
    ref = torch.optim.Adam(b.parameters(), lr=1e-2, weight_decay=wd)
    for step in range(5):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step)) * 10
        for m, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            if opt is ref and clip is not None:
                torch.nn.utils.clip_grad_norm_(b.parameters(), clip)
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "cnn", "resnet18"])
def test_initial_weights_do_not_depend_on_the_residents_device(model):
    """The global start is drawn on the CPU from the seed alone: a resident on another
    device (here ``meta``, which holds no values at all) gives the same bits. It used to
    reset the resident in place, drawing from the CUDA RNG on a GPU executor."""
    import torch

    cfg = load_config(None, [f"model.name={model}", "seed=3"])
    algo = build_method(cfg)
    shape = (1, 8, 8) if model != "resnet18" else (3, 8, 8)
    kw = {"width": 4} if model == "resnet18" else {}
    from fedray.models import build_model

    cpu = build_model(model, shape, 10, **kw)
    before = {k: v.clone() for k, v in cpu.state_dict().items()}
    a = algo.init_global_state(cpu, cfg.seed)
    b = algo.init_global_state(build_model(model, shape, 10, **kw).to("meta"), cfg.seed)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert all(torch.equal(v, before[k]) for k, v in cpu.state_dict().items())  # untouched
    c = algo.init_global_state(cpu, cfg.seed + 1)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
