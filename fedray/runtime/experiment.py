"""Run one experiment end to end: validate, build the federated data, start or join Ray,
place the driver and executors, run the rounds with a progress display, write the summary.

Everything that can be wrong with the input fails here, before any Ray work.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import yaml

import fedray.runtime.warm as warm
from fedray.core import checkpoint
from fedray.core.config import (
    ExperimentConfig,
    as_stored,
    load_config,
    migrate_stored,
    parse_text,
)
from fedray.core.spec import ConfigError, redact, shown
from fedray.core.storage import Storage, read_marker
from fedray.methods.base import cohort_size
from fedray.observe.console import Stopped, interrupted
from fedray.observe.metrics import json_text
from fedray.observe.progress import Progress
from fedray.observe.tracking import Tracker
from fedray.runtime.rows import GLOBAL_EXTRAS


def default_run_dir(cfg: ExperimentConfig) -> str:
    return os.path.join("runs", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")


_STARTED_LOCAL = False  # this process started the Ray it is connected to


def init_ray(cfg: ExperimentConfig) -> bool:
    """Join ``runtime.ray_address`` / ``RAY_ADDRESS`` or start a fresh local instance (never
    a stale one from ``/tmp/ray/ray_current_cluster``). Returns True when this call started
    Ray; :func:`ray_is_local` tells later callers that the Ray they share cannot grow.
    Unless verbose (``-v``), every worker hides the libraries' progress bars and harmless
    warnings (:func:`fedray.observe.console.worker_runtime_env`)."""
    global _STARTED_LOCAL
    import ray

    from fedray.observe.console import reclaim_signals, worker_runtime_env

    if ray.is_initialized():
        return False
    address = cfg.runtime.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address, "runtime.ray_address" if cfg.runtime.ray_address
                        else "RAY_ADDRESS")
        ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                 runtime_env=worker_runtime_env())
        reclaim_signals()
        _STARTED_LOCAL = False
        return False
    ray.init(address="local", include_dashboard=cfg.runtime.include_dashboard,
             log_to_driver=False, logging_level="ERROR", configure_logging=True,
             runtime_env=worker_runtime_env())
    reclaim_signals()
    _STARTED_LOCAL = True
    return True


def check_reachable(address: str, field: str, timeout: float = 10.0) -> None:
    """Fail in seconds, not hang, when nothing listens at a ``host:port`` Ray address
    (``ray.init`` waits for a dead head indefinitely). ``auto`` and other forms are left
    to Ray."""
    import socket

    hostport = address.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]  # no user info
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(field, address, f"the address of a running Ray cluster: nothing "
                                          f"answered at {host}:{port} ({e})") from None


def ray_is_local() -> bool:
    """True when the connected Ray was started by this process's :func:`init_ray`: one
    machine, no autoscaler, so what it has now is all it will ever have."""
    import ray

    return _STARTED_LOCAL and ray.is_initialized()


def check_before_ray(cfg: ExperimentConfig) -> None:
    """When this process will start a local Ray (no ``runtime.ray_address``, no
    ``RAY_ADDRESS``, none connected), the executors must fit what that Ray will have — this
    machine's CPUs and GPUs and no custom resources — checked before it starts (a
    :class:`ConfigError`; :func:`settled` checks again against the started Ray)."""
    import ray

    if cfg.runtime.ray_address or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
        return
    from fedray.runtime.devices import local_resources, settle_runtime
    from fedray.runtime.pool import check_fits

    have = local_resources()
    check_fits(settle_runtime(cfg, True, have), have)


def settled(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with the per-run runtime decisions taken once against the connected Ray
    (:func:`fedray.runtime.devices.settle_runtime`); on a fixed local Ray, executors that
    can never be placed fail here."""
    import ray

    from fedray.runtime.devices import settle_runtime
    from fedray.runtime.pool import check_fits, requested_resources

    local, resources = ray_is_local(), ray.cluster_resources()
    cfg = settle_runtime(cfg, local, resources)
    if local:
        check_fits(cfg)
    else:
        want, have = requested_resources(cfg)["GPU"], resources.get("GPU", 0)
        if want > have:
            print(f"fedray: the executors ask for {want:g} GPU, the cluster has {have:g} now; "
                  f"waiting up to runtime.placement_timeout_s="
                  f"{cfg.runtime.placement_timeout_s:g}s for the autoscaler (runtime.device="
                  f"cpu runs on CPUs instead)", file=sys.stderr, flush=True)
    return cfg


