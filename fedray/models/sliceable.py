"""A ResNet-GN whose sub-models are nested prefixes along every width axis and along depth.

A sub-model is described by a :class:`Geometry`: the stream width of each stage (the
shortcut ratio s of DROD, §2), the hidden width of each block's first conv (the branch
ratio b, as ``b * stream``; 0 removes the branch so the block is an exact identity), and the
number of blocks kept (depth). :class:`SliceableResNet` is built physically at one geometry
(so parameters and FLOPs of any configuration are measured by building it) and runs any
geometry nested inside its own by slicing weight prefixes — the Ordered Dropout forward.

Parameter names do not depend on the geometry, so a sub-model's state is the full state
sliced tensor by tensor (:mod:`fedray.methods.drod.selection`). GroupNorm uses 8 groups, halved
until they divide the (sliced) channel count (DROD appendix D).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from fedray.models.geometry import RESNET_BLOCKS, Arch, Geometry, arch_for, norm_groups


class _FlopCount:
    """Forward FLOPs of the convs and linears actually run (2 per multiply-add), while on."""

    active = False
    total = 0


def _conv(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    out = F.conv2d(x, w, stride=stride, padding=padding)
    if _FlopCount.active:
        _FlopCount.total += 2 * out[0].numel() * w[0].numel()
    return out


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = F.linear(x, w, b)
    if _FlopCount.active:
        _FlopCount.total += 2 * out[0].numel() * w.shape[1]
    return out


def _gn(x: torch.Tensor, norm: nn.GroupNorm, channels: int, groups: int) -> torch.Tensor:
    return F.group_norm(x, norm_groups(channels, groups), norm.weight[:channels],
                        norm.bias[:channels], norm.eps)


class _Shortcut(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.norm = nn.GroupNorm(norm_groups(cout, groups), cout)


class _Block(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int, shortcut: bool, groups: int):
        super().__init__()
        if hidden:
            self.conv1 = nn.Conv2d(cin, hidden, 3, padding=1, bias=False)
            self.norm1 = nn.GroupNorm(norm_groups(hidden, groups), hidden)
            self.conv2 = nn.Conv2d(hidden, cout, 3, padding=1, bias=False)
            self.norm2 = nn.GroupNorm(norm_groups(cout, groups), cout)
        if shortcut:
            self.shortcut = _Shortcut(cin, cout, groups)


class SliceableResNet(nn.Module):
    """CIFAR-stem ResNet with GroupNorm built at ``geometry`` (default: the full network).

    ``forward(x, sub)`` runs the nested sub-model ``sub`` (default: the built geometry) by
    slicing the leading channels of every weight: ``y = ReLU(x + F(x))`` with
    ``F = GN(conv2(ReLU(GN(conv1(x)))))``, ``conv1: s C -> b s C``, ``conv2: b s C -> s C``
    (eq. 1); a block with hidden width 0 returns its input (x >= 0 after the previous ReLU,
    so ``ReLU(x + 0) = x``). The head reads the leading pooled features; with ``arch.exits``
    a depth-cut sub-model ends in its last stage's own exit head (DepthFL). ``all_heads``
    keeps every head the geometry reaches (the global model); ``False`` keeps only the head
    the geometry itself uses (a tier's model, so it uploads nothing it does not train), plus
    the heads of the shallower sub-models in ``depths`` (Ordered Dropout over depth samples
    them; ScaleFL trains every exit of its sub-model).
    """

    def __init__(self, arch: Arch, input_hw: tuple[int, int], geometry: Geometry | None = None,
                 all_heads: bool = True, depths: tuple[int, ...] = ()):
        super().__init__()
        self.arch, self.input_hw = arch, input_hw
        g = geometry or arch.full()
        self.geometry = g
        self.stem = nn.Module()
        self.stem.conv = nn.Conv2d(arch.in_channels, g.stream[0], 3, padding=1, bias=False)
        self.stem.norm = nn.GroupNorm(norm_groups(g.stream[0], arch.groups), g.stream[0])
        blocks, cin = [], g.stream[0]
        for j in range(g.depth):
            cout = g.stream[arch.stage_of[j]]
            blocks.append(_Block(cin, g.hidden[j], cout, arch.has_shortcut_conv(j),
                                 arch.groups))
            cin = cout
        self.blocks = nn.ModuleList(blocks)
        last, final = arch.stage_of[g.depth - 1], len(arch.blocks) - 1
        if not arch.exits or last == final or all_heads:
            self.fc = nn.Linear(g.stream[-1], arch.num_classes)
        if arch.exits:
            stages = range(min(last + 1, final)) if all_heads else sorted(
                {arch.stage_of[d - 1] for d in (*depths, g.depth) if d <= g.depth}
                - {final})
            self.exits = nn.ModuleDict({str(k): nn.Linear(g.stream[k], arch.num_classes)
                                        for k in stages})

    def head(self, depth: int) -> nn.Linear:
        """The classifier of a sub-model that keeps ``depth`` blocks."""
        stage = self.arch.stage_of[depth - 1]
        if stage == len(self.arch.blocks) - 1 or not self.arch.exits:
            return self.fc
        return self.exits[str(stage)]

    def forward(self, x: torch.Tensor, sub: Geometry | None = None) -> torch.Tensor:
        return self.exit_logits(x, sub)[-1]

    def exit_logits(self, x: torch.Tensor, sub: Geometry | None = None,
                    depths: tuple[int, ...] = ()) -> list[torch.Tensor]:
        """Logits of the exit heads after each of ``depths`` blocks (shallower than ``sub``'s,
        ascending) and, last, of ``sub``'s own head — one pass through the trunk (ScaleFL's
        early exits)."""
        arch, g = self.arch, sub or self.geometry
        outs = []
        if x.dim() == 2:
            x = x.view(x.shape[0], arch.in_channels, *self.input_hw)
        c = g.stream[0]
        x = F.relu(_gn(_conv(x, self.stem.conv.weight[:c], padding=1), self.stem.norm, c,
                       arch.groups))
        for j in range(g.depth):
            blk, cout, h, stride = (self.blocks[j], g.stream[arch.stage_of[j]], g.hidden[j],
                                    arch.stride(j))
            if h:
                out = _conv(x, blk.conv1.weight[:h, :c], stride, 1)
                out = F.relu(_gn(out, blk.norm1, h, arch.groups))
                out = _gn(_conv(out, blk.conv2.weight[:cout, :h], 1, 1), blk.norm2, cout,
                          arch.groups)
                if arch.has_shortcut_conv(j):
                    sc = _conv(x, blk.shortcut.conv.weight[:cout, :c], stride)
                    sc = _gn(sc, blk.shortcut.norm, cout, arch.groups)
                else:
                    sc = x
                x, c = F.relu(out + sc), cout
            if j + 1 in depths and j + 1 < g.depth:
                head = self.head(j + 1)
                outs.append(_linear(x.mean((2, 3)), head.weight[:, :c], head.bias))
        head = self.head(g.depth)
        return [*outs, _linear(x.mean((2, 3)), head.weight[:, :c], head.bias)]


@torch.no_grad()
def measure(arch: Arch, input_hw: tuple[int, int], geometry: Geometry, flops: bool = True
            ) -> dict[str, int]:
    """Parameters and forward FLOPs (per sample; convs and linears at 2 per multiply-add, as run)
    of the sub-model ``geometry``, measured by building it and running one input through it.
    ``flops=False`` only builds it (on the meta device: no memory, no init)."""
    if not flops:
        with torch.device("meta"):
            model = SliceableResNet(arch, input_hw, geometry, all_heads=False)
        return {"parameters": sum(p.numel() for p in model.parameters())}
    model = SliceableResNet(arch, input_hw, geometry, all_heads=False)
    _FlopCount.active, _FlopCount.total = True, 0
    try:
        # two rows (counts are per sample): GroupNorm rejects a lone value per group
        model(torch.zeros(2, arch.in_channels, *input_hw))
        count = _FlopCount.total
    finally:
        _FlopCount.active = False
    return {"parameters": sum(p.numel() for p in model.parameters()), "flops": count}


@functools.lru_cache(maxsize=256)
def held(arch: Arch, hw: tuple[int, int], g: Geometry, depths: tuple[int, ...] = ()
         ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter the sub-model ``g`` holds (only the head it uses, and
    the exit heads after ``depths`` blocks)."""
    with torch.device("meta"):
        model = SliceableResNet(arch, hw, g, all_heads=False, depths=depths)
    return tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


