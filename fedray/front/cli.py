"""The ``fedray`` command line. Every informational command takes ``--json`` and then prints
exactly one JSON object on stdout; without it, a human summary ending with where the files
are. Progress (:mod:`fedray.observe.progress`) and logs go to stderr; the libraries' own progress
bars and known-harmless warnings only with ``fedray -v``."""

from __future__ import annotations

import dataclasses
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any

import typer

from fedray.core import registry
from fedray.core.config import DEFAULT_METHOD, load_config
from fedray.core.config import keys as config_keys
from fedray.core.spec import ConfigError
from fedray.core.storage import StateFileError
from fedray.observe.console import (
    DEFAULT_SHAPES,
    JSON_OPT,
    SET_OPT,
    Stopped,
    UsageError,
    emit,
    fail,
    guarded,
    set_verbosity,
)
from fedray.observe.console import parse_shape as _parse_shape

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
fleet_app = typer.Typer(help="Device traces for the virtual clock (fleet.trace, "
                             "fleet.availability): write an example, convert FedScale's.",
                        no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")
for _name, _sub in registry.commands().items():  # the methods' own sub-commands
    app.add_typer(_sub, name=_name)

DEMO_CONFIG = "fedavg_digits.yaml"


@app.callback()
def options(verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show the libraries' own progress bars and warnings "
                                       "(hidden by default), here and in the Ray workers.")
            ) -> None:
    """Options of every command (before its name: `fedray -v run ...`)."""
    set_verbosity(verbose)


def demo_config_path() -> Path:
    return Path(str(resources.files("fedray") / "configs" / DEMO_CONFIG))


# what a run directory holds, for the end of a run (written only where it applies)
RUN_FILES = [("summary.json", "this summary"), ("rounds.parquet", "metrics per round"),
             ("clients.parquet", "metrics per client and round"),
             ("config.yaml", "the resolved config (`fedray run --resume` continues it)")]


def summary_text(s: dict, report: str | None = None) -> str:
    """A run's summary for people: what ran, how well, what it cost, where its files are
    (``report``: its report, when drawn)."""
    def pct(v: Any) -> str:
        return "–" if v is None else f"{100 * v:.2f}%"

    acc = (f"global accuracy {pct(s['final_global_accuracy'])} "
           f"(best {pct(s['best_global_accuracy'])}), "
           f"personalized {pct(s['final_personalized_accuracy'])}")
    if s.get("final_global_n"):  # what the global accuracy was scored on
        which = "all of it" if s.get("global_test_set") == "all" else "a sample"
        acc += f"\nglobal test set: {which} ({round(s['final_global_n']):,} scored)"
    return (f"run dir: {s['run_dir']}\n"
            f"{s['algorithm']} · {s['model']} · {s['dataset']} · {s['num_clients']} clients · "
            f"{s['rounds']} rounds in {s['wall_seconds']:.1f}s\n{acc}\n"
            f"bytes up {s['total_upload_bytes']:,} · down {s['total_download_bytes']:,} · "
            f"client failures {s['client_failures']} · "
            f"executor restarts {s['executor_restarts']}\n"
            f"simulated time {s.get('simulated_hours', 0.0) * 60:.2f} min (fleet clock) · "
            f"failed rounds {s.get('failed_rounds', 0)}" + _dp_text(s.get("dp"), s.get("dp_sgd"))
            + _adversary_text(s.get("adversary")) + _secagg_text(s.get("secagg")) + "\n"
            + _files_text(s["run_dir"], report))


def _secagg_text(a: dict | None) -> str:
    """Secure aggregation's line: the protocol, its arithmetic and what it cost."""
    if not a:
        return ""
    return (f"\nsecure aggregation {a['protocol']} in Z_2^{a['bits']} (clip ±{a['clip']:g}, "
            f"scale {a['scale']:.4g}): {a['protocol_bytes']:,} protocol bytes "
            f"({100 * a['protocol_share_of_bytes']:.1f}% of all), "
            f"{sum(a['sim_seconds_per_phase'].values()):.2f} simulated s, "
            f"{a['failed_rounds']} rounds failed")


