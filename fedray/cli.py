"""The ``fedray`` command line. Every informational command takes ``--json`` and then prints
exactly one JSON object on stdout (progress and logs go to stderr)."""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import typer

from fedray.config import ConfigError, field_help, load_config

app = typer.Typer(
    name="fedray",
    help="Federated-learning simulation on Ray.\n\n"
         "Run an experiment from a YAML/TOML config (`fedray run CONFIG -s local.lr=0.1`), "
         "continue an interrupted one (`fedray run --resume RUN_DIR`), plot it "
         "(`fedray report RUN_DIR`), overlay several (`fedray compare A B`), inspect models "
         "(`fedray models show resnet18 --num-classes 100`). `fedray demo` runs the embedded "
         "default offline.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
models_app = typer.Typer(help="List the model registry or profile one model.",
                         invoke_without_command=True, no_args_is_help=False)
app.add_typer(models_app, name="models")
flite_app = typer.Typer(help="FLITE (latent federated fine-tuning) tools.", no_args_is_help=True)
app.add_typer(flite_app, name="flite")
drod_app = typer.Typer(help="DROD (dual-ratio ordered dropout) tools.", no_args_is_help=True)
favor_app = typer.Typer(help="FAVoR (shared/private LoRA with style alignment) tools.",
                        no_args_is_help=True)
app.add_typer(favor_app, name="favor")
app.add_typer(drod_app, name="drod")

DEMO_CONFIG = "fedavg_digits.yaml"
JSON_OPT = typer.Option(False, "--json", help="Print one JSON object on stdout, nothing else.")
SET_OPT = typer.Option(None, "--set", "-s",
                       help="Override a config key, e.g. -s local.lr=0.1 -s clients.fraction=0.5"
                            " (repeatable; values are parsed as YAML).")


def emit(obj: Any, as_json: bool, text: str | None = None) -> None:
    from fedray.metrics import json_text

    if as_json:
        sys.stdout.write(json_text(obj) + "\n")
    else:
        typer.echo(text if text is not None else json_text(obj, indent=2))


def fail(msg: str, as_json: bool, code: int = 2) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"error": msg}) + "\n")
    else:
        typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def demo_config_path() -> Path:
    return Path(str(resources.files("fedray") / "configs" / DEMO_CONFIG))


def _summary_text(s: dict) -> str:
    def pct(v: Any) -> str:
        return "–" if v is None else f"{100 * v:.2f}%"

    acc = (f"global accuracy {pct(s['final_global_accuracy'])} "
           f"(best {pct(s['best_global_accuracy'])}), "
           f"personalized {pct(s['final_personalized_accuracy'])}")
    return (f"run dir: {s['run_dir']}\n"
            f"{s['algorithm']} · {s['model']} · {s['dataset']} · {s['num_clients']} clients · "
            f"{s['rounds']} rounds in {s['wall_seconds']:.1f}s\n{acc}\n"
            f"bytes up {s['total_upload_bytes']:,} · down {s['total_download_bytes']:,} · "
            f"client failures {s['client_failures']} · "
            f"executor restarts {s['executor_restarts']}")


