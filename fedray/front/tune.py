"""Hyperparameter sweeps with Ray Tune: any config key, one trial = one whole experiment.

A space maps dotted config keys to one of ``choice``, ``grid``, ``uniform``, ``loguniform``,
``randint`` (from the command line ``KEY=KIND:V1,V2,...`` or a YAML ``sweep: {space: ...}``
block). Each trial reserves one placement group holding its driver and all its executors
(one bundle per executor, shaped like its tier), runs the experiment round by round and
reports every round's metrics, so ASHA can stop weak trials early. Sampled values come
from the experiment's ``seed``, so a sweep is repeatable. Each trial writes an
ordinary fedray run directory; an interrupted sweep resumes with ``Tuner.restore`` and every
unfinished trial continues from its own last round checkpoint. The sweep ends with a table
(Parquet + Markdown) of every trial's config and final metrics, best first.

Tracking: with ``tracking.tensorboard`` and/or ``tracking.mlflow`` in the base config, the
sweep logs through Tune's own callbacks (``TBXLoggerCallback``: event files in each trial's
Tune directory; ``MLflowLoggerCallback``: one MLflow run per trial, the sampled values as
params, every report as metrics). The trials' own fedray trackers are switched off, so each
trial is logged once, by Tune.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fedray.core import registry
from fedray.core.config import ExperimentConfig, check_name, load_config, read_file
from fedray.core.spec import ConfigError, redact
from fedray.observe.console import library_stdout
from fedray.observe.progress import Progress

KINDS = ("choice", "grid", "uniform", "loguniform", "randint")


def presets() -> dict[str, type]:
    """The methods with a sweep preset of their own (``--preset NAME``: the method's
    :meth:`~fedray.methods.base.Algorithm.sweep_preset`)."""
    return {name: m for name, m in registry.methods().items() if "sweep_preset" in vars(m)}


def parse_space_arg(text: str) -> tuple[str, dict]:
    """``KEY=KIND:V1,V2`` → (KEY, {KIND: [V1, V2]}) with YAML-typed values."""
    key, sep, rest = text.partition("=")
    kind, sep2, values = rest.partition(":")
    if not sep or not sep2 or not key:
        raise ConfigError("--space", text, "KEY=KIND:V1,V2,... e.g. algorithm.theta=grid:0,0.5,1")
    return key.strip(), {kind.strip(): [_value(v.strip()) for v in values.split(",")]}


def _value(text: str) -> Any:
    """A number when it reads as one (YAML 1.1 keeps ``1e-3`` a string), else YAML."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    from fedray.core.config import load_yaml

    return load_yaml(text)  # the config loader's YAML: `on` stays a string


def check_space(space: dict[str, dict]) -> None:
    if not space:
        raise ConfigError("sweep.space", space, "at least one key to sweep")
    for key, spec in space.items():
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
            raise ConfigError(f"sweep.space.{key}", spec, f"one of {{{', '.join(KINDS)}: "
                                                          f"[values]}}")
        kind, vals = next(iter(spec.items()))
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"sweep.space.{key}.{kind}", vals, "a non-empty list")
        if kind in ("uniform", "loguniform", "randint"):
            if len(vals) != 2 or not all(isinstance(v, (int, float)) for v in vals) \
                    or not vals[0] < vals[1]:
                raise ConfigError(f"sweep.space.{key}.{kind}", vals, "[low, high], low < high")
            if kind == "loguniform" and vals[0] <= 0:
                raise ConfigError(f"sweep.space.{key}.{kind}", vals, "positive bounds")


def to_tune(spec: dict) -> Any:
    from ray import tune

    kind, vals = next(iter(spec.items()))
    if kind == "choice":
        return tune.choice(vals)
    if kind == "grid":
        return tune.grid_search(vals)
    return {"uniform": tune.uniform, "loguniform": tune.loguniform,
            "randint": tune.randint}[kind](*vals)


def _representatives(spec: dict) -> list[Any]:
    kind, vals = next(iter(spec.items()))
    return list(vals) if kind in ("choice", "grid") else [vals[0]]


def override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"