def _adversary_text(a: dict | None) -> str:
    """The adversary's line: its attack, how many clients lie, and what it achieved."""
    if not a:
        return ""
    def pct(v: Any) -> str:
        return "–" if v is None else f"{100 * v:.1f}%"

    text = (f"\nadversary {a['attack']}: {a['malicious_clients']} malicious clients, "
            f"{a['malicious_client_rounds']} malicious client-rounds")
    if "detection_precision" in a:
        text += (f" · detection precision {pct(a['detection_precision'])}, "
                 f"recall {pct(a['detection_recall'])}")
    if "final_attack_success_rate" in a:
        text += f" · attack success rate {pct(a['final_attack_success_rate'])}"
    return text


def _files_text(run_dir: str, report: str | None) -> str:
    local = "://" not in run_dir
    files = [f"  {run_dir}/{name:<16} {what}" for name, what in RUN_FILES
             if not local or os.path.exists(os.path.join(run_dir, name))]
    return "\n".join([f"files in {run_dir}:", *files,
                      f"report: {report}" if report else f"plots: fedray report {run_dir}"])


def _dp_text(dp: dict | None, dp_sgd: dict | None = None) -> str:
    """The summary's privacy lines, each saying its convention (δ's rule, the accountant,
    exact or a bound, the sampling rate)."""
    out = ""
    if dp:
        eps = "∞" if dp["epsilon"] is None else f"{dp['epsilon']:.3g}"
        rule = dp.get("delta_rule", "dp.delta")
        exact = dp["accountant"] == "pld" and dp["sampling"] == "fixed"
        out += (f"\nclient-level DP: ε = {eps} at δ = {dp['delta']:.2g}"
                f"{'' if rule == 'dp.delta' else f' (= {rule})'} ({dp['accountant']}"
                f"{', exact: no sampling' if exact else ''}, "
                f"{dp['releases']} releases, noise multiplier {dp['noise_multiplier']:.4g}, "
                f"clip {dp['clip_norm']:.4g}, {dp['sampling']} sampling q = "
                f"{dp['sampling_rate']:.3g})")
    if dp_sgd:
        out += (f"\nlocal DP-SGD: per-client, per-round ε at δ = {dp_sgd['delta']:.2g} in "
                f"clients.parquet (dp_sgd_epsilon; Opacus RDP at q = batch/n, where Opacus' "
                f"make_private takes 1/len(loader): a smaller ε)")
    return out


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
            False, "--overwrite", help="Replace the fedray run the run directory holds "
                                       "(its config.yaml and the files a run writes; "
                                       "anything else is refused), once the new run has "
                                       "started. A new run otherwise needs an empty or new "
                                       "directory."),
        progress: bool = typer.Option(True, "--progress/--no-progress",
                                      help="Show a progress bar on stderr."),
        target_epsilon: str | None = typer.Option(
            None, "--target-epsilon", help="Client-level DP with the noise calibrated "
                                           "before the run so that ε after all rounds is at "
                                           "most this (at dp.delta; same as -s dp.enabled=true "
                                           "-s dp.target_epsilon=X)."),
        smoke: bool = typer.Option(
            False, "--smoke", help="Run the config's smoke size: its `smoke` overrides "
                                   "first, then -s (the published setups of "
                                   "configs/benchmarks/ have one that runs on a CPU)."),
        as_json: bool = JSON_OPT) -> None:
    """Run a federated experiment (or resume one) and print its summary."""
    from fedray.runtime import resume_config, run_experiment
    from fedray.runtime.jobs import RoundFailedError
    from fedray.runtime.pool import PlacementError

    if target_epsilon is not None:
        set_ = [*(set_ or []), "dp.enabled=true", f"dp.target_epsilon={target_epsilon}"]
    if resume and smoke:
        fail("--smoke sets the size of a new run; a resumed run keeps its own (give -s "
             "rounds=N to extend it)", as_json)
    if resume and config is not None:
        fail(f"give a CONFIG file or --resume RUN_DIR, not both: a resumed run keeps the "
             f"config stored in {resume}/config.yaml (-s rounds=N extends it)", as_json)
    if resume and (run_dir is not None or overwrite):
        fail("--resume continues the run in RUN_DIR itself: -o/--run-dir and --overwrite "
             "are for a new run", as_json)
    try:
        if resume:
            cfg = resume_config(resume, set_ or [])
            target = resume
        else:
            if config is None:
                fail("give a CONFIG file (or --resume RUN_DIR); `fedray demo` runs the "
                     "embedded default", as_json)
            cfg = load_config(config, set_ or [], smoke=smoke)
            target = run_dir
        summary = run_experiment(cfg, target, resume=bool(resume), progress=progress,
                                 overwrite=overwrite)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    except (RoundFailedError, PlacementError) as e:
        fail(str(e), as_json, code=1)
    emit(summary, as_json, summary_text(summary))


