"""Model registry, builders and FLOP/parameter profiling."""

import json
import math

import pytest
import torch
from torch import nn

from fedray.core.config import ConfigError
from fedray.models import MODELS, build_model, get_model_builder, list_models, profile_model
from fedray.models.resnet import group_norm

torch.set_num_threads(2)

SHAPES = [(1, 8, 8), (3, 32, 32), (64,), (784,)]


def test_resnet18_cifar100_exact_size_and_flops():
    profile = profile_model(build_model("resnet18", (3, 32, 32), 100), (3, 32, 32))
    assert profile["parameters"] == 11_220_132
    assert profile["trainable_parameters"] == 11_220_132
    assert round(profile["flops"] / 1e9, 3) == 1.111
    assert profile["input_shape"] == [3, 32, 32]


def test_mlp_784_256_10_parameters():
    model = build_model("mlp", (784,), 10)
    assert profile_model(model, (784,))["parameters"] == 784 * 256 + 256 + 256 * 10 + 10 == 203_530


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", SHAPES)
def test_every_model_builds_and_runs(name, shape):
    torch.manual_seed(0)
    kwargs = {"width": 8} if name.startswith("resnet") else {}
    builder = get_model_builder(name)
    only = getattr(builder, "channels", None)  # flair_resnet18: RGB images only
    if only is not None and (len(shape) != 3 or shape[0] != only):
        with pytest.raises(ValueError, match=f"{only} channels"):
            build_model(name, shape, 7, **kwargs)
        return
    model = build_model(name, shape, 7, **kwargs)
    tokens = getattr(builder, "token_ids", False)  # char_lstm: ids < 7
    out = model(torch.randint(0, 7, (2, *shape)).float() if tokens else torch.randn(2, *shape))
    per_token = getattr(builder, "per_token", False)  # next-token logits at every step
    assert out.shape == ((2, 7, math.prod(shape)) if per_token else (2, 7))
    assert torch.isfinite(out).all()


def test_image_models_reject_non_square_flat_input():
    for name in ("cnn", "lstm", "resnet18"):
        with pytest.raises(ValueError, match="perfect square"):
            build_model(name, (10,), 3)


def test_lstm_seq_len_splits_flat_input():
    model = build_model("lstm", (12,), 3, seq_len=4, hidden=5)
    assert model.lstm.input_size == 3
    assert model(torch.randn(2, 12)).shape == (2, 3)
    with pytest.raises(ValueError, match="does not divide"):
        build_model("lstm", (12,), 3, seq_len=5)


@pytest.mark.parametrize("channels, groups", [(12, 4), (6, 2), (64, 8), (3, 1), (8, 8)])
def test_group_norm_halves_groups_until_divisible(channels, groups):
    assert group_norm(channels).num_groups == groups


def test_flops_of_single_linear():
    assert profile_model(nn.Linear(10, 5), (10,))["flops"] == 2 * 10 * 5


def test_flops_of_tiny_conv_net():
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),           # 4x5x5 outputs, 2*3*3 MACs each
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, groups=2),  # 4x2x2 outputs, (4/2)*3*3 MACs each
        nn.Flatten(),
        nn.Linear(16, 3),                        # 16*3 MACs
    )
    expected = 2 * (4 * 5 * 5 * 2 * 9) + 2 * (4 * 2 * 2 * 2 * 9) + 2 * 16 * 3
    assert profile_model(model, (2, 5, 5))["flops"] == expected


def test_flops_of_lstm_counts_gate_matmuls_per_step():
    model = build_model("lstm", (6, 4), 3, hidden=5, layers=2)
    gates = 2 * 4 * 5 * (4 + 5) + 2 * 4 * 5 * (5 + 5)
    assert profile_model(model, (6, 4))["flops"] == 6 * gates + 2 * 5 * 3


def test_profile_restores_training_mode():
    model = build_model("cnn", (1, 8, 8), 3)
    profile_model(model, (1, 8, 8))
    assert model.training


def test_unknown_model_raises_config_error():
    with pytest.raises(ConfigError) as info:
        get_model_builder("vgg")
    assert info.value.path == "model.name"
    assert "resnet18" in info.value.allowed
    with pytest.raises(ConfigError, match=r"model\.name"):
        build_model("vgg", (784,), 10)


def test_list_models_is_json_serialisable():
    models = list_models()
    assert {m["name"] for m in models} == set(MODELS)
    assert all(m["description"] for m in models)
    mlp = next(m for m in models if m["name"] == "mlp")
    assert mlp["kwargs"] == {"hidden": [256], "activation": "relu"}
    json.dumps(models)


def test_the_pfl_cifar10_cnn_has_pfls_parameter_count():
    """pfl-research's simple_cnn on (32, 32, 3), 10 classes: 3x3x3x32 + 32, 3x3x32x64 + 64,
    (14 x 14 x 64) x 128 + 128, 128 x 10 + 10; Glorot-uniform weights; dropout in training
    only."""
    import torch

    from fedray.models import build_model

    model = build_model("pfl_cnn", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 1_626_442 == (
        27 * 32 + 32 + 9 * 32 * 64 + 64 + 14 * 14 * 64 * 128 + 128 + 128 * 10 + 10)
    w = model[0].weight
    bound = (6 / (3 * 9 + 32 * 9)) ** 0.5  # Glorot uniform: ±sqrt(6 / (fan_in + fan_out))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    model.eval()
    x = torch.rand(4, 3, 32, 32)
    assert torch.equal(model(x), model(x)) and model(x).shape == (4, 10)
    model.train()
    torch.manual_seed(0)
    assert not torch.equal(model(x), model(x))  # dropout


READ_ONLY_SCRIPT = """
import warnings
import numpy as np, torch
from torch import nn
from fedray.models.training import evaluate, get_state, train_local

gen = np.random.default_rng(0)
x = gen.standard_normal((40, 8)).astype(np.float32)
y = gen.integers(0, 3, 40)
ro_x, ro_y = x.copy(), y.copy()
ro_x.flags.writeable = ro_y.flags.writeable = False

def run(a, b):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3))
    train_local(model, a, b, epochs=2, batch_size=8, lr=0.1, seed=0, round=1, client=0)
    return get_state(model), evaluate(model, a, b, batch_size=16)

with warnings.catch_warnings():
    warnings.simplefilter("error")
    ro_state, ro_scores = run(ro_x, ro_y)
state, scores = run(x, y)
assert all(np.array_equal(ro_state[k], state[k]) for k in state), "states differ"
assert ro_scores == scores, (ro_scores, scores)
np.testing.assert_array_equal(ro_x, x)
print("ok")
"""


def test_training_on_a_read_only_client_array_is_quiet_and_the_same():
    """A client's arrays are read-only views of the memory-mapped population cache: local
    training and scoring on them raise no warning (torch's not-writable one, turned into an
    error here) and give what a writable copy gives. In a fresh interpreter, because torch
    warns only once per process."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", READ_ONLY_SCRIPT], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