@dataclass
class SweepSpec:
    """What to sweep and how: the space plus Tune's knobs."""

    space: dict[str, dict]
    metric: str = "global_accuracy"
    mode: str = "max"
    num_samples: int = 1
    max_concurrent: int = 1
    scheduler: str = "asha"
    grace_period: int = 1
    reduction_factor: int = 2

    def validate(self, cfg: ExperimentConfig, base: dict, overrides: list[str]) -> None:
        check_space(self.space)
        if self.mode not in ("max", "min"):
            raise ConfigError("sweep.mode", self.mode, "max or min")
        if self.scheduler not in ("asha", "none"):
            raise ConfigError("sweep.scheduler", self.scheduler, "asha or none")
        for name in ("num_samples", "max_concurrent", "grace_period"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sweep.{name}", getattr(self, name), "at least 1")
        if self.grace_period > cfg.rounds:
            raise ConfigError("sweep.grace_period", self.grace_period,
                              f"at most rounds = {cfg.rounds}")
        for key, spec in self.space.items():  # every value must make a valid experiment
            for v in _representatives(spec):
                load_config(None, [*overrides, override(key, v)], base=base)


def load_sweep(config: str | os.PathLike | dict, overrides: Iterable[str] = (),
               space: dict[str, dict] | None = None, preset: str | None = None,
               **options: Any) -> tuple[ExperimentConfig, dict, list[str], SweepSpec]:
    """The base experiment (validated, without its ``sweep`` block) and the sweep spec:
    the file's ``sweep`` block, then a preset's space, then ``space``, then ``options``."""
    data = dict(config) if isinstance(config, dict) else read_file(config)
    block = dict(data.pop("sweep", None) or {})
    overrides = list(overrides)
    cfg = load_config(None, overrides, base=data)
    merged = dict(block.pop("space", None) or {})
    if preset is not None:
        found = presets()
        if preset not in found:
            raise ConfigError("--preset", preset, "one of " + ", ".join(found))
        merged |= found[preset].sweep_preset(cfg)
    merged |= space or {}
    known = {f.name for f in SweepSpec.__dataclass_fields__.values()} - {"space"}
    unknown = set(block) - known
    if unknown:
        raise ConfigError("sweep", sorted(unknown)[0], "one of " + ", ".join(sorted(known)))
    spec = SweepSpec(merged, **(block | {k: v for k, v in options.items() if v is not None}))
    spec.validate(cfg, data, overrides)
    return cfg, data, overrides, spec


TRIAL_CPU = 1.0  # the trial function's process (the driver actor itself asks for none)


def trial_bundles(cfg: ExperimentConfig) -> list[dict[str, float]]:
    """One bundle for the trial (its process and the driver), one per executor shaped by
    :func:`fedray.runtime.pool.executor_bundle` of the sweep's settled config (so a tier
    asks for a GPU exactly when its executors do)."""
    from fedray.runtime.pool import executor_bundle

    bundles = [{"CPU": TRIAL_CPU}]
    for t in cfg.runtime.tiers:
        bundles += [executor_bundle(cfg, t)] * t.executors
    return [b or {"CPU": 0.01} for b in bundles]


def check_trial_fits(cfg: ExperimentConfig) -> None:
    """Raise when one trial's placement group can never fit this cluster's resources."""
    from fedray.runtime.pool import shortfall

    short = shortfall(cfg, extra_cpu=TRIAL_CPU)
    if short is not None:
        k, v, have = short
        raise ConfigError("runtime.tiers", [t.name for t in cfg.runtime.tiers],
                          f"tiers whose executors fit one trial on this Ray: a trial needs "
                          f"{v:g} {k} (1 CPU for the trial and the driver plus every "
                          f"executor) but the cluster has {have:g}")


def _finite(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _trial(params: dict, *, base: dict, overrides: list[str], run_root: str, cwd: str
           ) -> None:
    """One Tune trial: one experiment, reporting after every round; resumes its own run.
    Runs in the sweep's working directory (Tune moves trials into their own), so relative
    paths in the config mean what they meant on the command line."""
    from ray import tune

    from fedray.runtime import Experiment, resumable

    os.chdir(cwd)

    cfg = load_config(None, [*overrides, *(override(k, v) for k, v in params.items())],
                      base=base)
    ctx = tune.get_context()
    run_dir = os.path.join(run_root, ctx.get_trial_id())
    exp = Experiment(cfg, run_dir, resume=resumable(run_dir, cfg))  # its own run continues
    exp.start()
    last: dict[str, float] = {}
    try:
        if exp.done:  # all rounds ran before the sweep was interrupted: report them again
            from fedray.observe.metrics import read_metrics

            for row in read_metrics(run_dir).to_pylist():
                last |= _finite(row)
            tune.report({**last, "rounds_total": cfg.rounds, "run_dir": redact(run_dir)})
        while not exp.done:
            row = _finite(exp.step())
            last |= row  # accuracy carried forward between evaluation rounds
            tune.report({**last, "rounds_total": cfg.rounds, "run_dir": redact(run_dir)})
        exp.close()
    finally:
        exp.release()


@dataclass
class SweepResult:
    table: Any
    best_config: dict[str, Any]
    best_metric: float
    parquet: str
    markdown: str
    path: str


def sweep(config: str | os.PathLike | dict, space: dict[str, dict] | None = None, *,
          overrides: Iterable[str] = (), preset: str | None = None,
          storage_path: str = "runs/sweeps", name: str | None = None,
          resume: bool = False, progress: bool | Progress = True,
          **options: Any) -> SweepResult:
    """Run (or, with ``resume``, continue) a sweep and write its result table. When this
    call starts Ray (or ``FEDRAY_CHECK_TRIAL_FITS`` is set, for a fixed-size cluster you
    started), a trial that can never fit the cluster fails here instead of pending. The
    sweep is one stage of ``progress`` (a job's, or a display of its own when True),
    counted in rounds over all trials (a trial stopped early counts as finished)."""
    from ray import tune

    from fedray.runtime import init_ray
    from fedray.runtime.experiment import settled

    cfg, base, overrides, spec = load_sweep(config, overrides, space, preset, **options)
    name = check_name(name or f"sweep-{cfg.name}", "--name")
    storage_path = os.path.abspath(storage_path) if "://" not in storage_path else storage_path
    path = os.path.join(storage_path, name)
    run_root = os.path.join(path, "runs")
    callbacks = tracking_callbacks(cfg, name)  # a bad tracking.* fails here, before Ray
    started = init_ray(cfg)
    cfg = settled(cfg)  # device and placement timeout decided once, here, for every trial
    overrides = [*overrides, override("runtime.device", cfg.runtime.device),
                 override("runtime.placement_timeout_s", cfg.runtime.placement_timeout_s),
                 override("tracking.tensorboard", False), override("tracking.mlflow", None)]
    if started or os.environ.get("FEDRAY_CHECK_TRIAL_FITS"):
        check_trial_fits(cfg)  # a fixed-size Ray cannot grow: fail now, not pend forever
    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=base, overrides=overrides, run_root=run_root,
                             cwd=os.getcwd()),
        tune.PlacementGroupFactory(trial_bundles(cfg), strategy="PACK"))
    prog = progress if isinstance(progress, Progress) else Progress(1, enabled=progress)
    with prog.stage(f"sweep {name}", unit="rounds") as stage:
        if resume and tune.Tuner.can_restore(path):  # its callbacks are the pickled ones
            tuner = tune.Tuner.restore(path, trainable, resume_unfinished=True,
                                       resume_errored=True)
        else:
            callbacks.append(rounds_callback(stage, cfg.rounds, trial_count(spec)))
            scheduler = None
            if spec.scheduler == "asha":
                scheduler = tune.schedulers.ASHAScheduler(
                    time_attr="round", max_t=cfg.rounds, grace_period=spec.grace_period,
                    reduction_factor=spec.reduction_factor)
            tuner = tune.Tuner(
                trainable, param_space={k: to_tune(v) for k, v in spec.space.items()},
                tune_config=tune.TuneConfig(
                    metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
                    scheduler=scheduler, max_concurrent_trials=spec.max_concurrent,
                    search_alg=tune.search.BasicVariantGenerator(random_state=cfg.seed)),
                run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=0,
                                          callbacks=callbacks))
        with library_stdout():  # Tune prints its experiment table even at verbose=0
            grid = tuner.fit()
    return write_table(grid, spec, path)


