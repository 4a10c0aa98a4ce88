"""FedProx (Li et al., 2020): FedAvg whose local objective adds (μ/2)‖θ − θ_t‖².

The proximal term enters as its gradient μ(θ − θ_t), added to each parameter's gradient
before the optimizer step — the same update as differentiating the augmented loss, without
building the extra graph. Server side is FedAvg's (sample-weighted, server learning rate).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedray.core.registry import register_method
from fedray.core.spec import spec
from fedray.methods.fedavg.method import FedAvg, FedAvgParams


@register_method
class FedProx(FedAvg):
    """FedAvg with a proximal term μ/2‖θ − θ_global‖² on every client."""

    name = "fedprox"

    @dataclass
    class Params(FedAvgParams):
        mu: float = spec(0.01, ge=0, help="proximal coefficient μ")

    def correction(self, model, broadcast, device):
        """g += μ(θ − θ_t), the gradient of the proximal term (Li et al. 2020, eq. 2)."""
        import torch

        mu = self.params.mu
        anchors = [torch.from_numpy(broadcast[n]).to(device) for n in self.trainable(model)]

        def fix(params, own):
            for p, a in zip(params, anchors, strict=True):
                p.grad.add_(p.detach() - a, alpha=mu)

        return fix
