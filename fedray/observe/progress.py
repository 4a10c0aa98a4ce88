"""The one progress display of every long command and job: named stages in order, each with
its count (rounds, steps, generations, ...), the time it has taken and an ETA, on stderr.

On a terminal each stage is a tqdm bar that stays on screen when the stage ends. Anywhere
else (Ray job logs, CI, a pipe) it is plain lines, one when a stage starts, one at most every
``interval`` seconds while it runs, and one when it ends::

    [stage 2/5] base LM: 0/400 steps
    [stage 2/5] base LM: 120/400 steps, 00:42 elapsed, ETA 01:38
    [stage 2/5] base LM: 400/400 steps, done in 02:20

Usage::

    progress = Progress(stages=2)
    with progress.stage("corpus"):
        ...
    with progress.stage("training", total=10, unit="epochs") as stage:
        for epoch in range(10):
            ...
            stage.advance()

``stage.report(done, total)`` is the same as a callback that code deeper down calls with
absolute counts; ``stage.relay()`` is that callback for code running in a Ray task or actor.
The ETA is the rate measured since the stage's first count (so time spent starting up and
work resumed from a checkpoint do not distort it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

PLAIN_INTERVAL_S = 15.0  # seconds between two plain progress lines of one stage


def clock(seconds: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour on."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60:02d}:{s % 60:02d}"


class Progress:
    """The stages of one job, shown in order on ``file`` (stderr). ``stages`` is how many
    the job will open (for the ``[stage i/n]`` label); ``enabled=False`` shows nothing;
    ``tty`` overrides whether ``file`` is a terminal (bars) or not (plain lines)."""

    def __init__(self, stages: int = 1, *, enabled: bool = True, file: TextIO | None = None,
                 tty: bool | None = None, interval: float = PLAIN_INTERVAL_S):
        self.stages, self.enabled, self.interval = stages, enabled, interval
        self.file = file if file is not None else sys.stderr
        self.tty = tty if tty is not None else bool(getattr(self.file, "isatty", bool)())
        self.opened = 0

    def stage(self, name: str, total: int | None = None, unit: str = "") -> Stage:
        """Open the next stage (a context manager; closing it prints how long it took)."""
        self.opened += 1
        return Stage(self, self.opened, name, total, unit)


class Stage:
    """One stage of a :class:`Progress`: counts, elapsed time, ETA, shown as it goes."""

    def __init__(self, progress: Progress, index: int, name: str, total: int | None,
                 unit: str):
        self.progress, self.index, self.name = progress, index, name
        self.total, self.unit, self.done, self.note = total, unit, 0, ""
        self.t_open = time.monotonic()
        self.first: tuple[int, float] | None = (0, self.t_open) if total else None
        self.closed = self.failed = False
        self.last_line = -float("inf")
        self.lock = threading.RLock()
        self.bar: Any = None
        self._stop_relay: Callable[[], None] | None = None
        if not progress.enabled:
            return
        if progress.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.label, file=progress.file, leave=True,
                            dynamic_ncols=True, bar_format="{desc} |{bar}|" if total else "{desc}")
        self._show(force=True)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(failed=exc_type is not None)

    @property
    def label(self) -> str:
        return f"[stage {self.index}/{max(self.progress.stages, self.index)}] {self.name}"

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.report(self.done + n)

    def report(self, done: int, total: int | None = None, note: str | None = None) -> None:
        """``done`` of ``total`` units done so far (``total`` None: unchanged); ``note`` is a
        short text shown after the counts (a loss, an accuracy)."""
        with self.lock:
            if self.closed:
                return
            self.total = total if total is not None else self.total
            self.note = note if note is not None else self.note
            self.done = done
            first = self.first is None
            if first:
                self.first = (done, time.monotonic())
            self._show(force=first)  # the first count is shown at once

    def relay(self) -> Callable[[int, int], None]:
        """:meth:`report` for code that runs in a Ray task or actor (another process): a
        picklable ``(done, total)`` callback whose counts reach this stage through a small
        zero-CPU actor, read here once a second until the stage closes."""
        if not self.progress.enabled:
            return _ignore
        import ray

        box = ray.remote(num_cpus=0)(_Latest).remote()
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(1.0):
                try:
                    latest = ray.get(box.get.remote())
                except Exception:  # noqa: BLE001 — progress never fails the job
                    return
                if latest is not None:
                    self.report(*latest)

        thread = threading.Thread(target=poll, daemon=True, name=f"progress-{self.index}")
        thread.start()

        def stop_relay() -> None:
            stop.set()
            thread.join()
            ray.kill(box)
            self._stop_relay = None

        self._stop_relay = stop_relay
        return _RemoteReport(box)

    def close(self, failed: bool = False) -> None:
        """End the stage: its last line says how long it took (or that it stopped)."""
        if self._stop_relay is not None:
            self._stop_relay()
        with self.lock:
            if self.closed:
                return
            self.closed, self.failed = True, failed
            self._show(force=True)
            if self.bar is not None:
                self.bar.close()

    def status(self) -> str:
        """``3/10 rounds, 00:42 elapsed, ETA 01:10`` (or ``..., done in 01:52``)."""
        now = time.monotonic()
        parts = []
        if self.total:
            parts.append(f"{self.done}/{self.total} {self.unit}".rstrip())
        elif self.done:
            parts.append(f"{self.done} {self.unit}".rstrip())
        elapsed = clock(now - self.t_open)
        if self.closed:
            parts.append(f"stopped after {elapsed}" if self.failed else f"done in {elapsed}")
        elif now - self.t_open >= 1:
            parts.append(f"{elapsed} elapsed")
            if self.total and self.first is not None and self.done > self.first[0]:
                rate = (self.done - self.first[0]) / max(now - self.first[1], 1e-9)
                parts.append(f"ETA {clock(max(self.total - self.done, 0) / rate)}")
        text = ", ".join(parts)
        return f"{text} · {self.note}" if self.note else text

    def _show(self, force: bool = False) -> None:
        if not self.progress.enabled:
            return
        now = time.monotonic()
        status = self.status()
        line = f"{self.label}: {status}" if status else self.label
        if self.bar is not None:
            if self.total and self.bar.total != self.total:
                self.bar.total, self.bar.bar_format = self.total, "{desc} |{bar}|"
            self.bar.n = min(self.done, self.total or self.done)
            self.bar.set_description_str(line, refresh=False)
            if force or now - self.last_line >= 0.2:
                self.bar.refresh()
                self.last_line = now
        elif force or now - self.last_line >= self.progress.interval:
            print(line, file=self.progress.file, flush=True)
            self.last_line = now


class _Latest:
    """The newest ``(done, total)`` a remote stage callback sent (a Ray actor's state)."""

    def __init__(self) -> None:
        self.value: tuple[int, int] | None = None

    def set(self, done: int, total: int) -> None:
        self.value = (done, total)

    def get(self) -> tuple[int, int] | None:
        return self.value


class _RemoteReport:
    """What :meth:`Stage.relay` hands out: calls send the counts to the stage's actor."""

    def __init__(self, box: Any):
        self.box = box

    def __call__(self, done: int, total: int) -> None:
        self.box.set.remote(done, total)


def _ignore(done: int, total: int) -> None:
    pass


__all__ = ["Progress", "Stage", "clock"]
