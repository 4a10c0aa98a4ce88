"""Experiment tracking through the libraries themselves: TensorBoard and MLflow.

``tracking.tensorboard=true`` writes ``RUN_DIR/tensorboard/`` with TensorBoard's
``SummaryWriter`` (the one in ``torch.utils.tensorboard``); ``tracking.mlflow=URI`` logs to
MLflow with its ``MlflowClient``. Both get every finite number of every round's metrics row
(step = round: accuracies, losses, bytes, ε, simulated time, ``policy/...``, ``tier/...``)
and the resolved config (TensorBoard: the YAML as text plus hparams; MLflow: flattened
dotted params plus ``config.yaml`` as an artifact); at the end, the summary.

A local path or ``file:`` URI is MLflow's file store (no server). MLflow 3 keeps that store
behind ``MLFLOW_ALLOW_FILE_STORE``: this module sets it to ``true`` in this process when the
store is a local path and the variable is unset (its readers need the same variable).

One fedray run is one MLflow run: its id is kept in ``RUN_DIR/tracking.json`` (JSON, never
pickle), so ``--resume`` continues the same MLflow run and skips rounds it already holds
(a resume restarts from the last checkpoint); TensorBoard appends a new event file whose
``purge_step`` hides what the earlier session wrote after that checkpoint.

Credentials never enter a tracking URI: config.yaml stores the URI as written, so one with
``user:password@`` is refused (MLflow reads ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/
``_TOKEN`` from the environment instead). mlflow and tensorboard are imported only when
enabled: importing fedray stays fast.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from fedray.core.spec import ConfigError, redact
from fedray.core.storage import Storage
from fedray.observe.metrics import json_text

STATE_FILE = "tracking.json"
TENSORBOARD_DIR = "tensorboard"
REACH_TIMEOUT_S = 5.0
HEADLINE_METRICS = ("global_accuracy", "global_loss", "train_loss", "personalized_accuracy")


def check_config(cfg: Any) -> None:
    """The checks of ``cfg.tracking`` that need neither MLflow nor the network: a
    non-empty URI without credentials, a file store that is not a file, an http(s) URI
    with a host, a non-empty experiment name."""
    t = cfg.tracking
    if t.mlflow is not None:
        uri = t.mlflow
        if not uri.strip():
            raise ConfigError("tracking.mlflow", uri, "an MLflow tracking URI or a local "
                                                      "directory (file store)")
        if redact(uri) != uri or any(c.isspace() or c in "'\"" for c in uri):
            shown_uri = redact(uri) if "@" not in uri else "***@" + redact(uri.rsplit("@")[-1])
            raise ConfigError("tracking.mlflow", shown_uri, "a tracking URI without "
                              "credentials, spaces or quotes (config.yaml stores it): set "
                              "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD or "
                              "MLFLOW_TRACKING_TOKEN instead")
        scheme = _scheme(uri)
        if scheme in ("", "file"):
            path = _file_store_path(uri)
            if os.path.isfile(path):
                raise ConfigError("tracking.mlflow", uri, "a directory for MLflow's file "
                                                          "store (this is a file)")
        elif scheme in ("http", "https") and not urllib.parse.urlparse(uri).hostname:
            raise ConfigError("tracking.mlflow", uri, "an http(s)://HOST[:PORT] tracking "
                                                      "server URI")
    if t.mlflow_experiment is not None and not t.mlflow_experiment.strip():
        raise ConfigError("tracking.mlflow_experiment", t.mlflow_experiment,
                          "a non-empty MLflow experiment name (or null: the config's name)")


def _scheme(uri: str) -> str:
    scheme = urllib.parse.urlparse(uri).scheme
    return "" if len(scheme) <= 1 else scheme.lower()  # "C:\..." is a path


def _file_store_path(uri: str) -> str:
    """The local directory of a file-store URI (a plain path or ``file:``)."""
    if _scheme(uri) != "file":
        return os.path.abspath(uri)
    parsed = urllib.parse.urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise ConfigError("tracking.mlflow", uri, "a file: URI of this machine (file:///PATH)")
    return os.path.abspath(urllib.request.url2pathname(parsed.path))


def mlflow_uri(value: str) -> str:
    """``tracking.mlflow`` as the URI MLflow is given, checked now rather than mid-run: a
    local path becomes an absolute ``file://`` URI (and allows MLflow's file store in this
    process), an http(s) server must answer within seconds, and MLflow itself must be able
    to open the store (an unknown scheme or a missing database driver fails here)."""
    scheme = _scheme(value)
    if scheme in ("", "file"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = Path(_file_store_path(value)).as_uri()
    else:
        uri = value
        if scheme in ("http", "https"):
            _check_reachable(value)
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri)  # builds the store; a server is not contacted yet
    except Exception as e:  # noqa: BLE001 — MlflowException, ImportError, ValueError, ...
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError("tracking.mlflow", value, f"a tracking URI MLflow can open: a "
                                                    f"local directory, file:, http(s):// "
                                                    f"or a database URI ({reason})") from None
    return uri


def _check_reachable(uri: str) -> None:
    import socket

    parsed = urllib.parse.urlparse(uri)
    port = parsed.port or (443 if parsed.scheme.lower() == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError("tracking.mlflow", uri, f"the URI of a running MLflow tracking "
                                                  f"server: nothing answered at "
                                                  f"{parsed.hostname}:{port} ({e})") from None


def numeric_columns(row: dict) -> dict[str, float]:
    """Every finite int or float of a metrics row except ``round`` (the step); NaN, ±Inf,
    bools and strings are left out."""
    return {k: float(v) for k, v in row.items()
            if k != "round" and isinstance(v, numbers.Real) and not isinstance(v, bool)
            and math.isfinite(v)}


_NOT_MLFLOW = re.compile(r"[^\w.\- /]")


def mlflow_key(key: str) -> str:
    """``key`` as a name MLflow accepts for a metric or param: characters other than
    alphanumerics, ``_ - . /`` and spaces become ``_``, path parts that are empty, ``.``
    or ``..`` become ``_``, at most 250 characters."""
    parts = _NOT_MLFLOW.sub("_", str(key)).split("/")
    return "/".join("_" if p.strip() in ("", ".", "..") else p for p in parts)[:250]


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flatten(v, f"{key}.")
        else:
            out[key] = v
    return out


def _text(value: Any) -> str:
    """A config value as a string: strings as they are, everything else as JSON; URIs
    redacted."""
    return redact(value if isinstance(value, str) else json.dumps(value, default=str))


class Tracker:
    """The TensorBoard writer and MLflow run of one fedray run. ``start`` at the round the
    run starts or resumes from, ``log_round`` after every round, ``close`` at the end (with
    the summary) or on failure (without; the MLflow run is marked FAILED until a resume
    continues it)."""

    def __init__(self, storage: Storage, *, tensorboard: bool, mlflow_uri: str | None,
                 experiment: str, run_name: str):
        self.storage = storage
        self.tensorboard = tensorboard
        self.mlflow_uri = mlflow_uri
        self.experiment = experiment
        self.run_name = run_name
        self.writer: Any = None
        self.client: Any = None
        self.run_id: str | None = None
        self.mlflow_last_step = 0  # rounds up to this one are already in the MLflow run

    @classmethod
    def of(cls, cfg: Any, run_dir: str) -> Tracker | None:
        """The tracker ``cfg.tracking`` asks for, or None when it asks for none; every
        problem with it is a :class:`ConfigError` here, before the run starts. TensorBoard
        needs a local run directory."""
        t = cfg.tracking
        if not t.tensorboard and t.mlflow is None:
            return None
        check_config(cfg)
        storage = Storage(run_dir)
        if t.tensorboard and not storage.is_local:
            raise ConfigError("tracking.tensorboard", True, f"a local run_dir (TensorBoard "
                                                            f"writes RUN_DIR/{TENSORBOARD_DIR} "
                                                            f"as local files; this run_dir is "
                                                            f"{redact(run_dir)})")
        return cls(storage, tensorboard=t.tensorboard,
                   mlflow_uri=mlflow_uri(t.mlflow) if t.mlflow is not None else None,
                   experiment=t.mlflow_experiment or cfg.name,
                   run_name=os.path.basename(storage.root.rstrip("/")) or cfg.name)

    # ------------------------------------------------------------------ lifetime

    def start(self, config: dict, at_round: int = 0) -> None:
        """Open the writer and the MLflow run (a new one, or the run's own on resume) and log
        the resolved ``config``; ``at_round`` is the round the run continues from (0: new)."""
        text = redact(yaml.safe_dump(config, sort_keys=False))
        flat = flatten(config)
        if self.tensorboard:
            self._start_tensorboard(text, flat, at_round)
        if self.mlflow_uri is not None:
            self._start_mlflow(text, {k: _text(v) for k, v in flat.items()})

    def log_round(self, row: dict) -> None:
        """Every finite numeric column of one round's metrics row, step = its round."""
        step = int(row["round"])
        values = numeric_columns(row)
        if self.writer is not None:
            for key, v in values.items():
                self.writer.add_scalar(key, v, global_step=step)
            self.writer.flush()
        if self.client is not None and step > self.mlflow_last_step:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._log_batch(metrics=[Metric(mlflow_key(k), v, now, step)
                                     for k, v in values.items()])
            self.mlflow_last_step = step

    def close(self, summary: dict | None = None) -> None:
        """Log ``summary`` (TensorBoard text; MLflow artifact and its numbers as metrics)
        and end both; without a summary the MLflow run is marked FAILED. Idempotent."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                if summary is not None:
                    writer.add_text("summary", _code(json.dumps(summary, indent=2)),
                                    global_step=int(summary.get("rounds") or 0))
            finally:
                writer.close()
        if self.client is not None:
            client, run_id = self.client, self.run_id
            self.client = None
            status = "FAILED"
            try:
                if summary is not None:
                    from mlflow.entities import Metric

                    client.log_dict(run_id, summary, "summary.json")
                    step, now = int(summary.get("rounds") or 0), int(time.time() * 1000)
                    metrics = [Metric(mlflow_key(k), v, now, step)
                               for k, v in numeric_columns(summary).items()
                               if k not in ("rounds", "num_clients")]
                    for i in range(0, len(metrics), 1000):
                        client.log_batch(run_id, metrics=metrics[i:i + 1000])
                    status = "FINISHED"
            finally:
                client.set_terminated(run_id, status=status)

    # ------------------------------------------------------------------ TensorBoard

    def _start_tensorboard(self, text: str, flat: dict[str, Any], at_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # on resume, what an earlier session logged after the checkpoint is purged
        self.writer = SummaryWriter(self.storage.path(TENSORBOARD_DIR),
                                    purge_step=at_round + 1 if at_round else None)
        self.writer.add_text("config", _code(text), global_step=at_round)
        hp = {k: v if isinstance(v, (bool, int, float)) else _text(v) for k, v in flat.items()}
        exp, ssi, sei = hparams(hp, dict.fromkeys(HEADLINE_METRICS, 0.0))
        for proto in (exp, ssi, sei):
            self.writer.file_writer.add_summary(proto)
        self.writer.flush()

    # ------------------------------------------------------------------ MLflow

    def _start_mlflow(self, text: str, flat: dict[str, str]) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit
        except ImportError:  # pragma: no cover — older MLflow
            limit = 6000
        client = MlflowClient(tracking_uri=self.mlflow_uri)
        state = self._read_state()
        run = None
        if state.get("mlflow_run_id"):
            try:
                run = client.get_run(state["mlflow_run_id"])
            except MlflowException:
                print(f"fedray: MLflow run {state['mlflow_run_id']} of {STATE_FILE} is not in "
                      f"{redact(self.mlflow_uri)}: starting a new one", file=sys.stderr)
        if run is None:
            run = client.create_run(self._experiment_id(client), run_name=self.run_name,
                                    tags={"fedray.run_dir": redact(self.storage.uri)})
            self._write_state({"mlflow_run_id": run.info.run_id,
                               "mlflow_experiment_id": run.info.experiment_id,
                               "mlflow_tracking_uri": redact(self.mlflow_uri)})
        else:  # resumed: the run goes on where its rounds end
            client.update_run(run.info.run_id, status="RUNNING")
            self.mlflow_last_step = max(
                (m.step for key in run.data.metrics
                 for m in client.get_metric_history(run.info.run_id, key)), default=0)
        self.client, self.run_id = client, run.info.run_id
        have = run.data.params  # params are immutable: a resume adds only new keys
        params = [Param(mlflow_key(k), v[:limit]) for k, v in flat.items()
                  if mlflow_key(k) not in have]
        self._log_batch(params=params)
        client.log_text(self.run_id, text, "config.yaml")  # the current session's config

    def _experiment_id(self, client: Any) -> str:
        from mlflow.exceptions import MlflowException

        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(self.experiment)
        except MlflowException:  # created meanwhile by another run
            found = client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _log_batch(self, metrics: list | None = None, params: list | None = None) -> None:
        """``log_batch`` in chunks within MLflow's per-request limits."""
        for i in range(0, len(metrics or []), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        for i in range(0, len(params or []), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _read_state(self) -> dict:
        return self.storage.read_json(STATE_FILE) if self.storage.exists(STATE_FILE) else {}

    def _write_state(self, state: dict) -> None:
        self.storage.write_bytes(STATE_FILE, json_text(state, indent=2).encode())


def _code(text: str) -> str:
    """Text shown verbatim by TensorBoard's markdown text plugin."""
    return "```\n" + text + "\n```"


__all__ = ["Tracker", "check_config", "flatten", "mlflow_key", "mlflow_uri", "numeric_columns"]