@app.command()
def demo(rounds: str | None = typer.Option(None, help="Rounds (default: the config's 30; "
                                                    "parsed as the config key `rounds`)."),
         run_dir: str | None = typer.Option(None, "--run-dir", "-o",
                                               help="Where the run is written."),
         report_: bool = typer.Option(True, "--report/--no-report",
                                      help="Draw the report after the run."),
         progress: bool = typer.Option(True, "--progress/--no-progress",
                                       help="Show the run's progress on stderr."),
         as_json: bool = JSON_OPT) -> None:
    """Run the embedded default offline: FedAvg, MLP, scikit-learn digits, 20 clients."""
    from fedray.front.report import report as make_report
    from fedray.runtime import run_experiment

    # the option is the config key: one parser, one rule (--rounds 0 is refused as rounds=0)
    overrides = [f"rounds={rounds}"] if rounds is not None else []
    try:
        cfg = load_config(demo_config_path(), overrides)
        if run_dir is not None and os.path.isdir(run_dir) and os.listdir(run_dir):
            raise ConfigError("--run-dir", run_dir, f"an empty or new directory (this one "
                                                    f"holds files; `fedray run --resume "
                                                    f"{run_dir}` continues a run in it)")
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    summary = run_experiment(cfg, run_dir, progress=progress)
    if report_:
        summary["report"] = make_report(summary["run_dir"])["markdown"]
    emit(summary, as_json, summary_text(summary, summary.get("report")))


