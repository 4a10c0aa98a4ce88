"""FLITE latent mapping (paper §3.3-3.4): orthonormal seed-derived factors, z = 0 is the
pretrained model, stored == regenerated, gradients reach only z, the averaging identity
(Eq. 4) on the paper's ResNet-18 setting, factors bit-identical across processes, bad input."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import ray
import torch
from ray import cloudpickle

from fedray.core.config import ConfigError
from fedray.core.seeding import derive_seed, rng
from fedray.methods.flite import (
    LatentMapping,
    LayerFactors,
    g_chunks,
    gram_cholesky,
    mapped_layers,
    stored_u,
    u_chunks,
    v_matrix,
)
from fedray.methods.flite import factors as flite_factors
from fedray.models import build_model

cloudpickle.register_pickle_by_value(sys.modules[__name__])
torch.set_num_threads(2)

SEED = 2**64 - 12345  # exercise the full 64-bit seed range


def seeded_model(*args, **kwargs) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(0, -1, -1, "test-model-init"))
        return build_model(*args, **kwargs).eval()


def small_resnet() -> torch.nn.Module:
    """ResNet-18 at width 8: 20 conv weights, P_l from 128 to 36,864."""
    return seeded_model("resnet18", (3, 16, 16), 10, width=8)


def images(n: int = 4, shape: tuple[int, ...] = (3, 16, 16)) -> torch.Tensor:
    return torch.from_numpy(rng(1, -1, -1, "test-images").standard_normal((n, *shape),
                                                                          dtype=np.float32))


def random_latent(D: int, purpose: str = "test-z") -> np.ndarray:
    return rng(2, -1, -1, purpose).standard_normal(D, dtype=np.float32)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture
def small_chunks(monkeypatch):
    """Force several G chunks per layer (the big layers then have up to 37 chunks)."""
    monkeypatch.setattr(flite_factors, "CHUNK_ROWS", 1000)


# ----------------------------------------------------------------------------- factors


def test_default_maps_every_conv_weight_of_resnet18():
    names = mapped_layers(build_model("resnet18", (3, 16, 16), 10, width=8))
    assert len(names) == 20 and all(n.endswith("weight") for n in names)
    assert sum("shortcut" in n for n in names) == 3


def test_factors_have_orthonormal_columns(small_chunks):
    mapping = LatentMapping(small_resnet(), d=16, r=8, seed=SEED)
    for m in mapping.maps:
        U, V = m.U.double(), m.V.double()
        assert U.shape == (m.factors.P, 8) and V.shape == (16, 8)
        eye = torch.eye(8, dtype=torch.float64)
        assert (U.T @ U - eye).abs().max() <= 1e-5, m.name
        assert (V.T @ V - eye).abs().max() <= 1e-5, m.name


def test_cholesky_factors_are_the_positive_diagonal_qr_of_the_streamed_gaussian():
    P, r, rows = 5000, 8, 1024
    G = np.concatenate([g for _, g in g_chunks(SEED, 3, P, r, rows)]).astype(np.float64)
    Q, R_qr = np.linalg.qr(G)
    signs = np.sign(np.diag(R_qr))
    Q, R_qr = Q * signs, R_qr * signs[:, None]
    R = gram_cholesky(SEED, 3, P, r, rows)
    U = stored_u(SEED, 3, P, r, chunk_rows=rows)
    assert np.allclose(R, R_qr, rtol=1e-10, atol=1e-10)
    assert np.abs(U - Q).max() <= 1e-6
    # one draw (stored_u) and streamed chunks (u_chunks) give the same bits
    streamed = np.concatenate([u for _, u in u_chunks(SEED, 3, P, r, R, rows)])
    assert np.array_equal(U, streamed)
    assert np.array_equal(stored_u(SEED, 3, P, r, R, rows), U)


# ----------------------------------------------------------------------------- mapping


@pytest.mark.parametrize("mode", ["stored", "regenerated"])
def test_zero_latent_is_exactly_the_pretrained_model(mode):
    model = small_resnet()
    x = images()
    with torch.no_grad():
        expected = model(x)
    mapping = LatentMapping(model, d=16, r=8, seed=SEED, mode=mode)
    assert torch.equal(mapping.latent_vector(), torch.zeros(mapping.D))
    with torch.no_grad():
        assert torch.equal(mapping(x), expected)
    params = dict(model.named_parameters())
    for name, w in mapping.generated_weights().items():
        assert torch.equal(w, params[name])


def test_stored_and_regenerated_agree_in_outputs_and_gradients(small_chunks):
    model = small_resnet()
    x = images()
    z = random_latent(16 * 20)
    out, grads = {}, {}
    for mode in ("stored", "regenerated"):
        mapping = LatentMapping(model, d=16, r=8, seed=SEED, mode=mode)
        mapping.set_latent_vector(z)
        y = mapping(x)
        y.square().mean().backward()
        out[mode] = y.detach()
        grads[mode] = torch.cat([p.grad for p in mapping.latent_parameters()])
    assert rel_err(out["regenerated"], out["stored"]) <= 1e-5
    assert rel_err(grads["regenerated"], grads["stored"]) <= 1e-5
    assert grads["stored"].norm() > 0
    # the latent moved the model: the comparison is not between two copies of θ^pre
    with torch.no_grad():
        assert rel_err(out["stored"], model(x)) > 1e-2


def test_bf16_autocast_trains_both_modes_with_fp32_generated_weights(small_chunks):
    """``local.bf16=true`` autocasts the forward; the regenerated mode used to crash in its
    backward ("addmv input tensors must have the same dtype"). The generated weights stay
    fp32 master weights (bf16 only in the convolutions), so both modes still agree."""
    model = small_resnet()
    x = images()
    z = random_latent(16 * 20)
    grads, outs = {}, {}
    for mode in ("stored", "regenerated"):
        mapping = LatentMapping(model, d=16, r=8, seed=SEED, mode=mode)
        mapping.set_latent_vector(z)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            y = mapping(x)
            weights = mapping.generated_weights()
        assert y.dtype == torch.bfloat16
        assert all(w.dtype == torch.float32 for w in weights.values())
        y.float().square().mean().backward()
        outs[mode] = y.detach().float()
        grads[mode] = torch.cat([p.grad for p in mapping.latent_parameters()])
        assert all(p.grad.dtype == torch.float32 for p in mapping.latent_parameters())
        assert torch.isfinite(grads[mode]).all() and grads[mode].norm() > 0
    # bf16 convolutions: the modes' fp32 weights (equal to ~1e-7) agree to bf16's precision
    assert rel_err(outs["regenerated"], outs["stored"]) <= 2e-2
    cos = torch.nn.functional.cosine_similarity(grads["regenerated"], grads["stored"], dim=0)
    assert cos > 0.95


@pytest.mark.parametrize("mode", ["stored", "regenerated"])
def test_gradients_reach_only_the_latents(mode):
    model = small_resnet()
    mapping = LatentMapping(model, d=16, r=8, seed=SEED, mode=mode)
    mapping.set_latent_vector(random_latent(mapping.D))
    mapping(images()).logsumexp(1).sum().backward()
    assert all(not p.requires_grad and p.grad is None for p in model.parameters())
    assert all(not b.requires_grad for b in mapping.buffers())
    trainable = [p for p in mapping.parameters() if p.requires_grad]
    assert len(trainable) == 20 and all(p.grad is not None for p in trainable)
    assert sum(p.numel() for p in trainable) == mapping.D == 320


def test_latent_vector_round_trip_and_layout():
    model = small_resnet()
    mapping = LatentMapping(model, d={n: 8 + 4 * (i % 2) for i, n in
                                      enumerate(mapped_layers(model))}, r=8, seed=SEED)
    layout = mapping.latent_layout()
    assert [n for n, _ in layout] == mapped_layers(model)
    assert mapping.D == sum(d for _, d in layout) == 10 * 8 + 10 * 12
    assert mapping.num_mapped_parameters == sum(p.numel() for n, p in model.named_parameters()
                                                if n in dict(layout))
    z = random_latent(mapping.D)
    mapping.set_latent_vector(z)
    assert np.array_equal(mapping.latent_vector().numpy(), z)
    with pytest.raises(ValueError, match="shape"):
        mapping.set_latent_vector(z[:-1])


def test_averaging_identity_on_resnet18_cifar100():
    """The paper's setting: ResNet-18/GN, CIFAR-100 shapes, d = 64, r = 32 -> D = 1280."""
    model = seeded_model("resnet18", (3, 32, 32), 100)
    mapping = LatentMapping(model, d=64, r=32, seed=SEED, mode="stored")
    assert len(mapping.maps) == 20 and mapping.D == 1280
    assert mapping.num_mapped_parameters == 11_159_232
    latents = rng(3, -1, -1, "test-averaging").standard_normal((8, mapping.D),
                                                               dtype=np.float32)
    mean_of_weights: dict[str, torch.Tensor] = {}
    for z in latents:
        for name, w in mapping.generated_weights(z).items():
            mean_of_weights[name] = mean_of_weights.get(name, 0) + w / len(latents)
    weights_of_mean = mapping.generated_weights(latents.mean(0))
    err = max((mean_of_weights[n] - weights_of_mean[n]).abs().max().item()
              for n in weights_of_mean)
    assert err <= 1e-6


