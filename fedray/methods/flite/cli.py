"""``fedray flite ...``: FLITE's payload and compression calculator."""

from __future__ import annotations

import typer

from fedray.core.registry import register_command
from fedray.core.spec import ConfigError
from fedray.observe.console import DEFAULT_SHAPES, JSON_OPT, emit, fail, parse_shape

app = register_command("flite", typer.Typer(
    help="FLITE (latent federated fine-tuning) tools.", no_args_is_help=True))


@app.command("info")
def flite_info(model: str = typer.Option("resnet18", help="Model name (`fedray models`)."),
               num_classes: int = typer.Option(100, "--num-classes", min=2),
               d: int = typer.Option(64, "--d", min=1, help="Latent size per mapped layer."),
               r: int = typer.Option(32, "--r", min=1, help="Rank of the frozen factors."),
               input_shape: str | None = typer.Option(None, "--input-shape",
                                                      help="Per-sample shape, e.g. 3,32,32."),
               layers: list[str] | None = typer.Option(None, "--layer", help="fnmatch pattern "
                                                       "of mapped parameters (repeatable)."),
               as_json: bool = JSON_OPT) -> None:
    """Mapped layers, latent size D, the per-round payload at fp32/int8/int4 (exact bytes,
    one quantizer scale for the whole latent or one per layer) and the compression ratio."""
    from fedray.methods.flite.identity import payload_info

    shape = parse_shape(input_shape) or DEFAULT_SHAPES.get(model, (3, 32, 32))
    try:
        info = payload_info(model, num_classes, d, r, shape, layers or None)
    except (ConfigError, ValueError) as e:
        fail(str(e), as_json)
    text = (f"{model} ({num_classes} classes): {info['num_mapped_layers']} mapped layers, "
            f"{info['mapped_parameters']:,} mapped weights -> D = {info['D']:,} latents "
            f"(d = {d}, r = {r})\n"
            f"compression: {info['compression_ratio_mapped']:,.0f}x vs the mapped weights, "
            f"{info['compression_ratio_model']:,.0f}x vs all {info['model_parameters']:,} "
            f"parameters\npayload per client per round: fp32 {info['payload_fp32_bytes']:,} B,"
            f" int8 {info['payload_int8_bytes']:,} B, int4 {info['payload_int4_bytes']:,} B "
            f"(one scale+zero for the whole latent; per layer: int4 "
            f"{info['payload_int4_per_layer_scale_bytes']:,} B; JSON header adds "
            f"{info['payload_fp32_bytes_with_header'] - info['payload_fp32_bytes']} B)\n"
            f"stored factors: {info['stored_factor_bytes'] / 2**30:.2f} GiB "
            f"(regenerated mode: about one chunk)")
    emit(info, as_json, text)