def trial_count(spec: SweepSpec) -> int:
    """How many trials the sweep runs: ``num_samples`` times each grid's values."""
    return spec.num_samples * math.prod(len(v["grid"]) for v in spec.space.values()
                                        if "grid" in v)


def rounds_callback(stage: Any, rounds: int, n_trials: int) -> Any:
    """A Tune callback (it runs in this process) that reports the rounds done over all
    trials to ``stage``: a trial's latest round, all of its rounds once it ended. Tune
    pickles it with the sweep's state: the stage stays behind (a restored sweep shows the
    stage's start and end only)."""
    from ray import tune

    class RoundsDone(tune.Callback):
        def __init__(self, stage: Any, rounds: int, n_trials: int) -> None:
            self.stage, self.rounds, self.n_trials = stage, rounds, n_trials
            self.done: dict[str, int] = {}

        def __getstate__(self) -> dict:
            return self.__dict__ | {"stage": None}

        def _report(self, trial: Any, done: int) -> None:
            if self.stage is None:
                return
            self.done[trial.trial_id] = done
            ended = sum(v == self.rounds for v in self.done.values())
            self.stage.report(sum(self.done.values()),
                              self.rounds * max(self.n_trials, len(self.done)),
                              note=f"{ended}/{self.n_trials} trials ended")

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                            **info: Any) -> None:
            self._report(trial, int(result.get("round", 0)))

        def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                              **info: Any) -> None:
            self._report(trial, self.rounds)

        def on_trial_error(self, iteration: int, trials: list, trial: Any,
                           **info: Any) -> None:
            self._report(trial, self.rounds)

    return RoundsDone(stage, rounds, n_trials)


