"""Parameter and FLOP counts of a model, measured with one forward pass.

FLOPs are counted for a single input (batch 1) by hooking the modules that dominate the
cost, so the numbers match what the model actually runs rather than a hand-written formula.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def _conv_flops(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> int:
    """2 FLOPs per multiply-add: every output element sums ``in/groups * kernel`` products."""
    per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
    return 2 * output.numel() * per_output


def _linear_flops(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> int:
    """2 FLOPs per multiply-add over every row the layer is applied to."""
    return 2 * output.numel() * module.in_features


def _lstm_flops(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> int:
    """Gate matmuls only: ``2 * 4 * hidden * (input + hidden)`` per layer, direction and step."""
    x = inputs[0]
    if isinstance(x, nn.utils.rnn.PackedSequence):
        steps = x.data.shape[0]  # (sample, step) pairs actually processed
    elif x.dim() == 2:  # unbatched (T, F)
        steps = x.shape[0]
    else:
        steps = x.shape[0] * x.shape[1]  # (B, T) or (T, B): the product is the same
    directions = 2 if module.bidirectional else 1
    hidden = module.hidden_size
    total = 0
    for layer in range(module.num_layers):
        in_features = module.input_size if layer == 0 else hidden * directions
        total += 2 * 4 * hidden * (in_features + hidden) * directions
    return total * steps


_COUNTERS = {
    nn.Conv1d: _conv_flops,
    nn.Conv2d: _conv_flops,
    nn.Conv3d: _conv_flops,
    nn.Linear: _linear_flops,
    nn.LSTM: _lstm_flops,
}


@torch.no_grad()
def count_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward FLOPs of ``model`` for one input of ``input_shape`` (batch 1).

    Counted, at 2 FLOPs per multiply-add: ``Conv1d/2d/3d`` (grouped convs included) and
    ``Linear``; ``nn.LSTM`` as its gate matmuls, ``2 * 4 * hidden * (input + hidden)`` per
    layer, direction and time step. Bias adds, normalisation, activations, pooling and the
    LSTM's element-wise gate arithmetic are not counted. A module called several times is
    counted every time. The model is run in eval mode and its training flag restored after.
    """
    total = 0
    handles = []

    def make_hook(counter):
        def hook(module, inputs, output):
            nonlocal total
            total += counter(module, inputs, output)
        return hook

    for module in model.modules():
        for kind, counter in _COUNTERS.items():
            if isinstance(module, kind):  # subclasses (e.g. sliced convs) count too
                handles.append(module.register_forward_hook(make_hook(counter)))
                break
    was_training = model.training
    try:
        model.eval()
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        model(torch.zeros(1, *input_shape, device=device))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return total


def profile_model(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, Any]:
    """Parameter counts and forward FLOPs (batch 1, see :func:`count_flops`) of ``model``."""
    input_shape = tuple(int(d) for d in input_shape)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "flops": count_flops(model, input_shape),
        "input_shape": list(input_shape),
    }