@functools.lru_cache(maxsize=256)
def held_count(arch: Arch, hw: tuple[int, int], g: Geometry | None = None,
               depths: tuple[int, ...] = (), min_ndim: int = 0) -> int:
    """How many parameters the sub-model ``g`` holds (:func:`held`; the full model when
    None); ``min_ndim=2`` counts only the conv and linear weights (what a mask can cut)."""
    shapes = held(arch, hw, arch.full() if g is None else g, depths)
    return sum(math.prod(s) for _, s in shapes if len(s) >= min_ndim)


def sliceable_resnet18(input_shape: tuple[int, ...], num_classes: int, *, width: int = 64,
                       groups: int = 8, exits: bool = False) -> SliceableResNet:
    """ResNet-18 (CIFAR stem, GroupNorm) whose nested sub-models are prefixes (DROD)."""
    arch, hw = arch_for(input_shape, num_classes, RESNET_BLOCKS["resnet18"], width, groups,
                        exits, "sliceable_resnet18")
    return SliceableResNet(arch, hw)


def sliceable_resnet34(input_shape: tuple[int, ...], num_classes: int, *, width: int = 64,
                       groups: int = 8, exits: bool = False) -> SliceableResNet:
    """ResNet-34 (CIFAR stem, GroupNorm) whose nested sub-models are prefixes (DROD)."""
    arch, hw = arch_for(input_shape, num_classes, RESNET_BLOCKS["resnet34"], width, groups,
                        exits, "sliceable_resnet34")
    return SliceableResNet(arch, hw)


__all__ = ["Arch", "Geometry", "SliceableResNet", "arch_for", "held", "held_count", "measure",
           "norm_groups", "sliceable_resnet18", "sliceable_resnet34"]
