"""The shared budget ladder: one sub-model geometry per budget ρ, for each reduction axis.

``dual`` (DROD, §2): s = ρ^((1−θ)/2), b = ρ^θ; s snapped to a multiple of 1/64 (every stage
width integral), then b refit so the measured whole-network ratio (parameters or FLOPs) is
as close to ρ as the integral hidden widths allow (footnote 5: the stem, the downsample convs
and the classifier lie outside the branch axis, so the closed form's b misses ρ). At θ = 0
b stays 1: that endpoint *is* width slicing (FjORD), not a refit of it.
``width`` (FjORD / HeteroFL / FedRolex): b = 1 and s on the 1/64 grid closest to ρ.
``shortcut`` (shortcut-tiering, §2): droppable blocks become identities deepest first; when
dropping all of them still exceeds ρ (ResNet-18 keeps 44 % of its parameters, footnote 4),
the stream is narrowed on the 1/64 grid as well — our choice, which reproduces the paper's
76.1 % / 93.7 % parameter savings for this row. ``depth`` (DepthFL): the leading blocks and
their stage's exit head. ``scalefl`` (ScaleFL, Ilhan et al. 2023): width and depth cut at one
equal ratio r = ρ^(1/3), the stream snapped to 1/64 and depth = round(r · blocks): FLOPs scale
as width² × depth and a ResNet spreads them evenly over its stages, so the FLOP ratio lands
near ρ (ResNet-18: 0.244 / 0.064), while the parameter ratio falls far below (0.057 / 0.006:
the deep blocks hold most weights). ScaleFL's own split, *not* matched on either budget (the
DROD paper's ‡ row sits on neither ladder; its mid tier holds 65 % of the parameters, a split
it does not state — ours is a documented choice; measured ratios are reported).

Every ratio is counted from the sub-model's geometry (:func:`fedray.models.geometry.count`,
equal to building it and running an input through it, :func:`fedray.models.sliceable.measure`);
each axis picks the candidate whose measured ratio is closest to ρ.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Literal

from fedray.models.geometry import Arch, Geometry, count

AXES = ("dual", "width", "shortcut", "depth", "scalefl")
Axis = Literal["dual", "width", "shortcut", "depth", "scalefl"]
Match = Literal["params", "flops"]
SNAP = 64
DEFAULT_BUDGETS = (1.0, 0.251, 0.064)


@dataclass(frozen=True)
class Rung:
    """One tier's sub-model on the ladder and what it measures."""

    budget: float
    axis: str
    s: float
    b: float
    dropped: tuple[int, ...]
    geometry: Geometry
    parameters: int
    flops: int
    param_ratio: float
    flop_ratio: float

    def to_dict(self) -> dict:
        out = asdict(self)
        out["geometry"] = self.geometry.to_dict()
        out["dropped"] = list(self.dropped)
        return out


def check_budget(rho: float, theta: float = 0.0) -> None:
    if not 0 < rho <= 1:
        raise ValueError(f"budget ρ must lie in (0, 1], got {rho}")
    if not 0 <= theta <= 1:
        raise ValueError(f"θ must lie in [0, 1], got {theta}")


def snap(s: float) -> float:
    """``s`` rounded to the nearest multiple of 1/64 (at least 1/64)."""
    return max(1, round(s * SNAP)) / SNAP


@functools.lru_cache(maxsize=4096)
def _measured(arch: Arch, hw: tuple[int, int], g: Geometry, flops: bool) -> dict[str, int]:
    return count(arch, hw, g, flops=flops)


def _ratio(arch: Arch, hw: tuple[int, int], g: Geometry, match: Match) -> float:
    key = "flops" if match == "flops" else "parameters"
    full = _measured(arch, hw, arch.full(), match == "flops")[key]
    return _measured(arch, hw, g, match == "flops")[key] / full


def _closest(cands: list, rho: float, ratio) -> object:
    return min(cands, key=lambda c: (abs(ratio(c) - rho), -ratio(c)))


