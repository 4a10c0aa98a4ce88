"""What every ``fedray`` command and job shares, so a method's own sub-commands (registered
with :func:`fedray.core.registry.register_command`) and the ``jobs/*.py`` scripts behave like the
built-in commands: ``--json`` prints exactly one JSON object on stdout, errors are one line
(or one ``{"error": ...}`` object) and exit with status 2, and the libraries' progress bars
and known-harmless warnings are hidden unless ``-v``/``--verbose`` (:func:`set_verbosity`),
in this process and in every Ray worker it starts (:func:`worker_runtime_env`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import typer

from fedray.observe.metrics import json_text

JSON_OPT = typer.Option(False, "--json", help="Print one JSON object on stdout, nothing else.")
SET_OPT = typer.Option(None, "--set", "-s",
                       help="Override a config key, e.g. -s local.lr=0.1 -s clients.fraction=0.5"
                            " (repeatable; values are parsed as YAML).")

# per-sample input shapes assumed when a command is not told one
DEFAULT_SHAPES = {"mlp": (784,), "cnn": (1, 28, 28), "lstm": (1, 28, 28),
                  "resnet18": (3, 32, 32), "resnet34": (3, 32, 32)}


VERBOSE_ENV = "FEDRAY_VERBOSE"  # "1": show what quiet_libraries hides (set by -v, inherited)
# read by the libraries when they are imported: no progress bars, errors only
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
# loggers whose warnings are about code paths fedray never takes (bitsandbytes: "Failed to
# load CPU gemm_4bit_forward from kernels-community" on any CPU with AVX512-BF16, 4-bit or not)
QUIET_LOGGERS = ("bitsandbytes",)
# (category, message regex) of warnings that need no action from a fedray user
HARMLESS_WARNINGS = [
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),  # peft asks transformers
]


def verbose() -> bool:
    """Whether library progress bars and warnings are shown (``-v``, or FEDRAY_VERBOSE=1)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def set_verbosity(show: bool) -> None:
    """The choice of ``-v``/``--verbose`` (or FEDRAY_VERBOSE=1 already), made once at the
    start of a command or job: kept in the environment (so subprocesses and
    :func:`worker_runtime_env` see it) and applied to this process."""
    if show:
        os.environ[VERBOSE_ENV] = "1"
    if not verbose():
        quiet_libraries()


def quiet_libraries() -> None:
    """Hide the libraries' progress bars (transformers' "Loading weights", datasets') and
    the known-harmless warnings above in this process; idempotent. Every Ray worker of a
    run calls it first when not verbose (:func:`worker_runtime_env`). Imports nothing
    heavy: a library imported later reads the environment set here."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "transformers" in sys.modules:  # imported already: the environment came too late
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


@contextlib.contextmanager
def library_stdout() -> Iterator[None]:
    """Around library code that prints on stdout (Ray Tune's experiment table and hints,
    whatever its verbosity): the text goes to stderr when verbose, nowhere otherwise, so
    stdout holds only the command's result (``--json``: one JSON object)."""
    with contextlib.redirect_stdout(sys.stderr if verbose() else io.StringIO()):
        yield


def worker_runtime_env() -> dict[str, Any]:
    """The job-level Ray ``runtime_env`` that makes every worker (executors, the driver,
    evaluation tasks, Tune trials) call :func:`quiet_libraries` before its first task:
    empty when verbose, or when a submitted job brings a setup hook of its own (Ray
    refuses two)."""
    if verbose():
        return {}
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    if "worker_process_setup_hook" in (job.get("runtime_env") or {}):
        return {}
    return {"worker_process_setup_hook": "fedray.observe.console.quiet_libraries"}


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """The output options every job shares with the ``fedray`` commands."""
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout, nothing else")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the libraries' progress bars and warnings (hidden by "
                             "default)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress display on stderr")


def emit(obj: Any, as_json: bool, text: str | None = None) -> None:
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


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
