"""Classifier heads for fine-tuning (FLITE §3.5)."""

import torch

from fedray.models import build_model
from fedray.models.heads import classifier, configure_head, head_parameter_names


def test_orthogonal_kaiming_trainable_heads():
    for mode in ["orthogonal", "kaiming", "trainable"]:
        m = configure_head(build_model("resnet18", (3, 16, 16), 10, width=8), mode, seed=3)
        head = classifier(m)
        frozen = not head.weight.requires_grad
        assert frozen == (mode != "trainable")
        assert all(p.requires_grad for n, p in m.named_parameters()
                   if n not in head_parameter_names(m))
        if mode == "orthogonal":
            w = head.weight
            assert torch.allclose(w @ w.T, torch.eye(10), atol=1e-5)
            assert torch.equal(head.bias, torch.zeros(10))
    a = classifier(configure_head(build_model("mlp", (64,), 10), "kaiming", seed=1)).weight
    b = classifier(configure_head(build_model("mlp", (64,), 10), "kaiming", seed=1)).weight
    c = classifier(configure_head(build_model("mlp", (64,), 10), "kaiming", seed=2)).weight
    assert torch.equal(a, b) and not torch.equal(a, c)