@pytest.mark.ray
def test_factors_bit_identical_in_separate_processes(ray_session):
    @ray.remote(num_cpus=0.5)
    class FactorBuilder:
        def build(self, seed: int, index: int, P: int, d: int, r: int):
            import os

            f = LayerFactors(seed, index, P, d, r)
            R = f.gram_cholesky()
            return os.getpid(), R, f.v(), f.stored_u(R)

    P, d, r = 128 * 64 * 9, 64, 32  # 73,728 rows: three chunks of 32,768
    a, b = FactorBuilder.remote(), FactorBuilder.remote()
    (pid_a, *fa), (pid_b, *fb) = ray.get([a.build.remote(SEED, 5, P, d, r),
                                          b.build.remote(SEED, 5, P, d, r)])
    assert pid_a != pid_b
    R = gram_cholesky(SEED, 5, P, r)
    local = [R, v_matrix(SEED, 5, d, r), stored_u(SEED, 5, P, r, R)]
    for x, y, z in zip(fa, fb, local, strict=True):
        assert x.dtype == y.dtype == z.dtype and x.tobytes() == y.tobytes() == z.tobytes()
    ray.kill(a)
    ray.kill(b)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, path", [
    ({"d": 8, "r": 16}, "algorithm.r"),
    ({"d": 0, "r": 4}, "algorithm.d"),
    ({"d": -3, "r": 4}, "algorithm.d"),
    ({"d": 16, "r": 0}, "algorithm.r"),
    ({"d": 16, "r": 8, "layers": ["layer4.*.weight"]}, "algorithm.layers"),
    ({"d": 256, "r": 200, "layers": ["5.shortcut.0.weight"]}, "algorithm.r"),  # r > P = 128
    ({"d": {"0.weight": 16}, "r": 8}, "algorithm.d"),
    ({"d": 16, "r": 8, "mode": "dense"}, "algorithm.mode"),
    ({"d": 16, "r": 8, "seed": -1}, "algorithm.factor_seed"),
    ({"d": 16, "r": 8, "seed": 2**64}, "algorithm.factor_seed"),
])
def test_bad_input_names_the_field(kwargs, path):
    kwargs = {"seed": 0, **kwargs}
    with pytest.raises(ConfigError) as err:
        LatentMapping(small_resnet(), **kwargs)
    assert err.value.path == path


def test_r_greater_than_d_message_names_d():
    with pytest.raises(ConfigError, match="at most algorithm.d = 8"):
        LatentMapping(small_resnet(), d=8, r=16, seed=0)
