"""Which coordinates of the full model a sub-model holds, and moving tensors between the two.

Every dimension of every parameter of :class:`fedray.models.sliceable.SliceableResNet`
indexes one named channel axis — ``s{k}`` (stream of stage k), ``h{j}`` (hidden of block j)
— or is never cut (image channels, classes, kernel taps). A :class:`Selection` maps each
axis to the channel indices a sub-model keeps: leading prefixes for Ordered Dropout,
HeteroFL and the depth/shortcut axes; a window rolled by the round for FedRolex. Gathering
the full state through a selection gives the sub-model's compact state (what travels);
the aggregation scatters compact updates back coordinate by coordinate.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from fedray.core.seeding import rng
from fedray.models.geometry import Arch, Geometry

Selection = dict[str, np.ndarray]
Shapes = tuple[tuple[str, tuple[int, ...]], ...]
Rule = Literal["prefix", "rolling"]


def in_network(name: str) -> bool:
    """Whether ``name`` is a parameter of the network (else an extra, e.g. BiC's)."""
    return name.split(".")[0] in ("stem", "blocks", "fc", "exits")


def param_axes(arch: Arch, name: str, ndim: int) -> tuple[str | None, ...]:
    """The channel axis of each dimension of parameter ``name``; tensors outside the network
    (e.g. BiC's per-class correction) are never cut."""
    parts = name.split(".")
    if not in_network(name):
        return (None,) * ndim
    if parts[0] == "stem":
        return ("s0", None, None, None) if parts[1] == "conv" else ("s0",)
    if parts[0] in ("fc", "exits"):
        stage = len(arch.blocks) - 1 if parts[0] == "fc" else int(parts[1])
        return (None, f"s{stage}") if parts[-1] == "weight" else (None,)
    j = int(parts[1])
    out, inp = f"s{arch.stage_of[j]}", f"s{arch.stage_of[j - 1] if j else 0}"
    layer, kind = parts[2], parts[-1]
    if layer == "conv1":
        return (f"h{j}", inp, None, None)
    if layer == "norm1":
        return (f"h{j}",)
    if layer == "conv2":
        return (out, f"h{j}", None, None)
    if layer == "norm2":
        return (out,)
    if parts[3] == "conv":  # shortcut.conv
        return (out, inp, None, None)
    assert kind in ("weight", "bias"), name
    return (out,)


def selection(arch: Arch, g: Geometry, rule: Rule = "prefix", round: int = 0) -> Selection:
    """Channel indices per axis: ``prefix`` keeps the leading channels; ``rolling``
    (FedRolex) keeps ``(round + i) mod C`` for i < width, C the axis' full width."""
    full = arch.full()
    sizes = {f"s{k}": (w, full.stream[k]) for k, w in enumerate(g.stream)}
    sizes |= {f"h{j}": (h, full.hidden[j]) for j, h in enumerate(g.hidden)}
    if rule == "prefix":
        return {a: np.arange(w) for a, (w, _) in sizes.items()}
    if rule == "rolling":
        return {a: (round + np.arange(w)) % c for a, (w, c) in sizes.items()}
    raise ValueError(f"rule must be 'prefix' or 'rolling', got {rule!r}")


def _index(axes: tuple[str | None, ...], shape: tuple[int, ...], sel: Selection,
           size: tuple[int, ...]) -> tuple:
    """Basic slices where the kept indices are a leading prefix, else an open mesh."""
    idx = []
    for a, n, full in zip(axes, size, shape, strict=True):
        if a is None:
            idx.append(np.arange(full))
        else:
            idx.append(sel[a][:n])
    if all(len(i) == 0 or (i[0] == 0 and i[-1] == len(i) - 1) for i in idx):
        return tuple(slice(0, len(i)) for i in idx)
    return np.ix_(*idx)


def gather(arch: Arch, hw: tuple[int, int], full_state: dict[str, np.ndarray], g: Geometry,
           sel: Selection, shapes: Shapes | None = None) -> dict[str, np.ndarray]:
    """The compact state of sub-model ``g``: each held tensor cut out of the full state.
    ``shapes`` is ``held(arch, hw, g)`` when the caller has it (the server does: it then needs
    no torch); else it is measured here."""
    if shapes is None:
        from fedray.models.sliceable import held

        shapes = held(arch, hw, g)
    out = {}
    for name, shape in shapes:
        t = full_state[name]
        out[name] = np.ascontiguousarray(t[_index(param_axes(arch, name, t.ndim), t.shape, sel,
                                                  shape)])
    out |= {name: t.copy() for name, t in full_state.items() if not in_network(name)}
    return out


def scatter_add(arch: Arch, target: dict[str, np.ndarray], compact: dict[str, np.ndarray],
                sel: Selection, scale: float = 1.0) -> None:
    """``target[coords] += scale * compact`` for every tensor of ``compact``."""
    for name, v in compact.items():
        t = target[name]
        t[_index(param_axes(arch, name, t.ndim), t.shape, sel, v.shape)] += scale * v


def fiarse_masks(state: dict[str, np.ndarray], keep: float) -> dict[str, np.ndarray]:
    """FIARSE's importance mask: per conv/linear weight (ndim ≥ 2) of ``state``, the
    ``ceil(keep · size)`` entries of largest magnitude (ties by position: a stable sort, so
    server and client draw the same mask from the same weights). Empty at keep = 1."""
    if keep >= 1:
        return {}
    out = {}
    for k, v in state.items():
        v = np.asarray(v)
        if v.ndim < 2 or k.startswith("bic."):
            continue
        n = int(np.ceil(keep * v.size))
        order = np.argsort(-np.abs(v.reshape(-1)), kind="stable")[:n]
        m = np.zeros(v.size, bool)
        m[order] = True
        out[k] = m.reshape(v.shape)
    return out


def od_choices(seed: int, round: int, client: int, steps: int, options: int) -> np.ndarray:
    """Ordered Dropout: the index of the sub-model each local step samples, uniform over the
    ``options`` nested sub-models the client's tier contains; step t's draw is a function
    of (seed, round, client, t) alone."""
    return rng(seed, round, client, "ordered-dropout").integers(0, options, size=steps)