def _fit_b(arch: Arch, hw: tuple[int, int], s: float, rho: float, match: Match,
           hidden_zero: tuple[int, ...] = ()) -> float:
    """The b in (0, 1] whose measured ratio at stream ratio ``s`` is closest to ρ (the ratio
    is a non-decreasing step function of b: bisect to its step at ρ, keep the closer side)."""
    def geo(b: float) -> Geometry:
        return arch.geometry(s, tuple(0.0 if j in hidden_zero else b
                                      for j in range(arch.num_blocks)))

    def r(b: float) -> float:
        return _ratio(arch, hw, geo(b), match)

    lo, hi = 1e-6, 1.0
    if r(hi) <= rho:
        return hi
    if r(lo) >= rho:
        return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        if r(mid) < rho:
            lo = mid
        else:
            hi = mid
        if geo(lo) == geo(hi):
            break
    best = _closest([lo, hi], rho, r)
    return 1.0 if geo(best) == geo(1.0) else best


def solve_rung(arch: Arch, hw: tuple[int, int], rho: float, axis: Axis = "dual",
               theta: float = 0.5, match: Match = "params") -> Rung:
    """The sub-model of budget ρ on ``axis`` (θ only matters for ``dual``)."""
    check_budget(rho, theta)
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
    grid = [k / SNAP for k in range(1, SNAP + 1)]
    s, b, dropped, depth = 1.0, 1.0, (), arch.num_blocks

    def ratio_s(v: float, drop: tuple[int, ...] = ()) -> float:
        bs = tuple(0.0 if j in drop else 1.0 for j in range(arch.num_blocks))
        return _ratio(arch, hw, arch.geometry(v, bs), match)

    if rho == 1.0:
        pass
    elif axis == "dual":
        s = snap(rho ** ((1 - theta) / 2))
        b = 1.0 if theta == 0 else _fit_b(arch, hw, s, rho, match)  # θ = 0: width slicing
    elif axis == "width":
        s = _closest(grid, rho, ratio_s)
    elif axis == "shortcut":
        order = arch.droppable()
        options = [tuple(order[:k]) for k in range(len(order) + 1)]
        reach = [d for d in options if ratio_s(1.0, d) <= rho]
        if reach:
            k = options.index(reach[0])
            dropped = _closest(options[max(0, k - 1):k + 1], rho, lambda d: ratio_s(1.0, d))
        else:
            dropped = options[-1]
            s = _closest(grid, rho, lambda v: ratio_s(v, dropped))
    elif axis == "scalefl":
        if not arch.exits:
            raise ValueError("ScaleFL needs exit heads (model.exits: true)")
        r = rho ** (1 / 3)
        s, depth = snap(r), max(1, round(r * arch.num_blocks))
    else:
        if not arch.exits:
            raise ValueError("the depth axis needs exit heads (model.exits: true)")
        full = arch.full()

        def cut(d: int) -> Geometry:
            return Geometry(full.stream, full.hidden, d)

        depth = _closest(list(range(1, arch.num_blocks + 1)), rho,
                         lambda d: _ratio(arch, hw, cut(d), match))
    bs = tuple(0.0 if j in dropped else b for j in range(arch.num_blocks))
    g = arch.geometry(s, bs, depth)
    m = _measured(arch, hw, g, True)
    full_m = _measured(arch, hw, arch.full(), True)
    return Rung(rho, axis, s, b, tuple(sorted(dropped)), g, m["parameters"], m["flops"],
                m["parameters"] / full_m["parameters"], m["flops"] / full_m["flops"])


def solve_ladder(arch: Arch, hw: tuple[int, int], budgets=DEFAULT_BUDGETS,
                 axis: Axis = "dual", theta: float = 0.5, match: Match = "params"
                 ) -> list[Rung]:
    """One rung per budget; raises when the rungs are not nested (Ordered Dropout needs a
    lower rung to be a prefix of every higher one)."""
    rungs = [solve_rung(arch, hw, float(r), axis, theta, match) for r in budgets]
    ordered = sorted(rungs, key=lambda r: r.budget)
    for low, high in zip(ordered, ordered[1:], strict=False):
        if not low.geometry.within(high.geometry):
            raise ValueError(f"rung ρ={low.budget} is not nested in ρ={high.budget} on axis "
                             f"{axis} (θ={theta}): {low.geometry} vs {high.geometry}")
    return rungs
