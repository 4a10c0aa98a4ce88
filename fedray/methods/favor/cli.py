"""``fedray favor ...``: FAVoR's adapter-size calculator."""

from __future__ import annotations

import typer

from fedray.core.registry import register_command
from fedray.observe.console import JSON_OPT, emit, fail

app = register_command("favor", typer.Typer(
    help="FAVoR (shared/private LoRA with style alignment) tools.", no_args_is_help=True))


@app.command("adapter-size")
def favor_adapter_size(model: str = typer.Option("qwen2.5-3b-instruct", help="One of the "
                                                 "shipped families: qwen2.5-{0.5b,1.5b,3b,7b}"
                                                 "-instruct."),
                       rank: int = typer.Option(16, "--rank", help="LoRA rank r."),
                       alpha: int = typer.Option(32, "--alpha", help="LoRA α."),
                       targets: str = typer.Option(",".join(("q_proj", "k_proj", "v_proj",
                                                             "o_proj", "gate_proj", "up_proj",
                                                             "down_proj")), "--targets",
                                                   help="Comma-separated target modules."),
                       as_json: bool = JSON_OPT) -> None:
    """Trainable LoRA parameters and the adapter's serialized safetensors bytes (what one
    FAVoR upload or download weighs), built on the meta device: nothing is downloaded."""
    from fedray.methods.favor.adapter import LoraSpec, adapter_size

    try:
        info = adapter_size(model, LoraSpec(rank, alpha, 0.05, tuple(targets.split(","))))
    except ValueError as e:
        fail(str(e), as_json)
    emit(info, as_json, f"{info['hub_id']} LoRA r={rank} α={alpha} on {targets}: "
                        f"{info['trainable_parameters']:,} trainable parameters, "
                        f"{info['safetensors_bytes']:,} bytes ({info['safetensors_mib']:.1f} MiB)"
                        f" as safetensors fp32, {info['tensors']} tensors")
