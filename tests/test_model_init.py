"""A model's start θ₀ is proved whole (fedray.models.init): every parameter written by an
initialiser under the run's seed, private initialisers (nn.MultiheadAttention) included,
and a model that leaves one unwritten refused in one line before Ray."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from test_hostile_inputs import one_json, run_cli
from torch import nn

from fedray.core import registry
from fedray.core.seeding import torch_seeded
from fedray.models import build_model
from fedray.models.init import UnwrittenTensor, check_initial_state, initial_state
from fedray.models.training import get_state

SHAPES = {"mlp": ((1, 8, 8), 10, {}), "cnn": ((1, 28, 28), 10, {}),
          "leaf_cnn": ((1, 28, 28), 62, {"dense": 64}), "pfl_cnn": ((3, 32, 32), 10, {}),
          "lstm": ((12, 4), 5, {}), "char_lstm": ((20,), 30, {"vocab": 30, "hidden": 32}),
          "sent140_lstm": ((25,), 2, {"vocab": 50, "embed": 8, "hidden": 8}),
          "word_lstm": ((20,), 10004, {"hidden": 16}),
          "next_char_lstm": ((20,), 90, {"hidden": 16}),
          "resnet18": ((3, 32, 32), 10, {}), "resnet34": ((3, 32, 32), 10, {}),
          "flair_resnet18": ((3, 32, 32), 17, {}),
          "sliceable_resnet18": ((3, 32, 32), 10, {}),
          "sliceable_resnet34": ((3, 32, 32), 10, {})}


def earlier_start(model, seed):
    """θ₀ as fedray drew it before the check: each module's public reset_parameters, in
    module order, on emptied storage."""
    fresh = copy.deepcopy(model).to_empty(device="cpu")
    with torch_seeded(seed, -1, -1, "model-init"):
        for m in fresh.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    return get_state(fresh)


def test_every_registered_model_is_covered():
    assert set(SHAPES) == set(registry.MODELS), set(registry.MODELS) ^ set(SHAPES)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_registered_models_start_where_they_did(name):
    """The check changes no registered model's θ₀: bit for bit the earlier start."""
    shape, classes, kwargs = SHAPES[name]
    model = build_model(name, shape, classes, **kwargs)
    got, want = initial_state(model, 5), earlier_start(model, 5)
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    check_initial_state(lambda: build_model(name, shape, classes, **kwargs), 5)


class Tabular(nn.Module):
    """The issue's plugin: two nn.TransformerEncoder layers over 13 feature tokens."""

    def __init__(self, classes=3):
        super().__init__()
        self.embed = nn.Linear(1, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, classes)
        self.register_buffer("position", torch.arange(13.0)[None, :, None] / 13)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x[..., None]) + self.position).mean(1))


def test_a_private_initialiser_writes_attention_weights_the_same_every_time():
    """nn.MultiheadAttention has only ``_reset_parameters``: its in_proj_weight is drawn
    (Xavier-uniform, bounded by √(6 / (fan_in + fan_out))) the same on every call, and its
    biases are zero; a buffer no initialiser writes keeps its constructor's value."""
    a, b = initial_state(Tabular(), 7), initial_state(Tabular(), 7)
    other = initial_state(Tabular(), 8)
    w = "encoder.layers.0.self_attn.in_proj_weight"
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a[w], other[w])
    assert np.abs(a[w]).max() <= math.sqrt(6 / (16 + 48)) and np.abs(a[w]).max() > 0.1
    assert not a["encoder.layers.0.self_attn.in_proj_bias"].any()
    assert not a["encoder.layers.1.self_attn.out_proj.bias"].any()
    assert np.array_equal(a["position"], np.arange(13.0, dtype=np.float32)[None, :, None] / 13)
    check_initial_state(Tabular, 7)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.scale = nn.Parameter(torch.ones(2))  # no initialiser writes it

    def forward(self, x):
        return self.linear(x.flatten(1)[:, :4]) * self.scale


class RandomBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("projection", torch.randn(4, 4))

    def forward(self, x):
        return self.linear(x.flatten(1)[:, :4] @ self.projection)


def test_a_tensor_no_initialiser_writes_is_named():
    with pytest.raises(UnwrittenTensor, match=r"^parameter scale of Scaled is left "):
        initial_state(Scaled(), 0)
    with pytest.raises(UnwrittenTensor, match=r"^buffer \(drawn at random by its constructor"
                                              r"\) projection of RandomBuffer"):
        check_initial_state(RandomBuffer, 0)


@pytest.fixture
def scaled_model():
    def scaled(input_shape, num_classes, *, hidden: tuple[int, ...] = (8,)):
        """A linear layer times a parameter no initialiser writes (test only)."""
        return Scaled()

    registry.MODELS["scaled"] = scaled
    yield "scaled"
    registry.MODELS.pop("scaled")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_unwritten_parameter_is_one_cli_line_before_ray(scaled_model, tmp_path, as_json):
    run_dir = tmp_path / "run"
    rc, out, err = run_cli(["run", "fedray/configs/fedavg_digits.yaml", "-s",
                            f"model.name={scaled_model}", "-o", str(run_dir),
                            *(["--json"] if as_json else [])])
    text = one_json(out)["error"] if as_json else \
        "\n".join(line for line in err.splitlines() if line.startswith("error: "))
    assert rc == 2 and len(text.splitlines()) == 1, (rc, out, err)
    assert "model.name" in text and "parameter scale of Scaled" in text
    assert not run_dir.exists()