def head_node_id() -> str:
    """The Ray head node's id (the node that outlives the workers), else this process's."""
    import ray

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return ray.get_runtime_context().get_node_id()


class Experiment:
    """One experiment's lifetime: ``start()`` places the driver and executors, ``step()``
    runs one round, ``close()`` writes the summary and releases everything.

    Validation and data building happen in ``__init__``, before any Ray work.
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: str | None = None, *,
                 resume: bool = False, algorithm_cls: type | None = None,
                 data: Any | None = None, overwrite: bool = False):
        from fedray.core import registry

        self.cfg, self.resume = cfg, resume
        self.given = cfg  # as given: config.yaml stores it, not the settled one start uses
        self.algorithm_cls = algorithm_cls or registry.method(cfg.algorithm["name"])
        if algorithm_cls is not None:  # the registered one was checked when cfg was loaded
            algorithm_cls.check(cfg)
        self.run_dir = run_dir or cfg.run_dir or default_run_dir(cfg)
        self.storage = open_run_dir(self.run_dir)
        self.locked = False
        # a new run that fails before any round is on record removes the directory it made
        self.created = not resume and self.storage.is_local and \
            not os.path.lexists(self.storage.root)
        states = None
        if resume:  # a missing config or a damaged or planted checkpoint fails here
            if not self.storage.exists("config.yaml"):
                raise ConfigError("--resume", self.run_dir, "a run directory holding "
                                                            "config.yaml")
            self.storage.check_no_links()
            states = checkpoint.read(self.storage)
        elif not overwrite and not self.storage.is_empty():
            raise ConfigError("run_dir", self.run_dir, "an empty or new directory (this one "
                              "holds files: --resume continues the run in it, --overwrite "
                              "replaces it)")
        # --overwrite replaces an old run only once this one has started (Ray reached,
        # executors placed): a run that fails to start leaves the old one as it was
        self.replacing = overwrite and not resume and check_replaceable(self.storage,
                                                                        self.run_dir)
        self.deleting = False
        check_before_ray(cfg)
        self.tracker = Tracker.of(cfg, self.run_dir)  # tracking.*: checked before any work
        self.data = self.algorithm_cls.build_data(cfg) if data is None else data
        if self.data.num_clients != cfg.clients.num_clients:
            raise ConfigError("data", self.data.num_clients, f"prebuilt data for "
                                                             f"{cfg.clients.num_clients} clients")
        self.algorithm_cls.check_data(cfg, self.data)
        for section in cfg.sections.values():  # a registered section's checks on the data
            if hasattr(section, "check_data"):
                section.check_data(cfg, self.data)
        if states is not None:
            check_state_shapes(self.algorithm_cls, cfg, self.data, states, self.run_dir)
        # runtime.vectorize decided once, from the config and the data's shape
        self.cohort = cohort_size(cfg, self.algorithm_cls, self.data.input_shape,
                                  self.data.num_classes)
        self.driver: Any = None
        self.pool: Any = None
        self.failed = False  # a round raised: nothing of this run is kept warm
        self.ready = False  # started: the driver and executors are set up
        self.started_ray = False
        self.round = 0
        self.rows: list[dict] = []
        self.t_start = time.perf_counter()
        self.locked = acquire_lock(self.storage)
        if not resume and not self.replacing:
            try:
                self._write_run_files()
            except BaseException:
                self.discard()
                raise

    def _write_run_files(self) -> None:
        """A new run's files. Under ``--overwrite`` the old run's files go first, checked
        again (:func:`check_replaceable`: minutes may have passed since) and ``config.yaml``
        last, so a replacement stopped half-way is still a run ``--overwrite`` accepts; a
        killed writer's temp files go in any case."""
        if self.replacing:
            check_replaceable(self.storage, self.run_dir)
            self.deleting = True
        old = [n for n in self.storage.listdir("") if STALE_TEMP.fullmatch(n) or
               (self.replacing and n in RUN_NAMES and n != LOCK)]
        for name in sorted(old, key=lambda n: n == "config.yaml"):
            self.storage.delete(name)
        self.replacing = self.deleting = False
        self.storage.write_bytes("config.yaml", yaml.safe_dump(
            self.given.to_dict(), sort_keys=False).encode())
        self.storage.write_bytes("data.json", json_text(self.data.summary()).encode())
        if hasattr(self.data, "partition_table"):  # the partition, computed once
            self.storage.write_parquet("partition.parquet", self.data.partition_table())

    def _record_rounds(self) -> None:
        """A resume that raised ``rounds`` writes it into ``config.yaml`` (the one key a
        resume may change), so the run directory says how far the run goes: a later
        ``--resume`` continues to it, and ``-s rounds=N`` below it is refused."""
        stored = stored_config(self.storage)
        if stored.get("rounds") != self.given.rounds:
            self.storage.write_bytes("config.yaml", yaml.safe_dump(
                {**stored, "rounds": self.given.rounds}, sort_keys=False).encode(),
                durable=True)

    def stopped(self, e: BaseException) -> Stopped:
        """The :class:`Stopped` a signal ends this run with: which signal, the last
        checkpointed round and the command that continues from it."""
        name, code = (e.signal_name, e.code) if isinstance(e, Stopped) else ("SIGINT", 130)
        if getattr(self, "deleting", False):
            return Stopped(name, code, redact(
                f"{self.cfg.name} stopped by {name} while it replaced the run in "
                f"{self.run_dir}, part of which is deleted (run the same command again: "
                f"--overwrite finishes the replacement)"))
        if getattr(self, "replacing", False):  # stopped before it replaced the old run
            return Stopped(name, code, redact(
                f"{self.cfg.name} stopped by {name} before it started; the run in "
                f"{self.run_dir} was left as it was (run the same command again)"))
        try:
            last = self.storage.latest_index()
        except (ValueError, OSError):
            last = None
        if last is None:
            where = ("before its first checkpoint; its new run directory was removed (run "
                     "the same command again)" if not os.path.isdir(self.storage.root) else
                     f"before its first checkpoint (nothing to resume in {self.run_dir})")
        else:
            where = (f"after round {last} was checkpointed; continue with: fedray run "
                     f"--resume {self.run_dir}")
        return Stopped(name, code, redact(f"{self.cfg.name} stopped by {name} {where}"))

    def discard(self) -> None:
        """After a failure: remove the run directory when this run created it and recorded
        no round yet (a failure while starting: Ray, placement, the driver's setup), so the
        same command can simply be run again; a directory that held anything before, or a
        run with a round on record (a failed round's rows say why) is kept as it is. Its
        driver and executors are never kept warm (a signal may have stopped them mid-call)."""
        self.failed = True
        self.release()
        if not self.created or not os.path.isdir(self.storage.root):
            return
        try:
            if self.storage.exists("checkpoints/LATEST") or self.storage.exists("metrics"):
                return
        except ValueError:  # a planted link: leave it for the user
            return
        import shutil

        shutil.rmtree(self.storage.root, ignore_errors=True)
        self.created = False

    def start(self) -> dict:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from fedray.runtime.driver import Driver
        from fedray.runtime.pool import ExecutorPool

        self.t_start = time.perf_counter()
        self.started_ray = init_ray(self.cfg)
        try:
            self.cfg = settled(self.cfg)
        except Exception:
            self.release()
            raise
        keep = self.cfg.runtime.keep_warm
        head = head_node_id()
        self.driver_key = warm.shape_key("driver", {"node": head}, {})
        wanted: dict[str, int] = {self.driver_key: 1} if keep else {}
        if keep:
            for tier in self.cfg.runtime.tiers:
                key = ExecutorPool.warm_key_of(self.cfg, tier)
                wanted[key] = wanted.get(key, 0) + tier.executors
        warm.retain(wanted)  # idle actors this run cannot use free their resources first
        self.pool = ExecutorPool(self.cfg, self.algorithm_cls, ray.put(self.data),
                                 self.storage.location, warm=keep)
        args = (self.cfg, self.algorithm_cls, self.pool, self.storage.location, self.cohort)
        # the driver lives on the head node (where a submitted job's entry point runs):
        # losing a worker node never takes the round loop with it
        new_driver = ray.remote(Driver).options(
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
        self.driver = warm.take(self.driver_key) if keep else None
        if self.driver is None:
            self.driver = new_driver.remote(*args)
        else:
            try:
                ray.get(self.driver.reset.remote(*args))
            except ray.exceptions.RayActorError:  # a warm driver that died while idle
                self.driver = new_driver.remote(*args)
            except Exception:
                self.release()
                raise
        try:
            self.info = ray.get(self.driver.setup.remote(self.resume))
            if self.replacing:
                self._write_run_files()
            if self.resume:
                self._record_rounds()
            if self.tracker is not None:
                self.tracker.start(self.cfg.to_dict(), self.info["round"])
        except Exception:
            self.release()
            raise
        self.round = self.info["round"]
        self.ready = True
        return self.info

    @property
    def done(self) -> bool:
        return self.round >= self.cfg.rounds

    def step(self) -> dict:
        import ray

        from fedray.runtime.jobs import RoundFailedError

        try:
            row = ray.get(self.driver.run_round.remote())
        except ray.exceptions.RayTaskError as e:
            self.failed = True
            if isinstance(e.cause, RoundFailedError):
                raise e.cause from None
            raise
        except BaseException:
            self.failed = True
            raise
        self.round = row["round"]
        self.rows.append(row)
        if self.tracker is not None:
            self.tracker.log_round(row)
        return row

    def close(self) -> dict[str, Any]:
        import ray

        finish = ray.get(self.driver.finish.remote())
        summary = _summary(self.cfg, self.run_dir, self.rows, finish, self.info,
                           time.perf_counter() - self.t_start)
        summary |= self.algorithm_cls.summarize(self.cfg, self.run_dir)
        self.storage.write_bytes("summary.json", json_text(summary, indent=2).encode())
        if self.tracker is not None:
            self.tracker.close(summary)
        self.release()  # parks the driver and executors with keep_warm (at_rest)
        return summary

    def _park(self) -> None:
        """Hand the driver and the executors this process created back to
        :mod:`fedray.runtime.warm`, emptied; replacements the driver created are killed
        (they would die with it). Anything that fails here is left to :meth:`release`."""
        import ray

        handles = ray.get(self.driver.executor_handles.remote())
        tier_keys = {t.name: self.pool.warm_key(t.name) for t in self.cfg.runtime.tiers}
        mine = {a._actor_id for hs in self.pool.executors.values() for a in hs}
        keep = [(tier, a) for tier, hs in handles.items() for a in hs if a._actor_id in mine]
        for hs in handles.values():
            for a in hs:
                if a._actor_id not in mine:
                    ray.kill(a)
        refs = [self.driver.release.remote()] + [a.release.remote() for _, a in keep]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
        try:
            ray.get(done)
        except Exception:  # noqa: BLE001 — one of them is gone: release() kills the rest
            return
        if len(done) < len(refs):
            return
        for tier, a in keep:
            warm.give(tier_keys[tier], a)
        warm.give(self.driver_key, self.driver)
        self.driver = self.pool = None

    def at_rest(self) -> bool:
        """With ``keep_warm``, whether :meth:`release` parks the driver and executors: a run
        that started, failed nowhere and either finished or stopped between steps with no
        client in flight (a synchronous loop; an asynchronous one always has some), so
        the next run — or this one's resume — in this process starts warm."""
        import ray

        if not (self.cfg.runtime.keep_warm and self.ready and not self.failed
                and self.driver is not None and self.pool is not None):
            return False
        if self.done:
            return True
        try:
            return bool(ray.get(self.driver.at_rest.remote(), timeout=60))
        except Exception:  # noqa: BLE001 — a driver that cannot say is not kept
            return False

    def release(self) -> None:
        import ray

        if self.at_rest():
            self._park()
        if self.tracker is not None:  # no-op after close(); else the tracked run FAILED
            try:
                self.tracker.close()
            except Exception as e:  # noqa: BLE001 — never hides why the run stopped
                print(f"fedray: closing the experiment tracker failed: {redact(str(e))}",
                      file=sys.stderr)
        if self.driver is not None:
            try:
                ray.get(self.driver.shutdown.remote())
            except Exception:  # noqa: BLE001 — the driver may already be gone
                pass
            ray.kill(self.driver)
            self.driver = None
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        if self.started_ray and not self.cfg.runtime.keep_warm:
            ray.shutdown()
            self.started_ray = False
        if self.locked:  # last: nothing of this run writes any more
            release_lock(self.storage)
            self.locked = False


def run_experiment(cfg: ExperimentConfig, run_dir: str | None = None, *, resume: bool = False,
                   progress: bool | Progress = True, algorithm_cls: type | None = None,
                   on_round: Callable[[dict], None] | None = None,
                   data: Any | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Run ``cfg`` (or continue the run in ``run_dir`` when ``resume``); return the summary.
    ``data`` is ``build_data(cfg)`` when the caller already holds it (several methods on
    one corpus build it once). A new run needs an empty or new ``run_dir`` unless
    ``overwrite``, which replaces a fedray run there (:func:`check_replaceable`) once the
    new run has started. The rounds are one stage of
    ``progress`` (a job's :class:`~fedray.observe.progress.Progress`, or a display of its own when
    True) named after the run."""
    prog = progress if isinstance(progress, Progress) else Progress(1, enabled=progress)
    exp = Experiment(cfg, run_dir, resume=resume, algorithm_cls=algorithm_cls, data=data,
                     overwrite=overwrite)
    try:
        with prog.stage(cfg.name, unit="rounds") as stage:
            exp.start()  # Ray, the driver and the executors: part of the stage's time
            stage.report(exp.round, cfg.rounds)
            while not exp.done:
                row = exp.step()
                stage.report(exp.round, note=_note(row))
                if on_round is not None:
                    on_round(row)
        return exp.close()
    except BaseException as e:
        stop = interrupted(e)  # a signal inside Ray's compiled code comes out wrapped
        exp.discard()
        if stop is not None:
            raise exp.stopped(stop) from None
        raise
    finally:
        exp.release()


def _note(row: dict) -> str:
    """The round's loss and, when evaluated, accuracies (the progress line's tail)."""
    note = []
    for key, short, fmt in (("train_loss", "loss", ".4g"), ("global_accuracy", "acc", ".4f"),
                            ("personalized_accuracy", "pacc", ".4f")):
        if not math.isnan(row[key]):
            note.append(f"{short} {row[key]:{fmt}}")
    if row["failed"] or row["rejected"]:
        note.append(f"failed {row['failed'] + row['rejected']}")
    return " ".join(note)


def _summary(cfg: ExperimentConfig, run_dir: str, rows: list[dict], finish: dict,
             info: dict, seconds: float) -> dict[str, Any]:
    from fedray.observe.metrics import read_metrics

    table = read_metrics(run_dir, "rounds").to_pylist()
    evals = [r for r in table if not math.isnan(r["global_accuracy"])]
    last = table[-1] if table else {}
    final_eval = evals[-1] if evals else {}

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and math.isnan(v) else v

    loc = cfg.local
    if loc.dp_noise_multiplier is not None:
        from fedray.models.training import DPSGD

        dp_sgd = {"dp_sgd": DPSGD(loc.dp_noise_multiplier, loc.dp_max_grad_norm,
                                  loc.dp_delta).summary()}
    else:
        dp_sgd = {}

    return {
        "name": cfg.name, "run_dir": redact(run_dir), "algorithm": cfg.algorithm["name"],
        "model": cfg.model["name"], "dataset": cfg.data.dataset,
        "num_clients": cfg.clients.num_clients, "rounds": finish["round"],
        "parameters": info["parameters"],
        "model_parameters": info["executors"][0].get("model_parameters"),
        "final_global_accuracy": clean(final_eval.get("global_accuracy", math.nan)),
        # what that accuracy was scored on: eval.global_test_set and the rows it held
        "global_test_set": cfg.eval.global_test_set,
        "final_global_n": clean(final_eval.get("global_n", math.nan)),
        "final_personalized_accuracy": clean(final_eval.get("personalized_accuracy",
                                                            math.nan)),
        "final_personalized_accuracy_std": clean(final_eval.get("personalized_accuracy_std",
                                                                math.nan)),
        "best_global_accuracy": clean(max((r["global_accuracy"] for r in evals),
                                          default=math.nan)),
        # a task's own headline scores (FLAIR's averaged precision, TFF's perplexity)
        **{f"final_global_{k}": clean(final_eval[f"global_{k}"]) for k in GLOBAL_EXTRAS
           if f"global_{k}" in final_eval},
        "total_upload_bytes": finish["totals"]["upload_bytes"],
        "total_download_bytes": finish["totals"]["download_bytes"],
        "client_failures": finish["totals"]["failures"],
        "rejected_uploads": finish["totals"]["rejected"],
        "executor_restarts": finish["executor_restarts"],
        "simulated_hours": round(finish.get("sim_seconds", 0.0) / 3600, 6),
        "failed_rounds": finish.get("failed_rounds", 0),
        "final_train_loss": clean(last.get("train_loss", math.nan)),
        "wall_seconds": round(seconds, 3),
        "rounds_this_session": len(rows),
        **({"dp": finish["privacy"]} if finish.get("privacy") else {}),
        **dp_sgd,
        **_adversary_summary(cfg, run_dir, final_eval),
        **_secagg_summary(cfg, run_dir, finish["totals"]),
    }


def _secagg_summary(cfg: ExperimentConfig, run_dir: str, totals: dict[str, int]
                    ) -> dict[str, Any]:
    """``{"secagg": ...}`` with secure aggregation
    (:func:`fedray.services.secure_round.secagg_summary`), else nothing."""
    if not cfg.secagg.enabled:
        return {}
    from fedray.observe.metrics import read_metrics
    from fedray.services.secure_round import secagg_summary

    return {"secagg": secagg_summary(cfg, read_metrics(run_dir, "rounds"),
                                     totals.get("protocol_bytes", 0),
                                     totals["upload_bytes"] + totals["download_bytes"])}


def _adversary_summary(cfg: ExperimentConfig, run_dir: str, final_eval: dict
                       ) -> dict[str, Any]:
    """``{"adversary": ...}`` when the run has malicious clients
    (:func:`fedray.methods.robust.adversary.attack_summary`), else nothing."""
    section = getattr(cfg, "adversary", None)
    if section is None or not section.active:
        return {}
    import numpy as np

    from fedray.methods.robust.adversary import attack_summary
    from fedray.observe.metrics import read_metrics

    def col(table: Any, name: str) -> np.ndarray:
        return np.asarray(table.column(name).to_numpy(zero_copy_only=False))

    table = read_metrics(run_dir, "clients")
    sampled = col(table, "sampled").astype(bool)
    bad = col(table, "malicious")[sampled]
    judged = None
    if "robust_kept" in table.column_names:  # the rows the rule weighed, skipped rounds out
        kept = col(table, "robust_kept")[sampled]
        rounds = read_metrics(run_dir, "rounds")
        skipped = col(rounds, "round")[col(rounds, "policy/robust_skipped") == 1] \
            if "policy/robust_skipped" in rounds.column_names else []
        weighed = ~np.isnan(kept) & ~np.isin(col(table, "round")[sampled], skipped)
        judged = bad[weighed], kept[weighed]
    asr = final_eval.get("attack_success_rate")
    return {"adversary": attack_summary(section, cfg.clients.num_clients, cfg.seed, bad,
                                        judged,
                                        None if asr is None or math.isnan(asr) else asr)}


LOCK = ".lock"
# what a run (and the jobs and reports that write beside it) puts in its directory
RUN_NAMES = frozenset({LOCK, "config.yaml", "data.json", "partition.parquet", "summary.json",
                       "rounds.parquet", "clients.parquet", "metrics", "checkpoints",
                       "client_state", "tracking.json", "tensorboard", "report",
                       "generations.parquet"})
# what a killed writer of a run leaves: a run file's temp (NAME.tmp-PID), a report's staging
STALE_TEMP = re.compile("(?:" + "|".join(re.escape(n) for n in sorted(RUN_NAMES - {LOCK}))
                        + r")\.tmp-[\w.-]+|\.report\.tmp-\w+")


def check_replaceable(storage: Storage, run_dir: str) -> bool:
    """``--overwrite`` replaces a fedray run and nothing else: the directory must hold a
    run's ``config.yaml`` and no name a run does not write (a ``ConfigError`` naming the
    first other one, before anything is deleted; temp files a killed writer left are a
    run's), none of them a link (a :class:`StateFileError` naming it): a mistyped path never
    empties a directory of someone's own files. Returns whether there is an old run to
    replace (False: empty, or only a stale lock and temp files of a run killed before it
    wrote its config)."""
    names = [n for n in storage.listdir("") if n != LOCK]
    if all(STALE_TEMP.fullmatch(n) for n in names):
        return False
    if "config.yaml" not in names:
        raise ConfigError("--overwrite", run_dir, "a fedray run directory to replace (one "
                                                  "holding config.yaml); this one holds "
                                                  "other files")
    foreign = [n for n in names if n not in RUN_NAMES and not STALE_TEMP.fullmatch(n)]
    if foreign:
        raise ConfigError("--overwrite", run_dir, f"a directory holding only a fedray run's "
                                                  f"files: '{foreign[0]}' is not one (move "
                                                  f"it away first)")
    for n in names:
        storage.path(n)  # a link is refused here, before anything is deleted
    return True


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    return True


def acquire_lock(storage: Storage) -> bool:
    """Take ``RUN_DIR/.lock`` for this process, so two runs never write one directory.
    Refused while a live process on this host, or any process on another host, holds it;
    the lock of a dead process on this host is taken over. Local directories only (a URI
    is not locked: object stores have no exclusive create). Returns whether it was taken."""
    import socket

    if not storage.is_local:
        return False
    path = storage.path(LOCK)
    try:
        os.makedirs(storage.root, exist_ok=True)
    except OSError as e:
        raise ConfigError("run_dir", storage.uri, f"a directory fedray can create "
                                                  f"({e.strerror})") from None
    if not os.access(storage.root, os.W_OK | os.X_OK):
        raise ConfigError("run_dir", storage.uri, "a directory fedray can write to")
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_marker(path) or {}
            same_host = holder.get("host") == me["host"]
            if same_host and holder.get("pid") == me["pid"]:
                return True
            if same_host and not _alive(holder.get("pid")):
                os.unlink(path)  # its run is gone
                continue
            raise ConfigError("run_dir", storage.uri, f"a directory no other run writes to: "
                              f"pid {holder.get('pid')} on {holder.get('host')} holds its "
                              f"{LOCK} since {holder.get('since')} (delete that file if the "
                              f"run is gone)") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return True
    raise ConfigError("run_dir", storage.uri, f"a directory whose {LOCK} can be taken")


def release_lock(storage: Storage) -> None:
    """Remove ``RUN_DIR/.lock`` if this process holds it."""
    path = storage.path(LOCK)
    if (read_marker(path) or {}).get("pid") == os.getpid():
        os.unlink(path)


def check_state_shapes(algorithm_cls: type, cfg: ExperimentConfig, data: Any,
                       states: dict[str, Any], where: str) -> None:
    """The checkpoint's global state against what the method builds for this config
    (:meth:`~fedray.methods.base.Algorithm.state_schema`): every entry the method starts
    from is there as an array of the same shape and kind (float, int, ...), checked before
    Ray starts, so a foreign or edited checkpoint is one error naming the entry, not a
    failure inside the driver. Entries a method may add while it runs are not refused, and
    the float width may differ (the server may keep a wider accumulator)."""
    from fedray.core.registry import make_method

    schema = make_method(algorithm_cls, cfg).state_schema(data.input_shape, data.num_classes)
    if schema is None:
        return
    params = (states.get("server") or {}).get("params") if isinstance(states, dict) else None
    if not isinstance(params, dict):
        raise ConfigError("--resume", where, "a checkpoint holding the global state")
    for key in sorted(schema, key=str):
        shape, dtype = schema[key]
        arr = params.get(key)
        if not isinstance(arr, (np.ndarray, np.generic)):
            raise ConfigError("--resume", where, f"a checkpoint of this run's model (its "
                                                 f"{shown(key)!r} is "
                                                 f"{'missing' if arr is None else 'no array'})")
        if np.shape(arr) != shape or arr.dtype.kind != np.dtype(dtype).kind:
            raise ConfigError("--resume", where, f"a checkpoint of this run's model: "
                                                 f"{shown(key)!r} is {np.shape(arr)} "
                                                 f"{arr.dtype}, the model's is {shape} "
                                                 f"{np.dtype(dtype)}")


def open_run_dir(run_dir: str) -> Storage:
    """``Storage(run_dir)``, a bad path or URI being a :class:`ConfigError`."""
    try:
        return Storage(run_dir)
    except ValueError as e:
        raise ConfigError("run_dir", run_dir, f"a directory path or a pyarrow.fs URI "
                                              f"(s3://, gs://, hdfs://, file://): {e}") from None


def resumable(run_dir: str, cfg: ExperimentConfig, data: Any | None = None) -> bool:
    """The one check of a job that continues its own output directory: False for an empty
    or new directory (start there), True when it holds this very run — the same resolved
    config and, when ``data`` is given, the same data summary — (continue it, or only
    rescore it when finished), and a :class:`ConfigError` naming the first differing key
    when it holds anything else: another run is never continued, rescored or overwritten."""
    storage = open_run_dir(run_dir)
    if storage.is_empty():
        return False
    if not storage.exists("config.yaml"):
        raise ConfigError("run_dir", run_dir, "an empty directory or one holding this run "
                                              "(it holds files but no config.yaml)")
    stored = _resolved(stored_config(storage))
    diff = first_difference(stored, yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    if diff is not None:
        raise ConfigError("run_dir", run_dir, f"a new directory or one holding this run: this "
                                              f"one holds a run whose config differs at "
                                              f"'{diff}'")
    if data is not None and storage.exists("data.json"):
        if _json_or_none(storage.read_bytes("data.json")) != json.loads(
                json_text(data.summary())):
            raise ConfigError("run_dir", run_dir, "a new directory or one holding this run: "
                                                  "this one holds a run on other data")
    return True


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data.decode())
    except (ValueError, RecursionError):
        return None


def _resolved(stored: Any) -> Any:
    """A stored config with the defaults of this version filled in (keys added since it was
    written are not differences); as stored when it no longer loads."""
    try:
        with as_stored():
            cfg = load_config(None, [], base=migrate_stored(stored))
        return yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    except (ConfigError, TypeError, ValueError):
        return stored


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The dotted key where two nested configs first differ (sorted keys), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            d = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
            if d is not None:
                return d
        return None
    return None if a == b else (path or "<root>")


def stored_config(storage: Storage) -> dict[str, Any]:
    """A run directory's ``config.yaml`` through the guards of every config file (size,
    UTF-8, nesting, YAML aliases counted expanded, a mapping):
    :func:`fedray.core.config.parse_text`."""
    return parse_text(storage.read_bytes("config.yaml"), "yaml", storage.path("config.yaml"),
                      "--resume")


def resume_config(run_dir: str, overrides: list[str] = ()) -> ExperimentConfig:
    """The resolved config a run was started with (``rounds`` may be raised on resume)."""
    storage = open_run_dir(run_dir)
    if not storage.exists("config.yaml"):
        raise ConfigError("--resume", run_dir, "a run directory holding config.yaml")
    base = migrate_stored(stored_config(storage))  # a run an earlier version started
    for text in overrides:
        if not text.startswith("rounds="):
            raise ConfigError(text.split("=")[0], text, "only rounds=N may change on --resume")
    with as_stored():  # keys the run never read load as their defaults (what it read)
        cfg = load_config(None, overrides, base=base)
        stored = load_config(None, [], base=base).rounds if overrides else cfg.rounds
    if overrides:  # only rounds=N: never below the stored run's nor the rounds it has run
        try:
            ran = storage.latest_index() or 0
        except (ValueError, OSError):  # a planted LATEST: the resume itself refuses it
            ran = 0
        if cfg.rounds < max(stored, ran):
            raise ConfigError("rounds", cfg.rounds, f"at least the {max(stored, ran)} rounds "
                                                    f"the run has on record (--resume may only "
                                                    f"raise it)")
    return cfg


__all__ = ["Experiment", "init_ray", "resumable", "resume_config", "run_experiment"]
