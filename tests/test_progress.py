"""The one progress display (fedray.observe.progress): plain stage lines off a terminal, in order,
with counts, elapsed time and ETA; counts from a Ray task; and the FAVoR job's real stages,
its strict --json on stdout and no library noise on stderr."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedray.observe.progress import Progress, clock


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_plain_lines_name_each_stage_in_order_with_counts_and_eta(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("fedray.observe.progress.time", SimpleNamespace(monotonic=lambda: now[0]))
    buf = io.StringIO()
    progress = Progress(3, file=buf, interval=10)
    with progress.stage("corpus"):
        now[0] += 2
    with progress.stage("base LM", total=10, unit="rounds") as stage:
        for _ in range(10):
            now[0] += 7  # a line at most every 10 s, the first count at once
            stage.advance()
    with pytest.raises(KeyError):
        with progress.stage("ASCE", unit="batches") as stage:
            now[0] += 5
            stage.report(2, 8, note="loss 0.5")
            raise KeyError
    assert lines(buf) == [
        "[stage 1/3] corpus",
        "[stage 1/3] corpus: done in 00:02",
        "[stage 2/3] base LM: 0/10 rounds",
        "[stage 2/3] base LM: 2/10 rounds, 00:14 elapsed, ETA 00:56",
        "[stage 2/3] base LM: 4/10 rounds, 00:28 elapsed, ETA 00:42",
        "[stage 2/3] base LM: 6/10 rounds, 00:42 elapsed, ETA 00:28",
        "[stage 2/3] base LM: 8/10 rounds, 00:56 elapsed, ETA 00:14",
        "[stage 2/3] base LM: 10/10 rounds, 01:10 elapsed, ETA 00:00",
        "[stage 2/3] base LM: 10/10 rounds, done in 01:10",
        "[stage 3/3] ASCE",
        "[stage 3/3] ASCE: 2/8 batches, 00:05 elapsed · loss 0.5",  # rate from here on
        "[stage 3/3] ASCE: 2/8 batches, stopped after 00:05 · loss 0.5"]


def test_eta_ignores_work_done_before_the_first_count(monkeypatch):
    """A resumed run reports its checkpoint's round first: the rate starts there."""
    now = [0.0]
    monkeypatch.setattr("fedray.observe.progress.time", SimpleNamespace(monotonic=lambda: now[0]))
    buf = io.StringIO()
    with Progress(1, file=buf, interval=0).stage("run", unit="rounds") as stage:
        now[0] = 30  # starting Ray and the executors
        stage.report(6, 10)
        now[0] = 40
        stage.report(7)
    assert lines(buf)[2] == "[stage 1/1] run: 7/10 rounds, 00:40 elapsed, ETA 00:30"


def test_disabled_progress_prints_nothing_and_clock_formats():
    buf = io.StringIO()
    with Progress(2, file=buf, enabled=False).stage("x", 3) as stage:
        stage.advance()
        assert stage.relay()(1, 3) is None  # no actor, no Ray needed
    assert buf.getvalue() == ""
    assert [clock(s) for s in (0, 59.9, 61, 3599, 3600, 36_061)] == [
        "00:00", "00:59", "01:01", "59:59", "1:00:00", "10:01:01"]


def test_terminal_shows_a_bar_per_stage():
    buf = io.StringIO()
    with Progress(1, file=buf, tty=True).stage("rounds", 4, "rounds") as stage:
        stage.advance(2)
    out = buf.getvalue()
    assert "\r[stage 1/1] rounds: 2/4 rounds" in out and "|" in out and out.endswith("\n")
    assert "done in 00:00" in out.rsplit("\r", 1)[-1]


@pytest.mark.ray
def test_relay_brings_counts_from_a_ray_task(ray_session):
    buf = io.StringIO()

    def work(report):
        for i in range(3):
            report(i + 1, 3)

        time.sleep(2.5)  # the stage polls once a second
        return "ok"

    with Progress(1, file=buf, interval=0).stage("remote", unit="items") as stage:
        assert ray_session.get(ray_session.remote(num_cpus=0)(work).remote(stage.relay())) \
            == "ok"
        assert stage.done == 3 and stage.total == 3
    assert "[stage 1/1] remote: 3/3 items, done in" in lines(buf)[-1]


# what the libraries print unless -v: bars and warnings that need nothing from the user
NOISE = ("Loading weights", "Writing model shards", "gemm_4bit_forward",
         "is_gradient_checkpointing")


def check_job_progress(res, ray, variants: list[str], since: float) -> None:
    """What the FAVoR job's ``--smoke --json`` off a terminal must show (run once, by
    tests/test_favor.py's end-to-end test): every stage starts and ends in order with its
    counts, and the libraries' bars and the known harmless warnings are gone — in the entry
    process and in the job's Ray workers."""
    stages = ["corpus", "base LM", "ASCE"]
    for v in variants:
        stages += [f"favor-{v}", f"evaluation {v}"]
    stages.append("cold start")
    stage = re.compile(r"\[stage (\d+)/(\d+)\] ([^:]+)(?::|$)")
    seen = [m.groups() for m in map(stage.match, res.stderr.splitlines()) if m]
    assert {n for _, n, _ in seen} == {str(len(stages))}
    starts = [name for i, (idx, _, name) in enumerate(seen)
              if i == 0 or seen[i - 1][0] != idx]
    assert starts == stages
    ends = [ln for ln in res.stderr.splitlines() if "done in" in ln]
    assert len(ends) == len(stages)
    assert any(re.search(r"favor-favor: 2/2 rounds, done in \d\d:\d\d", ln) for ln in ends)
    assert any(re.search(rf"evaluation {variants[-1]}: (\d+)/\1 generations, done in", ln)
               for ln in ends)
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    mine = ray.get_runtime_context().get_job_id()
    workers = [p.read_text(errors="replace") for p in logs.glob("worker-*.err")
               if p.stat().st_mtime >= since]
    workers = [t for t in workers if (m := re.search(r":job_id:(\w+)", t)) and m[1] != mine]
    assert workers, "the job's workers left no logs"
    for noise in NOISE:
        assert not any(noise in t for t in workers), f"{noise!r} in a worker's log"
        assert noise not in res.stderr
