"""The geometry of the sliceable ResNet, in plain Python: the full architecture
(:class:`Arch`) and a nested sub-model (:class:`Geometry`: stream width per stage, hidden
width per block, blocks kept). No torch, so the server half of the sub-model methods
(:mod:`fedray.methods.drod.slice_mean`) can cut and average states without it; the module
itself is :mod:`fedray.models.sliceable`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# blocks per stage of the ResNets fedray builds (plain and sliceable): the one table of them
RESNET_BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}


def norm_groups(channels: int, groups: int = 8) -> int:
    """``groups`` halved until it divides ``channels`` (DROD appendix D)."""
    while channels % groups:
        groups //= 2
    return groups


@dataclass(frozen=True)
class Arch:
    """The full network: input, classes, blocks per stage, full stage widths, exits."""

    in_channels: int
    num_classes: int
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    width: int = 64
    groups: int = 8
    exits: bool = False

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.width * 2**k for k in range(len(self.blocks)))

    @property
    def num_blocks(self) -> int:
        return sum(self.blocks)

    @property
    def stage_of(self) -> tuple[int, ...]:
        return tuple(k for k, n in enumerate(self.blocks) for _ in range(n))

    def first_in_stage(self, j: int) -> bool:
        return j == 0 or self.stage_of[j] != self.stage_of[j - 1]

    def has_shortcut_conv(self, j: int) -> bool:
        """Block ``j`` changes stride or width, so its shortcut is a 1x1 conv + GN."""
        return self.first_in_stage(j) and self.stage_of[j] > 0

    def stride(self, j: int) -> int:
        return 2 if self.has_shortcut_conv(j) else 1

    def droppable(self) -> list[int]:
        """Blocks that may become identities (b -> 0): every block but the first of its
        stage, deepest first — within a stage and across stages (shortcut-tiering, §2)."""
        return [j for j in reversed(range(self.num_blocks)) if not self.first_in_stage(j)]

    def full(self) -> Geometry:
        widths = self.widths
        return Geometry(widths, tuple(widths[k] for k in self.stage_of), self.num_blocks)

    def geometry(self, s: float, b: float | tuple[float, ...] = 1.0, depth: int | None = None
                 ) -> Geometry:
        """Stream width ``round(s * C_k)`` per stage, hidden width ``round(b * stream)`` per
        block (``b`` one ratio or one per block; at least 1 channel unless b = 0)."""
        if not 0 < s <= 1:
            raise ValueError(f"shortcut ratio s must lie in (0, 1], got {s}")
        bs = (b,) * self.num_blocks if isinstance(b, (int, float)) else tuple(b)
        if len(bs) != self.num_blocks or any(not 0 <= v <= 1 for v in bs):
            raise ValueError(f"branch ratio b must lie in [0, 1] (one or {self.num_blocks} "
                             f"values), got {b}")
        stream = tuple(max(1, round(s * c)) for c in self.widths)
        hidden = tuple(0 if v == 0 else max(1, round(v * stream[k]))
                       for v, k in zip(bs, self.stage_of, strict=True))
        for j, h in enumerate(hidden):
            if h == 0 and self.first_in_stage(j):
                raise ValueError(f"block {j} is the first of its stage and cannot drop its "
                                 f"branch (droppable: {sorted(self.droppable())})")
        return Geometry(stream, hidden, self.num_blocks if depth is None else depth)


@dataclass(frozen=True)
class Geometry:
    """Stream width per stage, hidden width per block (0: identity block), blocks kept."""

    stream: tuple[int, ...]
    hidden: tuple[int, ...]
    depth: int

    def within(self, other: Geometry) -> bool:
        """True when this sub-model is a prefix of ``other`` along every axis."""
        return (self.depth <= other.depth
                and all(a <= b for a, b in zip(self.stream, other.stream, strict=True))
                and all(a <= b for a, b in zip(self.hidden[:self.depth],
                                               other.hidden[:self.depth], strict=True)))

    def to_dict(self) -> dict:
        return {"stream": list(self.stream), "hidden": list(self.hidden), "depth": self.depth}


def image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of an image input; a flat ``(D,)`` with square ``D`` reads as 1 x √D x √D."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    if len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
        side = math.isqrt(shape[0])
        return (1, side, side)
    raise ValueError(f"{model} needs an image input (C, H, W) or a flat input whose size is a "
                     f"perfect square; got input shape {shape}")


def arch_for(input_shape: tuple[int, ...], num_classes: int, blocks: tuple[int, ...],
             width: int, groups: int, exits: bool, name: str) -> tuple[Arch, tuple[int, int]]:
    c, h, w = image_shape(input_shape, name)
    return Arch(c, num_classes, tuple(blocks), width, groups, exits), (h, w)


def _out(size: int, stride: int) -> int:
    """Spatial size after a 3x3 conv (padding 1) or a 1x1 conv (padding 0) at ``stride``."""
    return (size - 1) // stride + 1


def count(arch: Arch, input_hw: tuple[int, int], g: Geometry, flops: bool = True
          ) -> dict[str, int]:
    """Parameters and forward FLOPs per sample of the sub-model ``g`` of the sliceable
    ResNet built for it alone (only the head it uses), counted from the geometry — no torch.
    The same numbers as :func:`fedray.models.sliceable.measure`, which builds the model and
    runs an input through it (equal on every geometry of the ladders:
    ``tests/test_sliceable.py``): convs and linears at 2 FLOPs per multiply-add, GroupNorm
    weight and bias per channel, an identity block (hidden width 0) costing nothing."""
    k = arch.num_classes
    h, w = input_hw
    c = g.stream[0]
    params = arch.in_channels * c * 9 + 2 * c
    fl = 2 * c * h * w * arch.in_channels * 9
    cin = c
    for j in range(g.depth):
        cout, hid, stride = g.stream[arch.stage_of[j]], g.hidden[j], arch.stride(j)
        if hid:
            params += cin * hid * 9 + 2 * hid + hid * cout * 9 + 2 * cout
            h, w = _out(h, stride), _out(w, stride)
            fl += 2 * hid * h * w * cin * 9 + 2 * cout * h * w * hid * 9
            if arch.has_shortcut_conv(j):
                fl += 2 * cout * h * w * cin
        if arch.has_shortcut_conv(j):
            params += cin * cout + 2 * cout
        cin = cout
    last, final = arch.stage_of[g.depth - 1], len(arch.blocks) - 1
    if not arch.exits or last == final:
        params += g.stream[-1] * k + k
    else:
        params += g.stream[last] * k + k
    fl += 2 * k * cin
    return {"parameters": params, "flops": fl} if flops else {"parameters": params}
