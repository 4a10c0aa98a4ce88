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
import re
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
    report_failure(msg, as_json, code)
    raise typer.Exit(code)


# the exit statuses of every command and job (README "Exit status")
EXIT_CODES = {0: "success", 1: "the run failed (a round, placement)",
              2: "bad input: a config value, a file, a usage error",
              3: "an unexpected internal error (one line; FEDRAY_DEBUG=1 adds the traceback)",
              130: "interrupted by SIGINT (Ctrl-C)", 143: "terminated by SIGTERM"}
DEBUG_ENV = "FEDRAY_DEBUG"


class Stopped(BaseException):
    """A signal stopped the command (SIGINT: 130, SIGTERM: 143). Like KeyboardInterrupt it is
    not an Exception, so every ``finally`` and ``except BaseException`` cleanup runs; the
    run loop re-raises it with where the run stopped and how to resume
    (:class:`fedray.runtime.experiment.RunStopped`)."""

    def __init__(self, signal_name: str, code: int, message: str | None = None):
        self.signal_name, self.code = signal_name, code
        super().__init__(message or f"stopped by {signal_name}")


def on_signals() -> dict[int, Any]:
    """SIGTERM (and SIGINT) raise :class:`Stopped` in the main thread instead of killing the
    process (SIGTERM) or raising a bare KeyboardInterrupt, so a run releases Ray, keeps its
    checkpoints and ends with one line. A second signal while stopping is ignored. Returns
    the handlers it replaced (none off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        signal.signal(signum, signal.SIG_IGN)
        raise Stopped(name, 128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return previous


_GUARDING = False  # a guarded entry point owns SIGINT/SIGTERM in this process


def reclaim_signals() -> None:
    """Take SIGINT/SIGTERM back after a library installed its own (``ray.init`` installs a
    SIGTERM handler that exits at once and a native one that prints a stack dump), when a
    guarded entry point owns them (:func:`guarded`)."""
    if _GUARDING:
        on_signals()


class UsageError(ValueError):
    """A command line that does not parse (an unknown flag, a missing argument)."""


class JobParser(argparse.ArgumentParser):
    """``argparse`` for the jobs: a usage error is raised (and reported by :func:`guarded`
    as one line, or one JSON object under ``--json``), not printed and exited on; the job's
    docstring, given as ``description``, keeps its layout in ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes Ray puts in remote tracebacks


def original(e: BaseException) -> BaseException:
    """The error that really ended the command: a signal's :class:`Stopped` (or
    KeyboardInterrupt) wherever it hides in the chain (:func:`interrupted`); else, for one
    raised through Ray, the error the actor raised — a ``RayTaskError`` carries the remote
    traceback in its text and the original exception as ``cause`` (unwrapped through nested
    calls: the entry process -> the driver actor -> an executor)."""
    stop = interrupted(e)
    if stop is not None:
        return stop
    while type(e).__name__.startswith("RayTaskError") and isinstance(
            getattr(e, "cause", None), BaseException) and e.cause is not e:
        e = e.cause
    return e


def interrupted(e: BaseException) -> BaseException | None:
    """The :class:`Stopped` or KeyboardInterrupt behind ``e`` (itself, or its cause or
    context, a few links deep), or None. A signal that arrives while Ray's compiled code
    runs (``ray.get`` during a driver's setup) raises there and comes out as Ray's
    ``SystemError`` with the signal's exception as its cause."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen and len(seen) < 16:
        if isinstance(e, Stopped | KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def failure(e: BaseException) -> tuple[str, int]:
    """The one line and exit status of an error that ended a command or job: bad input
    (ValueError: config, state file, usage) 2, a failed run (RuntimeError the runtime
    raises with its reason) 1, a signal 130/143, anything else an internal error 3."""
    from fedray.core.spec import redact

    e = original(e)
    text = " ".join(ANSI.sub("", str(e)).split())[:2000]
    if isinstance(e, Stopped):
        return redact(text), e.code
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (SIGINT)", 130
    if isinstance(e, RecursionError):
        return f"internal error: input nested too deep ({text[:200]})", 3
    if isinstance(e, (ValueError, OSError)) and not isinstance(e, UnicodeError):
        return redact(text or type(e).__name__), 2
    if type(e).__name__ in ("RoundFailedError", "PlacementError"):
        return redact(text), 1
    return redact(f"internal error: {type(e).__name__}: {text} (set {DEBUG_ENV}=1 for the "
                  f"traceback, and please report it)"), 3


def guarded(fn: Any, argv: list[str] | None = None) -> int:
    """Run a command's or job's entry point so that no error ends in a traceback: it exits
    with one line on stderr (``--json``: one ``{"error": ..., "exit_code": ...}`` object on
    stdout) and a status from :data:`EXIT_CODES`. Signals are turned into
    :class:`Stopped` first (:func:`on_signals`)."""
    import signal

    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    global _GUARDING
    previous = on_signals()
    _GUARDING = bool(previous)
    try:
        fn()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException as e:  # noqa: BLE001 — the one place every error is reported
        msg, code = failure(e)
        if os.environ.get(DEBUG_ENV) == "1":
            import traceback

            traceback.print_exception(e)
        report_failure(msg, as_json, code)
        return code
    finally:
        _GUARDING = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def report_failure(msg: str, as_json: bool, code: int) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"error": msg, "exit_code": code}) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"error: {msg}\n")
        sys.stderr.flush()


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
