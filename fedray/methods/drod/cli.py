"""``fedray drod ...``: the DROD sub-model ladder."""

from __future__ import annotations

import typer

from fedray.core.registry import register_command
from fedray.models.geometry import RESNET_BLOCKS
from fedray.observe.console import JSON_OPT, emit, fail, parse_shape

app = register_command("drod", typer.Typer(
    help="DROD (dual-ratio ordered dropout) tools.", no_args_is_help=True))


@app.command("ladder")
def drod_ladder(model: str = typer.Option("resnet18", help="resnet18 or resnet34 (the "
                                                           "sliceable CIFAR-stem GN variant)."),
                num_classes: int = typer.Option(100, "--num-classes", min=2),
                input_shape: str = typer.Option("3,32,32", "--input-shape",
                                                help="Per-sample shape C,H,W."),
                width: int = typer.Option(64, min=1, help="Base width (64 = ResNet-18)."),
                theta: float = typer.Option(0.5, "--theta", help="θ in [0, 1]: s = "
                                            "ρ^((1−θ)/2), b = ρ^θ (0 = width slicing)."),
                budgets: str = typer.Option("1.0,0.251,0.064", "--budgets",
                                            help="Comma-separated ρ, one per tier."),
                axis: str = typer.Option("dual", help="dual (DROD), width, shortcut, depth, "
                                         "scalefl (ScaleFL: width and depth at one ratio)."),
                match: str = typer.Option("params", "--match",
                                          help="Match ρ on params or flops."),
                as_json: bool = JSON_OPT) -> None:
    """The shared budget ladder: per tier ρ, s, b, stage and hidden widths, parameters,
    FLOPs and their measured ratios to the full model (each sub-model built and run)."""
    from fedray.methods.drod.ladder import AXES, solve_ladder
    from fedray.models.geometry import arch_for

    base = model.removeprefix("sliceable_")
    if base not in RESNET_BLOCKS:
        fail(f"--model: {model!r} is not one of {', '.join(RESNET_BLOCKS)}", as_json)
    name = f"sliceable_{base}"
    if match not in ("params", "flops"):
        fail(f"--match: {match!r} is not one of params, flops", as_json)
    if axis not in AXES:
        fail(f"--axis: {axis!r} is not one of {', '.join(AXES)}", as_json)
    if not 0.0 <= theta <= 1.0:
        fail(f"--theta: {theta!r} is not in [0, 1]", as_json)
    try:
        rhos = tuple(float(v) for v in budgets.split(","))
        arch, hw = arch_for(parse_shape(input_shape), num_classes, RESNET_BLOCKS[base], width, 8,
                            axis in ("depth", "scalefl"), name)
        rungs = solve_ladder(arch, hw, rhos, axis, theta, match)  # type: ignore[arg-type]
    except ValueError as e:
        fail(str(e), as_json)
    full = arch.full()
    lines = [f"{name} ({num_classes} classes, input {input_shape}), axis {axis}, θ = {theta}, "
             f"matched on {match}",
             f"full model: {rungs[0].parameters / rungs[0].param_ratio:,.0f} parameters, "
             f"{rungs[0].flops / rungs[0].flop_ratio:,.0f} FLOPs; stage widths "
             f"{list(full.stream)}",
             f"{'ρ':>7} {'s':>8} {'b':>7} {'params':>12} {'ratio':>7} {'FLOPs':>15} "
             f"{'ratio':>7}  stage widths / hidden widths"]
    for r in rungs:
        g = r.geometry
        extra = f" dropped {list(r.dropped)}" if r.dropped else ""
        extra += f" depth {g.depth}" if g.depth < arch.num_blocks else ""
        lines.append(f"{r.budget:7.4f} {r.s:8.6f} {r.b:7.4f} {r.parameters:12,} "
                     f"{r.param_ratio:7.4f} {r.flops:15,} {r.flop_ratio:7.4f}  "
                     f"{list(g.stream)} / {list(g.hidden[:g.depth])}{extra}")
    emit({"model": name, "num_classes": num_classes, "theta": theta, "axis": axis,
          "match": match, "rungs": [r.to_dict() for r in rungs]}, as_json, "\n".join(lines))