@app.command()
def report(run_dirs: list[str] = typer.Argument(..., help="One run directory, or several "
                                                         "to overlay (as `fedray compare`)."),
           out: str | None = typer.Option(None, help="Output folder (default RUN_DIR/report; "
                                                     "several runs: compare-TIMESTAMP)."),
           overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of "
                                          "an earlier report in the output folder (refused "
                                          "otherwise)."),
           as_json: bool = JSON_OPT) -> None:
    """Plot a run (accuracy vs round, accuracy vs cumulative bytes on a log axis, per tier,
    method diagnostics; chance level dashed) and write a Markdown summary with the payload
    per client per round and the compression ratio, plus report.html: tables and plots in one
    self-contained file to share. Several runs are overlaid (the bandwidth/accuracy Pareto),
    runs differing only in seed as mean ± sd."""
    from fedray.front.report import compare as make_compare
    from fedray.front.report import report as make_report

    missing = [d for d in run_dirs if not os.path.isdir(d)]
    if missing:
        fail(f"not run directories (a local directory a run wrote, holding its config.yaml "
             f"and metrics): {missing}", as_json)
    try:
        if len(run_dirs) == 1:
            res = make_report(run_dirs[0], out, overwrite=overwrite)
        else:
            res = make_compare(run_dirs, out or f"compare-{time.strftime('%Y%m%d-%H%M%S')}",
                               overwrite=overwrite)
    except (FileNotFoundError, ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    emit(res, as_json, f"wrote {res['markdown']} and {res['html']} (one self-contained "
                       f"file)\n" + "\n".join(res["plots"]))


@app.command()
def tune(config: Path = typer.Argument(..., help="Experiment config; may hold a `sweep:` "
                                                 "block (space + options)."),
         space: list[str] | None = typer.Option(
             None, "--space", help="KEY=KIND:V1,V2,... with KIND one of choice, grid, "
                                   "uniform, loguniform (low,high), randint (low,high); "
                                   "repeatable. E.g. --space algorithm.theta=grid:0,0.5,1"),
         preset: str | None = typer.Option(None, "--preset", help="A method's ready-made "
                                           "space, by method name: any method with a "
                                           "sweep_preset of its own, plugins' included "
                                           "(`fedray methods` names them)."),
         set_: list[str] | None = SET_OPT,
         metric: str | None = typer.Option(None, help="Metric to optimise (default "
                                                      "global_accuracy)."),
         mode: str | None = typer.Option(None, help="max or min (default max)."),
         num_samples: int | None = typer.Option(None, "--num-samples", help="Samples of the "
                                                "space (grid values multiply; default 1)."),
         max_concurrent: int | None = typer.Option(None, "--max-concurrent",
                                                   help="Trials running at once (default "
                                                        "1)."),
         scheduler: str | None = typer.Option(None, help="asha (early stopping, the "
                                                         "default) or none."),
         grace_period: int | None = typer.Option(None, "--grace-period",
                                                 help="Rounds before ASHA may stop a trial "
                                                      "(default 1)."),
         storage: str = typer.Option("runs/sweeps", help="Where sweeps are written (path "
                                                         "or URI)."),
         name: str | None = typer.Option(None, help="Sweep name (default sweep-NAME)."),
         resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep "
                                                            "of this name (from its "
                                                            "sweep.json)."),
         progress: bool = typer.Option(True, "--progress/--no-progress",
                                       help="Show the sweep's progress on stderr."),
         as_json: bool = JSON_OPT) -> None:
    """Sweep config keys with Ray Tune: each trial is one experiment (driver + executors in
    one placement group) reporting every round; ASHA stops weak trials; the table of all
    trials (Parquet + Markdown, best first) lands in STORAGE/NAME."""
    from fedray.front.tune import parse_space_arg, sweep

    try:
        parsed = dict(parse_space_arg(t) for t in space or [])
        res = sweep(config, parsed, overrides=set_ or [], preset=preset, storage_path=storage,
                    name=name, resume=resume, metric=metric, mode=mode,
                    num_samples=num_samples, max_concurrent=max_concurrent,
                    scheduler=scheduler, grace_period=grace_period, progress=progress)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    out = {"path": res.path, "best_config": res.best_config, "best_metric": res.best_metric,
           "trials": len(res.table), "parquet": res.parquet, "markdown": res.markdown}
    emit(out, as_json, sweep_text(res))


def sweep_text(res: Any) -> str:
    """A sweep's table for people (SWEEP.md: every trial, best first) and where its files
    are."""
    from fedray.core.storage import Storage

    table = Storage(res.path).read_bytes("SWEEP.md").decode().rstrip()
    return (f"{table}\n\nfiles in {res.path}:\n  {res.markdown}  this table\n"
            f"  {res.parquet}  the same as Parquet\n"
            f"  {res.path}/runs/  one run directory per trial (`fedray report` draws one)")


@app.command()
def compare(run_dirs: list[str] = typer.Argument(..., help="Two or more run directories."),
            out: str | None = typer.Option(None, help="Output folder "
                                                      "(default compare-TIMESTAMP)."),
            overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of "
                                           "an earlier comparison in the output folder."),
            as_json: bool = JSON_OPT) -> None:
    """Overlay several runs in the same plots and one Markdown table (plus compare.html);
    runs whose configs differ only in seed and name are shown as mean ± sd over the seeds."""
    if len(run_dirs) < 2:
        fail(f"compare needs two or more run directories (got {len(run_dirs)}); `fedray "
             f"report RUN_DIR` draws one", as_json)
    report(run_dirs, out or f"compare-{time.strftime('%Y%m%d-%H%M%S')}", overwrite, as_json)


