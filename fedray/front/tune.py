"""Hyperparameter sweeps with Ray Tune: any config key, one trial = one whole experiment.

A space maps dotted config keys to one of ``choice``, ``grid``, ``uniform``, ``loguniform``,
``randint`` (from the command line ``KEY=KIND:V1,V2,...`` or a YAML ``sweep: {space: ...}``
block). Each trial reserves one placement group holding its driver and all its executors
(one bundle per executor, shaped like its tier), runs the experiment round by round and
reports every round's metrics, so ASHA can stop weak trials early. Sampled values come
from the experiment's ``seed``, so a sweep is repeatable. Each trial writes an
ordinary fedray run directory, ``runs/trial-NNNNN``.

The trials are fedray's own list (:func:`trial_params`: the grid's values in key order,
``num_samples`` times, each random value drawn from (seed, trial)), stored with the trials
that ended in ``sweep.json``. An interrupted sweep resumes from that file alone: it is data,
not Tune's pickled state (``Tuner.restore`` unpickles ``tuner.pkl``, which would run code
planted in the sweep directory), so ``--resume`` starts a fresh Tuner over the same list.
A trial that ended (finished or stopped by ASHA) replays its stored rounds to the new
scheduler; an unfinished or failed one continues from its own last round checkpoint. The
sweep ends with a table (Parquet + Markdown) of every trial's config and final metrics,
read from the trials' run directories, best first.

Tracking: with ``tracking.tensorboard`` and/or ``tracking.mlflow`` in the base config, the
sweep logs through Tune's own callbacks (``TBXLoggerCallback``: event files in each trial's
Tune directory; ``MLflowLoggerCallback``: one MLflow run per trial, the sampled values as
params, every report as metrics). The trials' own fedray trackers are switched off, so each
trial is logged by Tune. On ``--resume`` a trial that ended before is not logged again; one
that continues from its checkpoint is logged anew, all its rounds, as a new MLflow run (its
interrupted run stays as it was left).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fedray.core import registry
from fedray.core.config import ExperimentConfig, check_name, load_config, read_file
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, redact
from fedray.observe.console import library_stdout
from fedray.observe.progress import Progress

KINDS = ("choice", "grid", "uniform", "loguniform", "randint")
# config keys a sweep may not vary, and why
RESERVED = {"rounds": "a key other than rounds: it is the sweep's time axis (ASHA's), one "
                      "value for every trial",
            "run_dir": "a key other than run_dir: each trial's run is STORAGE/NAME/runs/"
                       "trial-NNNNN"}


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


def _finite_number(v: Any) -> bool:
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an int too big for a float
        return False


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
        if key in RESERVED:
            raise ConfigError(f"sweep.space.{key}", spec, RESERVED[key])
        if kind in ("uniform", "loguniform", "randint"):
            if len(vals) != 2 or not all(_finite_number(v) for v in vals) \
                    or not vals[0] < vals[1]:
                raise ConfigError(f"sweep.space.{key}.{kind}", vals, "[low, high], finite, "
                                                                     "low < high")
            if kind == "loguniform" and vals[0] <= 0:
                raise ConfigError(f"sweep.space.{key}.{kind}", vals, "positive bounds")


def trial_params(spec: SweepSpec, seed: int) -> list[dict[str, Any]]:
    """The sweep's trials, in order: ``num_samples`` times every combination of the grid
    keys' values (the first grid key slowest), each other key drawn from
    ``rng(seed, -1, trial, "sweep-trial")`` in the space's key order — ``choice`` uniformly
    among its values, ``uniform`` on [low, high), ``loguniform`` as exp of a uniform draw
    between the logs, ``randint`` an integer in [low, high) (Tune's conventions). A rule on
    (space, seed) only, so a resumed sweep recomputes the same list."""
    grid = [k for k, v in spec.space.items() if "grid" in v]
    combos = list(itertools.product(*(spec.space[k]["grid"] for k in grid)))
    trials: list[dict[str, Any]] = []
    for _ in range(spec.num_samples):
        for combo in combos:
            gen = rng(seed, -1, len(trials), "sweep-trial")
            params: dict[str, Any] = {}
            for key, kind_vals in spec.space.items():
                kind, vals = next(iter(kind_vals.items()))
                if kind == "grid":
                    params[key] = combo[grid.index(key)]
                elif kind == "choice":
                    params[key] = vals[int(gen.integers(len(vals)))]
                elif kind == "uniform":
                    params[key] = float(gen.uniform(vals[0], vals[1]))
                elif kind == "loguniform":
                    params[key] = float(math.exp(gen.uniform(math.log(vals[0]),
                                                             math.log(vals[1]))))
                else:
                    params[key] = int(gen.integers(vals[0], vals[1]))
            trials.append(params)
    return trials


def _lookup(trials: list[dict[str, Any]], key: str, spec: Any) -> Any:
    return trials[spec.config["trial"]][key]


def tune_space(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Tune's space for fedray's trial list: a grid over the trial indices (``trial``) and
    each swept key looked up from its trial, so Tune's loggers record the swept values."""
    from ray import tune

    return {"trial": tune.grid_search(list(range(len(trials)))),
            **{k: tune.sample_from(partial(_lookup, trials, k)) for k in trials[0]}}


def trial_dir(index: int) -> str:
    return f"trial-{index:05d}"


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
        raise ConfigError("runtime.tiers", [t.name for t in cfg.runtime.tiers],
                          f"tiers whose executors fit one trial on this Ray: a trial needs "
                          f"{short.wanted:g} {short.resource} (1 CPU for the trial and the "
                          f"driver plus every executor) but the cluster has "
                          f"{short.available:g}")


def _finite(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _stored_rows(run_dir: str) -> list[dict[str, float]]:
    """A trial run's stored rounds, each with the metrics carried forward from the rounds
    before it (accuracy is measured only on evaluation rounds); none for a run without any."""
    from fedray.observe.metrics import read_metrics

    try:
        table = read_metrics(run_dir)
    except FileNotFoundError:
        return []
    rows, last = [], {}
    for row in table.to_pylist():
        last = last | _finite(row)
        rows.append(last)
    return rows


def _trial(config: dict, *, base: dict, overrides: list[str], run_root: str, cwd: str,
           ended: frozenset[int]) -> None:
    """One Tune trial: one experiment, reporting after every round. Its run directory is
    ``run_root/trial-NNNNN`` by its index in the sweep's list. A trial that ended in an
    earlier session (``ended``) only replays its stored rounds; any other continues its own
    run, replaying the rounds it already holds first, so the scheduler sees every round.
    Runs in the sweep's working directory (Tune moves trials into their own), so relative
    paths in the config mean what they meant on the command line."""
    from ray import tune

    from fedray.runtime import Experiment, resumable

    os.chdir(cwd)
    params = dict(config)
    index = int(params.pop("trial"))
    cfg = load_config(None, [*overrides, *(override(k, v) for k, v in params.items())],
                      base=base)
    run_dir = os.path.join(run_root, trial_dir(index))

    def report(row: dict[str, float]) -> None:
        tune.report({**row, "rounds_total": cfg.rounds, "run_dir": redact(run_dir)})

    if index in ended:
        for row in _stored_rows(run_dir):
            report(row)
        return
    exp = Experiment(cfg, run_dir, resume=resumable(run_dir, cfg))  # its own run continues
    exp.start()
    try:
        last: dict[str, float] = {}
        for last in _stored_rows(run_dir):
            report(last)
        while not exp.done:
            last = last | _finite(exp.step())
            report(last)
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

    from fedray.core.storage import Storage
    from fedray.runtime import init_ray
    from fedray.runtime.experiment import settled

    cfg, base, overrides, spec = load_sweep(config, overrides, space, preset, **options)
    name = check_name(name or f"sweep-{cfg.name}", "--name")
    storage_path = os.path.abspath(storage_path) if "://" not in storage_path else storage_path
    path = os.path.join(storage_path, name)
    run_root = os.path.join(path, "runs")
    callbacks = tracking_callbacks(cfg, name)  # a bad tracking.* fails here, before Ray
    trials = trial_params(spec, cfg.seed)
    store = Storage(path)
    head = state_head(cfg, trials)
    ended = frozenset(begin_state(store, head, resume, name))  # before Ray: a clash fails
    for cb in callbacks:  # what an ended trial logged in its own session is not logged again
        cb.replayed = ended
    started = init_ray(cfg)
    cfg = settled(cfg)  # device and placement timeout decided once, here, for every trial
    overrides = [*overrides, override("runtime.device", cfg.runtime.device),
                 override("runtime.placement_timeout_s", cfg.runtime.placement_timeout_s),
                 override("tracking.tensorboard", False), override("tracking.mlflow", None)]
    if started or os.environ.get("FEDRAY_CHECK_TRIAL_FITS"):
        check_trial_fits(cfg)  # a fixed-size Ray cannot grow: fail now, not pend forever
    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=base, overrides=overrides, run_root=run_root,
                             cwd=os.getcwd(), ended=ended),
        partial(_resources, tune.PlacementGroupFactory(trial_bundles(cfg), strategy="PACK"),
                ended))
    prog = progress if isinstance(progress, Progress) else Progress(1, enabled=progress)
    with prog.stage(f"sweep {name}", unit="rounds") as stage:
        callbacks += [rounds_callback(stage, cfg.rounds, len(trials)),
                      ended_callback(store, head, ended)]
        scheduler = None
        if spec.scheduler == "asha":
            scheduler = tune.schedulers.ASHAScheduler(
                time_attr="round", max_t=cfg.rounds, grace_period=spec.grace_period,
                reduction_factor=spec.reduction_factor)
        tuner = tune.Tuner(
            trainable, param_space=tune_space(trials),
            tune_config=tune.TuneConfig(
                metric=spec.metric, mode=spec.mode, scheduler=scheduler,
                max_concurrent_trials=spec.max_concurrent),
            run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=0,
                                      callbacks=callbacks))
        with library_stdout():  # Tune prints its experiment table even at verbose=0
            grid = tuner.fit()
    return write_table(grid, spec, trials, cfg.rounds, path)