def tracking_callbacks(cfg: ExperimentConfig, name: str) -> list[Any]:
    """Tune's own logger callbacks for the base config's ``tracking`` section: TensorBoard
    (``TBXLoggerCallback``, which Tune also adds by itself unless
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``) and MLflow (``MLflowLoggerCallback`` on the
    checked URI, experiment ``tracking.mlflow_experiment`` or the sweep's name)."""
    from fedray.observe.tracking import check_config, mlflow_uri

    t, callbacks = cfg.tracking, []
    check_config(cfg)
    if t.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(TBXLoggerCallback())
    if t.mlflow is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(
            tracking_uri=mlflow_uri(t.mlflow), experiment_name=t.mlflow_experiment or name,
            tags={"fedray.sweep": name}))
    return callbacks


def write_table(grid: Any, spec: SweepSpec, path: str) -> SweepResult:
    """Every trial's config and final metrics, best first, as Parquet and Markdown."""

    from fedray.core.storage import Storage

    keys = list(spec.space)
    rows = []
    for res in grid:
        m = res.metrics or {}
        cfg = res.config or {}
        rows.append({"trial": os.path.basename(str(res.path)),
                     **{k: json.dumps(cfg.get(k)) for k in keys},
                     "rounds": int(m.get("round", 0)),
                     spec.metric: float(m.get(spec.metric, math.nan)),
                     "stopped_early": int(m.get("round", 0)) < int(m.get("rounds_total", 0)),
                     "error": str(res.error) if res.error else "",
                     "run_dir": m.get("run_dir", "")})
    sign = -1 if spec.mode == "max" else 1
    rows.sort(key=lambda r: (math.isnan(r[spec.metric]), sign * r[spec.metric]
                             if not math.isnan(r[spec.metric]) else 0))
    storage = Storage(path)
    storage.write_parquet("sweep.parquet", rows)
    best = rows[0] if rows else {}
    best_config = {k: json.loads(best[k]) for k in keys} if best else {}
    cols = ["trial", *keys, "rounds", "stopped_early", spec.metric, "error"]
    lines = [f"# Sweep {os.path.basename(path)}", "",
             f"Best {spec.metric} ({spec.mode}): {best.get(spec.metric, math.nan):.4f} with "
             + ", ".join(f"`{k}={v}`" for k, v in best_config.items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c])
                                       for c in cols) + " |")
    storage.write_bytes("SWEEP.md", ("\n".join(lines) + "\n").encode())
    return SweepResult(rows, best_config, float(best.get(spec.metric, math.nan)),
                       os.path.join(path, "sweep.parquet"), os.path.join(path, "SWEEP.md"),
                       path)