@app.command()
def pretrain(config: Path = typer.Argument(..., help="Experiment config: its data, model, "
                                                  "seed and pretrain sections are used."),
             out: str = typer.Option(..., "--out", "-o", help="Output directory (path or "
                                                             "pyarrow.fs URI)."),
             set_: list[str] | None = SET_OPT,
             resume: bool = typer.Option(False, "--resume", help="Continue from the latest "
                                                                 "per-epoch checkpoint."),
             overwrite: bool = typer.Option(False, "--overwrite", help="Replace the base "
                                            "and checkpoints OUT holds (refused otherwise)."),
             progress: bool = typer.Option(True, "--progress/--no-progress",
                                           help="Show the epochs' progress on stderr."),
             as_json: bool = JSON_OPT) -> None:
    """Pretrain the shared base centrally (SGD 0.9, lr 0.05, 3-epoch warmup + cosine,
    wd 5e-4, batch 128; frozen orthogonal head) and write OUT/base.npz + base.json, which
    `algorithm.base=OUT` then fine-tunes federatedly."""
    from fedray.models.pretrain import pretrain as run_pretrain

    try:
        # The algorithm section is for the federated run (its base is what this writes).
        cfg = load_config(config, (set_ or []) + [f"algorithm={{name: {DEFAULT_METHOD}}}"])
        meta = run_pretrain(cfg, out, resume=resume, progress=progress, overwrite=overwrite)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    meta = {k: v for k, v in meta.items() if k != "history"} | {"out": out}
    emit(meta, as_json, f"base written to {out}: test accuracy {meta['test_accuracy']:.4f} "
                        f"after {meta['epochs']} epochs on {meta['train_samples']} samples")


@app.command()
def methods(as_json: bool = JSON_OPT) -> None:
    """List the registered methods: what each one is, its capabilities (DP, transforms,
    linear, asynchronous, ...) and its server optimizer (fixed for a preset such as
    fedavgm)."""
    rows = []
    for name, cls in registry.methods().items():
        caps = registry.capabilities_of(cls)
        opt = cls.server_optimizer
        rows.append({"name": name, "summary": (cls.__doc__ or "").strip().split("\n")[0],
                     "capabilities": caps,
                     "server_optimizer": None if opt is None else
                     ("any (default " + opt + ")" if "server_optimizer" in caps
                      else opt + " (fixed)"),
                     "sweep_preset": "sweep_preset" in vars(cls)})
    legend = "\n".join(f"  {k:<17} {v}" for k, v in registry.CAPABILITIES.items())
    text = "\n".join(f"{r['name']:<16} {r['summary']}\n{'':<16} capabilities: "
                     f"{', '.join(r['capabilities']) or 'none'}; server optimizer: "
                     f"{r['server_optimizer'] or 'its own rule'}"
                     f"{'; fedray tune --preset ' + r['name'] if r['sweep_preset'] else ''}"
                     for r in rows)
    emit({"methods": rows, "capabilities": registry.CAPABILITIES}, as_json,
         text + "\n\ncapabilities:\n" + legend)


