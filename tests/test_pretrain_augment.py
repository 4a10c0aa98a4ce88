"""``pretrain.augment``: the FLITE paper's crop+flip for the pretrained base (App. 0.C)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.core.config import ConfigError, load_config
from fedray.core.seeding import torch_generator
from fedray.models.pretrain import load_base, pretrain
from fedray.models.training import random_crop_flip


def test_crop_flip_is_a_seeded_shifted_possibly_mirrored_window_of_the_padded_image():
    x = torch.arange(2 * 3 * 6 * 5, dtype=torch.float32).reshape(2, 3, 6, 5) + 1
    a = random_crop_flip(x, torch_generator(0, 1, -1, "t"), pad=2)
    b = random_crop_flip(x, torch_generator(0, 1, -1, "t"), pad=2)
    assert a.shape == x.shape and torch.equal(a, b)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):
        windows = [padded[i, :, dy:dy + 6, dx:dx + 5] for dy in range(5) for dx in range(5)]
        windows += [w.flip(-1) for w in windows]
        assert any(torch.equal(a[i], w) for w in windows)
    draws = {random_crop_flip(x, torch_generator(0, r, -1, "t"), pad=2).sum().item()
             for r in range(8)}
    assert len(draws) > 1


def test_pretrain_with_augment_runs_differs_and_refuses_non_images(tmp_path):
    common = ["data.dataset=digits", "data.image_size=8", "model.name=cnn",
              "model.channels=[4,8]", "model.hidden=16", "pretrain.epochs=1",
              "pretrain.batch_size=64", "pretrain.warmup_epochs=0", "pretrain.fraction=0.3"]
    pretrain(load_config(None, common), str(tmp_path / "plain"), progress=False)
    pretrain(load_config(None, common + ["pretrain.augment=true"]), str(tmp_path / "aug"),
             progress=False)
    plain, aug = load_base(str(tmp_path / "plain"))[0], load_base(str(tmp_path / "aug"))[0]
    assert any(not np.array_equal(plain[k], aug[k]) for k in plain)
    with pytest.raises(ConfigError, match="pretrain.augment"):
        pretrain(load_config(None, ["data.dataset=synthetic", "model.name=mlp",
                                    "pretrain.epochs=1", "pretrain.augment=true"]),
                 str(tmp_path / "syn"), progress=False)