@app.command()
def run(config: Path | None = typer.Argument(
            None, help="Experiment config (.yaml/.toml/.json). Omit with --resume."),
        set_: list[str] | None = SET_OPT,
        run_dir: str | None = typer.Option(
            None, "--run-dir", "-o", help="Where the run is written (path or pyarrow.fs URI;"
                                          " default runs/NAME-TIMESTAMP)."),
        resume: str | None = typer.Option(
            None, "--resume", help="Continue the run in this directory from its latest "
                                   "checkpoint (only -s rounds=N may change)."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace what the run directory holds (a new run "
                                       "otherwise needs an empty or new directory)."),
        progress: bool = typer.Option(True, "--progress/--no-progress",
                                      help="Show a progress bar on stderr."),
        as_json: bool = JSON_OPT) -> None:
    """Run a federated experiment (or resume one) and print its summary."""
    from fedray.runtime import resume_config, run_experiment
    from fedray.runtime.driver import RoundFailedError
    from fedray.runtime.pool import PlacementError
    from fedray.runtime.storage import StateFileError

    try:
        if resume:
            cfg = resume_config(resume, set_ or [])
            target = resume
        else:
            if config is None:
                fail("give a CONFIG file (or --resume RUN_DIR); `fedray demo` runs the "
                     "embedded default", as_json)
            cfg = load_config(config, set_ or [])
            target = run_dir
        summary = run_experiment(cfg, target, resume=bool(resume), progress=progress,
                                 overwrite=overwrite)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    except (RoundFailedError, PlacementError) as e:
        fail(str(e), as_json, code=1)
    emit(summary, as_json, _summary_text(summary))


@app.command()
def demo(rounds: int | None = typer.Option(None, help="Rounds (default: the config's 30)."),
         run_dir: str | None = typer.Option(None, "--run-dir", "-o",
                                               help="Where the run is written."),
         report_: bool = typer.Option(True, "--report/--no-report",
                                      help="Draw the report after the run."),
         progress: bool = typer.Option(True, "--progress/--no-progress"),
         as_json: bool = JSON_OPT) -> None:
    """Run the embedded default offline: FedAvg, MLP, scikit-learn digits, 20 clients."""
    from fedray.report import report as make_report
    from fedray.runtime import run_experiment

    overrides = [f"rounds={rounds}"] if rounds else []
    cfg = load_config(demo_config_path(), overrides)
    summary = run_experiment(cfg, run_dir, progress=progress)
    if report_:
        summary["report"] = make_report(summary["run_dir"])["markdown"]
    emit(summary, as_json, _summary_text(summary)
         + (f"\nreport: {summary['report']}" if report_ else ""))


@app.command()
def report(run_dirs: list[str] = typer.Argument(..., help="One run directory, or several "
                                                         "to overlay (as `fedray compare`)."),
           out: str | None = typer.Option(None, help="Output folder (default RUN_DIR/report; "
                                                     "several runs: compare-TIMESTAMP)."),
           as_json: bool = JSON_OPT) -> None:
    """Plot a run (accuracy vs round, accuracy vs cumulative bytes on a log axis, per tier,
    method diagnostics) and write a Markdown summary with the payload per client per round
    and the compression ratio; several runs are overlaid (the bandwidth/accuracy Pareto)."""
    from fedray.report import compare as make_compare
    from fedray.report import report as make_report

    missing = [d for d in run_dirs if not os.path.isdir(d)]
    if missing:
        fail(f"not run directories: {missing}", as_json)
    try:
        if len(run_dirs) == 1:
            res = make_report(run_dirs[0], out)
        else:
            res = make_compare(run_dirs, out or f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    except FileNotFoundError as e:
        fail(str(e), as_json)
    emit(res, as_json, f"wrote {res['markdown']}\n" + "\n".join(res["plots"]))


@app.command()
def tune(config: Path = typer.Argument(..., help="Experiment config; may hold a `sweep:` "
                                                 "block (space + options)."),
         space: list[str] | None = typer.Option(
             None, "--space", help="KEY=KIND:V1,V2,... with KIND one of choice, grid, "
                                   "uniform, loguniform (low,high), randint (low,high); "
                                   "repeatable. E.g. --space algorithm.theta=grid:0,0.5,1"),
         preset: str | None = typer.Option(None, "--preset", help="Ready-made space: drod "
                                           "(θ), orders (β, γ), flite (d, r), favor (λ_align)."),
         set_: list[str] | None = SET_OPT,
         metric: str | None = typer.Option(None, help="Metric to optimise (default "
                                                      "global_accuracy)."),
         mode: str | None = typer.Option(None, help="max or min."),
         num_samples: int | None = typer.Option(None, "--num-samples", help="Samples of the "
                                                "space (grid values multiply)."),
         max_concurrent: int | None = typer.Option(None, "--max-concurrent",
                                                   help="Trials running at once."),
         scheduler: str | None = typer.Option(None, help="asha (early stopping) or none."),
         grace_period: int | None = typer.Option(None, "--grace-period",
                                                 help="Rounds before ASHA may stop a trial."),
         storage: str = typer.Option("runs/sweeps", help="Where sweeps are written (path "
                                                         "or URI)."),
         name: str | None = typer.Option(None, help="Sweep name (default sweep-NAME)."),
         resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep "
                                                            "of this name (Tuner.restore)."),
         as_json: bool = JSON_OPT) -> None:
    """Sweep config keys with Ray Tune: each trial is one experiment (driver + executors in
    one placement group) reporting every round; ASHA stops weak trials; the table of all
    trials (Parquet + Markdown, best first) lands in STORAGE/NAME."""
    from fedray.tune import parse_space_arg, sweep

    try:
        parsed = dict(parse_space_arg(t) for t in space or [])
        res = sweep(config, parsed, overrides=set_ or [], preset=preset, storage_path=storage,
                    name=name, resume=resume, metric=metric, mode=mode,
                    num_samples=num_samples, max_concurrent=max_concurrent,
                    scheduler=scheduler, grace_period=grace_period)
    except ConfigError as e:
        fail(str(e), as_json)
    out = {"path": res.path, "best_config": res.best_config, "best_metric": res.best_metric,
           "trials": len(res.table), "parquet": res.parquet, "markdown": res.markdown}
    emit(out, as_json, f"best {res.best_metric:.4f} with {res.best_config} "
                       f"({len(res.table)} trials)\ntable: {res.markdown}")


@app.command()
def compare(run_dirs: list[str] = typer.Argument(..., help="Two or more run directories."),
            out: str | None = typer.Option(None, help="Output folder "
                                                      "(default compare-TIMESTAMP)."),
            as_json: bool = JSON_OPT) -> None:
    """Overlay several runs in the same plots and one Markdown table."""
    report(run_dirs, out or f"compare-{time.strftime('%Y%m%d-%H%M%S')}", as_json)


@app.command()
def pretrain(config: Path = typer.Argument(..., help="Experiment config: its data, model, "
                                                  "seed and pretrain sections are used."),
             out: str = typer.Option(..., "--out", "-o", help="Output directory (path or "
                                                             "pyarrow.fs URI)."),
             set_: list[str] | None = SET_OPT,
             resume: bool = typer.Option(False, "--resume", help="Continue from the latest "
                                                                 "per-epoch checkpoint."),
             progress: bool = typer.Option(True, "--progress/--no-progress"),
             as_json: bool = JSON_OPT) -> None:
    """Pretrain the shared base centrally (SGD 0.9, lr 0.05, 3-epoch warmup + cosine,
    wd 5e-4, batch 128; frozen orthogonal head) and write OUT/base.npz + base.json, which
    `algorithm.base=OUT` then fine-tunes federatedly."""
    from fedray.pretrain import pretrain as run_pretrain

    try:
        # The algorithm section is for the federated run (its base is what this writes).
        cfg = load_config(config, (set_ or []) + ["algorithm={name: fedavg}"])
        meta = run_pretrain(cfg, out, resume=resume, progress=progress)
    except ConfigError as e:
        fail(str(e), as_json)
    meta = {k: v for k, v in meta.items() if k != "history"} | {"out": out}
    emit(meta, as_json, f"base written to {out}: test accuracy {meta['test_accuracy']:.4f} "
                        f"after {meta['epochs']} epochs on {meta['train_samples']} samples")


@app.command("config")
def config_cmd(config: Path | None = typer.Argument(None, help="A config file to resolve."),
               set_: list[str] | None = SET_OPT,
               keys: bool = typer.Option(False, "--keys", help="List every key with its "
                                                               "type and meaning."),
               as_json: bool = JSON_OPT) -> None:
    """Validate a config and print it fully resolved (defaults filled in)."""
    if keys:
        rows = [{"key": k, "type": t, "help": h} for k, t, h in field_help()]
        emit({"keys": rows}, as_json,
             "\n".join(f"{r['key']:<34} {r['type']:<40} {r['help']}" for r in rows))
        return
    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        fail(str(e), as_json)
    import yaml

    emit(cfg.to_dict(), as_json, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())


DEFAULT_SHAPES = {"mlp": (784,), "cnn": (1, 28, 28), "lstm": (1, 28, 28),
                  "resnet18": (3, 32, 32), "resnet34": (3, 32, 32)}


@models_app.callback()
def models_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """List the registered models (`fedray models show NAME` profiles one)."""
    if ctx.invoked_subcommand is not None:
        return
    from fedray.models import list_models

    rows = list_models()
    emit({"models": rows}, as_json,
         "\n".join(f"{m['name']:<10} {m['description']}  {m['kwargs']}" for m in rows))


@models_app.command("show")
def models_show(name: str = typer.Argument(..., help="Model name, see `fedray models`."),
                num_classes: int = typer.Option(10, "--num-classes", min=2),
                input_shape: str | None = typer.Option(
                    None, "--input-shape", help="Per-sample shape, e.g. 3,32,32 "
                                                "(default depends on the model)."),
                set_: list[str] | None = typer.Option(
                    None, "--set", "-s", help="Builder keyword, e.g. -s width=32."),
                as_json: bool = JSON_OPT) -> None:
    """Build one model and print its parameters and forward FLOPs for one input
    (conv + linear, 2 FLOPs per multiply-add), measured on the built model."""
    from fedray.config import check_kwargs, parse_override
    from fedray.models import build_model, get_model_builder, profile_model

    try:
        builder = get_model_builder(name, path="NAME")
        kwargs = {".".join(k): v for k, v in (parse_override(s) for s in (set_ or []))}
        kwargs = check_kwargs(builder, kwargs, "model")
        shape = _parse_shape(input_shape) or DEFAULT_SHAPES.get(name, (3, 32, 32))
        prof = profile_model(build_model(name, shape, num_classes, **kwargs), shape)
    except (ConfigError, ValueError) as e:
        fail(str(e), as_json)
    out = {"name": name, "num_classes": num_classes, **prof, "gflops": prof["flops"] / 1e9}
    emit(out, as_json, f"{name} ({num_classes} classes, input {tuple(shape)}): "
                       f"{prof['parameters']:,} parameters, {prof['flops']:,} FLOPs "
                       f"({prof['flops'] / 1e9:.3f} GFLOPs) per forward of one input")


@flite_app.command("info")
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
    from fedray.flite.identity import payload_info

    shape = _parse_shape(input_shape) or DEFAULT_SHAPES.get(model, (3, 32, 32))
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


@drod_app.command("ladder")
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
                axis: str = typer.Option("dual", help="dual (DROD), width, shortcut, depth."),
                match: str = typer.Option("params", "--match",
                                          help="Match ρ on params or flops."),
                as_json: bool = JSON_OPT) -> None:
    """The shared budget ladder: per tier ρ, s, b, stage and hidden widths, parameters,
    FLOPs and their measured ratios to the full model (each sub-model built and run)."""
    from fedray.hetero.ladder import AXES, solve_ladder
    from fedray.models.sliceable import arch_for

    name = model if model.startswith("sliceable_") else f"sliceable_{model}"
    blocks = {"sliceable_resnet18": (2, 2, 2, 2), "sliceable_resnet34": (3, 4, 6, 3)}
    if name not in blocks:
        fail(f"--model: {model!r} is not one of resnet18, resnet34", as_json)
    if match not in ("params", "flops"):
        fail(f"--match: {match!r} is not one of params, flops", as_json)
    if axis not in AXES:
        fail(f"--axis: {axis!r} is not one of {', '.join(AXES)}", as_json)
    try:
        rhos = tuple(float(v) for v in budgets.split(","))
        arch, hw = arch_for(_parse_shape(input_shape), num_classes, blocks[name], width, 8,
                            axis == "depth", name)
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


@favor_app.command("adapter-size")
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
    from fedray.favor.adapter import LoraSpec, adapter_size

    try:
        info = adapter_size(model, LoraSpec(rank, alpha, 0.05, tuple(targets.split(","))))
    except ValueError as e:
        fail(str(e), as_json)
    emit(info, as_json, f"{info['hub_id']} LoRA r={rank} α={alpha} on {targets}: "
                        f"{info['trainable_parameters']:,} trainable parameters, "
                        f"{info['safetensors_bytes']:,} bytes ({info['safetensors_mib']:.1f} MiB)"
                        f" as safetensors fp32, {info['tensors']} tensors")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