def _resources(group: Any, ended: frozenset[int], config: dict) -> Any:
    """A trial's placement group: the experiment's, or a sliver of one CPU for a trial that
    ended in an earlier session and only replays its stored rounds."""
    from ray import tune

    return tune.PlacementGroupFactory([{"CPU": 0.01}]) if config["trial"] in ended else group


STATE = "sweep.json"


def state_head(cfg: ExperimentConfig, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``sweep.json`` pins a sweep to: its base config and trial list, as JSON holds
    them (a tuple is a list), so a resume compares like with like."""
    return json.loads(json.dumps({"config": cfg.to_dict(), "trials": trials}))


def _write_state(store: Any, head: dict[str, Any], ended: Iterable[int]) -> None:
    store.write_bytes(STATE, json.dumps({**head, "ended": sorted(ended)},
                                        allow_nan=False).encode())


def begin_state(store: Any, head: dict[str, Any], resume: bool, name: str) -> set[int]:
    """The sweep's state file at its start, before Ray: for ``resume`` read back (as data)
    and checked to hold the same base config and trial list (``head``), else written new.
    Returns the indices of the trials that ended in earlier sessions. Trial runs already in
    the directory are never reused without ``resume``, and never resumed without
    ``sweep.json`` (a sweep written before it kept its state in Tune's pickle, which is not
    read)."""
    where = redact(store.location)
    if resume and store.exists(STATE):
        return _read_state(store, head, name)
    if store.listdir("runs"):
        rule = (f"--resume to continue the sweep {where} holds, or a new name"
                if store.exists(STATE) else
                f"a new name: {where} holds trial runs but no {STATE} to resume them by "
                f"(a sweep's pickled Tune state is not read)")
        raise ConfigError("--name", name, rule)
    _write_state(store, head, ())
    return set()


def _read_state(store: Any, head: dict[str, Any], name: str) -> set[int]:
    from fedray.runtime.experiment import first_difference

    where, rule = redact(store.location), "the sweep's state as fedray writes it"
    state = store.read_json(STATE, rule)
    ended = state.get("ended")
    if not isinstance(ended, list) or not all(
            type(i) is int and 0 <= i < len(head["trials"]) for i in ended):
        raise ConfigError(STATE, f"{where}/{STATE}", f"{rule} ('ended': trial indices)")
    if not isinstance(state.get("config"), dict):
        raise ConfigError(STATE, f"{where}/{STATE}", f"{rule}, with the sweep's config (a "
                                                     f"sweep.json written before it held one "
                                                     f"cannot be resumed: rerun under a new "
                                                     f"name)")
    diff = first_difference(state["config"], head["config"])
    if diff is not None:
        raise ConfigError(diff, name, f"the config of the sweep being resumed: "
                                      f"{where}/{STATE} holds another value")
    if state.get("trials") != head["trials"]:
        raise ConfigError("sweep.space", name, f"the space, seed and num_samples of the "
                                               f"sweep being resumed: {where}/{STATE} lists "
                                               f"other trials")
    return set(ended)


def ended_callback(store: Any, head: dict[str, Any], ended: frozenset[int]) -> Any:
    """A Tune callback (in this process) that adds every trial that ends — all its rounds
    run, or stopped by the scheduler — to ``sweep.json``; a trial that failed stays
    unfinished, so a resumed sweep runs it again from its checkpoint."""
    from ray import tune

    class TrialsEnded(tune.Callback):
        def __init__(self) -> None:
            self.ended = set(ended)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                              **info: Any) -> None:
            self.ended.add(int(trial.config["trial"]))
            _write_state(store, head, self.ended)

    return TrialsEnded()


def rounds_callback(stage: Any, rounds: int, n_trials: int) -> Any:
    """A Tune callback (it runs in this process) that reports the rounds run over all
    trials to ``stage``: done is the rounds the trials ran; the total counts ``rounds`` for
    a trial still running or not started and, for one that ended (finished, stopped early
    by the scheduler, or failed), the rounds it ran — so a sweep whose scheduler stopped
    trials ends at its true count, not at rounds × trials. Tune pickles it with the
    sweep's state (never read back): the stage stays behind."""
    from ray import tune

    class RoundsDone(tune.Callback):
        def __init__(self, stage: Any, rounds: int, n_trials: int) -> None:
            self.stage, self.rounds, self.n_trials = stage, rounds, n_trials
            self.ran: dict[str, int] = {}
            self.ended: set[str] = set()

        def __getstate__(self) -> dict:
            return self.__dict__ | {"stage": None}

        def _report(self, trial: Any, ran: int | None = None, ended: bool = False) -> None:
            if self.stage is None:
                return
            if ran is not None:
                self.ran[trial.trial_id] = max(ran, self.ran.get(trial.trial_id, 0))
            else:
                self.ran.setdefault(trial.trial_id, 0)
            if ended:
                self.ended.add(trial.trial_id)
            unseen = max(self.n_trials - len(self.ran), 0)
            total = sum(r if t in self.ended else self.rounds for t, r in self.ran.items())
            self.stage.report(sum(self.ran.values()), total + unseen * self.rounds,
                              note=f"{len(self.ended)}/{self.n_trials} trials ended")

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                            **info: Any) -> None:
            self._report(trial, int(result.get("round", 0)))

        def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                              **info: Any) -> None:
            self._report(trial, ended=True)

        def on_trial_error(self, iteration: int, trials: list, trial: Any,
                           **info: Any) -> None:
            self._report(trial, ended=True)

    return RoundsDone(stage, rounds, n_trials)


