"""A model's start θ₀, drawn from the run's seed alone and proved whole.

fedray does not keep the values a model's constructor drew (they come from torch's global
generator, different in every process): it empties the model's storage and runs each
module's own initialiser under the seed. An initialiser that is missing or partial would
leave uninitialised memory in θ₀ — different on every call, often huge or NaN — so every
parameter and buffer is first filled with a sentinel (NaN; an integer's minimum) and a
parameter still holding it afterwards is refused, naming the module and the tensor.

A module's initialiser is its public ``reset_parameters``, or the private
``_reset_parameters`` that ``nn.MultiheadAttention`` and ``nn.Transformer`` call from their
constructors. They run children first, a parent last, as in construction: a parent's
initialiser (``nn.Transformer``'s Xavier draw) has the last word over its children's, and
``nn.MultiheadAttention`` zeroes its ``out_proj`` bias after ``nn.Linear`` drew it.

A buffer no initialiser writes (a positional table computed in ``__init__``) keeps the value
its constructor gave it; :func:`check_initial_state` proves, before Ray starts, that such a
value does not depend on torch's generator.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

__all__ = ["UnwrittenTensor", "check_initial_state", "initial_state", "initialisers"]


class UnwrittenTensor(ValueError):
    """A parameter or buffer that no initialiser wrote; ``name`` is its dotted path."""

    def __init__(self, name: str, module: nn.Module, kind: str):
        self.name = name
        super().__init__(
            f"{kind} {name} of {type(module).__name__} is left unwritten by its module's "
            f"initialisers (reset_parameters or _reset_parameters): give "
            f"{type(module).__name__} a reset_parameters that writes it")


def initialisers(model: nn.Module) -> Iterator[Callable[[], None]]:
    """Each module's own initialiser, children before their parent."""
    for child in model.children():
        yield from initialisers(child)
    own = getattr(model, "reset_parameters", None) or getattr(model, "_reset_parameters", None)
    if callable(own):
        yield own


def _sentinel(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(False)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


def _unwritten(t: torch.Tensor) -> bool:
    if t.is_floating_point() or t.is_complex():
        return bool(torch.isnan(t).any())
    if t.dtype == torch.bool:
        return False  # no sentinel a bool can hold apart from a written value
    return bool((t == torch.iinfo(t.dtype).min).any())


def _owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rpartition(".")[0])


def _initialised(model: nn.Module, seed: int) -> tuple[nn.Module, list[str]]:
    """A copy of ``model`` on emptied, sentinel-filled CPU storage after every initialiser
    ran under ``(seed, "model-init")``, and the buffers none wrote; raises
    :class:`UnwrittenTensor` for a parameter none wrote."""
    from fedray.core.seeding import torch_seeded

    fresh = copy.deepcopy(model).to_empty(device="cpu")
    with torch.no_grad():
        for t in [*fresh.parameters(), *fresh.buffers()]:
            _sentinel(t)
    with torch_seeded(seed, -1, -1, "model-init"):
        for reset in initialisers(fresh):
            reset()
    for name, p in fresh.named_parameters():
        if _unwritten(p):
            raise UnwrittenTensor(name, _owner(fresh, name), "parameter")
    return fresh, [name for name, b in fresh.named_buffers() if _unwritten(b)]


def initial_state(model: nn.Module, seed: int) -> dict[str, np.ndarray]:
    """θ₀ of ``model``'s architecture for ``seed``: its state (float32 numpy arrays, as
    :func:`fedray.models.training.get_state` gives) after every initialiser
    (:func:`initialisers`) ran on emptied storage under ``(seed, "model-init")``, on the
    CPU, so the start is the same on every device and in every process. Raises
    :class:`UnwrittenTensor` for a parameter no initialiser wrote; a buffer none wrote
    keeps ``model``'s own value (its constructor's)."""
    from fedray.models.training import get_state

    fresh, kept = _initialised(model, seed)
    with torch.no_grad():
        for name in kept:
            fresh.get_buffer(name).copy_(model.get_buffer(name))
    return get_state(fresh)


def check_initial_state(build: Callable[[], nn.Module], seed: int) -> None:
    """Before Ray: :func:`initial_state` of the model ``build`` makes succeeds, and a buffer
    no initialiser writes comes out of the constructor the same under two different torch
    seeds (a constructor that draws it at random would give every process another θ₀).
    Raises :class:`UnwrittenTensor` naming the first tensor at fault."""
    from fedray.core.seeding import torch_seeded

    model = build()
    fresh, kept = _initialised(model, seed)
    if not kept:
        return
    with torch_seeded(seed, -1, -1, "constructor-check"):
        other = build()
    for name in kept:
        if not torch.equal(model.get_buffer(name), other.get_buffer(name)):
            raise UnwrittenTensor(name, _owner(fresh, name),
                                  "buffer (drawn at random by its constructor)")