@app.command("config")
def config_cmd(config: Path | None = typer.Argument(None, help="A config file to resolve."),
               set_: list[str] | None = SET_OPT,
               keys: bool = typer.Option(False, "--keys", help="List every key with its "
                                                               "type and meaning."),
               as_json: bool = JSON_OPT) -> None:
    """Validate a config and print it fully resolved (defaults filled in)."""
    if keys:
        rows = [dataclasses.asdict(k) for k in config_keys()]
        emit({"keys": rows}, as_json, "\n".join(key_line(r) for r in rows))
        return
    try:
        cfg = load_config(config, set_ or [])
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    import yaml

    emit(cfg.to_dict(), as_json, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def key_line(row: dict[str, Any]) -> str:
    """One knob on one line: key, type, default (per method or optimizer where they
    differ), help, and whom it applies to."""
    d = row["default"]
    if isinstance(d, dict) and row["applies_to"] and set(d) == set(row["applies_to"]):
        groups: dict[str, list[str]] = {}
        for owner, v in d.items():
            groups.setdefault(repr(v), []).append(owner)
        d = "; ".join(f"{v} ({', '.join(o)})" for v, o in groups.items())
    else:
        d = repr(d)
    who = f" [{', '.join(row['applies_to'])}]" if row["applies_to"] else ""
    return f"{row['key']:<34} {row['type']:<28} default {d:<14} {row['help']}{who}"


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
    from fedray.core.config import parse_override
    from fedray.core.spec import check_kwargs
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


@fleet_app.command("example")
def fleet_example(out: Path = typer.Option(..., "--out", help="Directory to write "
                                           "devices.csv and availability.csv into."),
                  clients: int = typer.Option(100, "--clients", min=1,
                                              help="Clients in the trace (ids 0..N-1)."),
                  seed: int = typer.Option(0, "--seed", min=0),
                  overwrite: bool = typer.Option(False, "--overwrite", help="Replace "
                                                 "devices.csv and availability.csv if there."),
                  as_json: bool = JSON_OPT) -> None:
    """Write a small heterogeneous example fleet: three device classes (phone, tablet,
    laptop) with log-normal spread, and 2-4 online windows per client over a 24-hour day.
    Use it with -s fleet.trace=OUT/devices.csv -s fleet.availability=OUT/availability.csv
    -s fleet.availability_period_s=86400. Both files are written all or nothing; existing
    ones are kept unless --overwrite."""
    from fedray.services.fleet import write_example

    try:
        devices, avail = write_example(str(out), clients, seed, overwrite=overwrite)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    emit({"devices": devices, "availability": avail}, as_json,
         f"wrote {devices} and {avail}")


@fleet_app.command("import-fedscale")
def fleet_import(capacity: Path = typer.Argument(..., help="FedScale's pickled "
                                                 "client_device_capacity file."),
                 out: Path = typer.Option(..., "--out", help="Directory for the CSV files."),
                 behaviour: Path | None = typer.Option(None, "--behaviour", help="FedScale's "
                                                       "pickled client_behave_trace file."),
                 overwrite: bool = typer.Option(False, "--overwrite", help="Replace ids.csv, "
                                                "devices.csv and availability.csv if there."),
                 as_json: bool = JSON_OPT) -> None:
    """Convert FedScale's pickled device traces to fedray's CSV schema, once: the pickles
    are read with an unpickler that admits plain dicts, lists and numbers only (no class,
    no function: a planted pickle cannot run code); runs read only the CSV files. The files
    are written all or nothing (a bad value anywhere leaves none); existing ones are kept
    unless --overwrite."""
    from fedray.services.fleet import import_fedscale

    try:
        written = import_fedscale(str(capacity), str(out),
                                  str(behaviour) if behaviour else None, overwrite=overwrite)
    except (ConfigError, StateFileError) as e:
        fail(str(e), as_json)
    emit({"written": written}, as_json, "wrote " + ", ".join(written))


def main(argv: list[str] | None = None) -> None:
    """The ``fedray`` entry point: every error, usage errors included, ends in one line (or
    one JSON object with ``--json``) and an exit status of
    :data:`fedray.observe.console.EXIT_CODES` — never a traceback."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    sys.exit(guarded(lambda: _invoke(argv), argv))


def _invoke(argv: list[str]) -> None:
    try:  # typer >= 0.20 ships its own copy of click
        from typer._click import exceptions as click
    except ImportError:
        from click import exceptions as click

    try:
        code = app(args=argv, prog_name="fedray", standalone_mode=False)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
            typer.echo(e.ctx.get_help())
            raise SystemExit(2) from None
        where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        raise UsageError(f"usage: {e.format_message()}{where}") from None
    except click.ClickException as e:
        raise UsageError(e.format_message()) from None
    except typer.Abort:
        raise Stopped("SIGINT", 130) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