def tracking_callbacks(cfg: ExperimentConfig, name: str) -> list[Any]:
    """Tune's own logger callbacks for the base config's ``tracking`` section: TensorBoard
    (``TBXLoggerCallback``, which Tune also adds by itself unless
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``) and MLflow (``MLflowLoggerCallback`` on the
    checked URI, experiment ``tracking.mlflow_experiment`` or the sweep's name). Each is
    silent for the trials in its ``replayed`` (set by :func:`sweep`: those that ended in an
    earlier session, logged then); a trial that continues from its checkpoint is logged
    again, all its rounds, as a new MLflow run."""
    from fedray.observe.tracking import check_config, mlflow_uri

    t, callbacks = cfg.tracking, []
    check_config(cfg)
    if t.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(_skipping_replays(TBXLoggerCallback)())
    if t.mlflow is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(_skipping_replays(MLflowLoggerCallback)(
            tracking_uri=mlflow_uri(t.mlflow), experiment_name=t.mlflow_experiment or name,
            tags={"fedray.sweep": name}))
    return callbacks


def _skipping_replays(base: type) -> type:
    """``base`` (a Tune ``LoggerCallback``) that logs nothing of the trials in its
    ``replayed``."""

    class SkippingReplays(base):  # type: ignore[misc, valid-type]
        replayed: frozenset[int] = frozenset()

        def _replay(self, trial: Any) -> bool:
            return trial.config.get("trial") in self.replayed

        def log_trial_start(self, trial: Any) -> None:
            if not self._replay(trial):
                super().log_trial_start(trial)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            if not self._replay(trial):
                super().log_trial_result(iteration, trial, result)

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            if not self._replay(trial):
                super().log_trial_end(trial, failed)

    SkippingReplays.__name__ = SkippingReplays.__qualname__ = base.__name__
    return SkippingReplays


def write_table(grid: Any, spec: SweepSpec, trials: list[dict[str, Any]], rounds: int,
                path: str) -> SweepResult:
    """Every trial's config and final metrics (read from its run directory: what it
    stored, whichever session ran it), best first, as Parquet and Markdown. A trial whose
    stored metrics cannot be read says why in its row; the others are kept."""

    from fedray.core.storage import Storage

    keys = list(spec.space)
    rows = []
    for res in grid:
        index = int((res.config or {})["trial"])
        run_dir = os.path.join(path, "runs", trial_dir(index))
        error = str(res.error) if res.error else ""
        try:
            stored = _stored_rows(run_dir)
        except (OSError, ValueError, TypeError) as e:  # damaged part files: its row says so
            stored, error = [], error or f"its metrics could not be read: {e}"
        m = stored[-1] if stored else {}
        rows.append({"trial": trial_dir(index),
                     **{k: json.dumps(trials[index][k]) for k in keys},
                     "rounds": int(m.get("round", 0)),
                     spec.metric: float(m.get(spec.metric, math.nan)),
                     "stopped_early": not error and int(m.get("round", 0)) < rounds,
                     "error": error,
                     "run_dir": redact(run_dir)})
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
