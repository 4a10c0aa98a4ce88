"""Shared fixtures: one real local Ray instance per test session — per pytest-xdist worker
under ``make test`` — (2 CPUs, plus one declared GPU so fractional-GPU placement can be
tested without a GPU)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def warm_runs(request):
    """Runs of this process on the session's Ray keep their driver and executors warm
    (``runtime.keep_warm``, bitwise a cold run's: tests/test_warm.py) for the module's next
    run of the same shape; the module's end frees them. Most of the suite's time was actor
    starts (a torch import each). A module whose subprocesses, sweeps or actor counts need
    the session's CPUs free sets ``WARM_RUNS = False``; a run that starts its own Ray, or a
    config that says ``keep_warm`` itself, is left as it is."""
    if not getattr(request.module, "WARM_RUNS", True):
        yield
        return
    import dataclasses

    import ray

    from fedray.runtime import experiment, release_warm

    start = experiment.Experiment.start

    def warm_start(self):
        if ray.is_initialized() and not self.cfg.runtime.keep_warm:
            self.cfg = dataclasses.replace(
                self.cfg, runtime=dataclasses.replace(self.cfg.runtime, keep_warm=True))
        return start(self)

    patch = pytest.MonkeyPatch()
    patch.setattr(experiment.Experiment, "start", warm_start)
    yield
    patch.undo()
    if ray.is_initialized():
        release_warm()


@pytest.fixture(scope="session")
def flower_python():
    """``.venv-flower``'s interpreter (Flower pins its own Ray), created by
    ``benchmarks/setup_flower_venv.sh`` when missing; the script runs once a session."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    subprocess.run(["bash", str(root / "benchmarks" / "setup_flower_venv.sh")], cwd=root,
                   check=True, timeout=2400)
    python = root / ".venv-flower" / "bin" / "python"
    assert python.exists(), python
    return python


def tiny_overrides(**extra) -> list[str]:
    """A small, fast experiment: 6 clients on digits, MLP, 2 executors of 0.5 CPU."""
    base = {
        "rounds": 3, "seed": 7, "clients.num_clients": 6, "clients.fraction": 1.0,
        "model.hidden": "[32]", "local.batch_size": 16, "local.epochs": 1,
        "data.partition": "dirichlet", "data.alpha": 1.0,
        "runtime.tiers": "[{name: default, executors: 2, num_cpus: 0.5}]",
        "runtime.placement_timeout_s": 60,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture
def tiny_cfg():
    from fedray.core.config import load_config

    def make(**extra):
        return load_config(None, tiny_overrides(**extra))

    return make


def full_and_resumed(cfg, tmp_path, stop_after: int = 2):
    """Run ``cfg`` uninterrupted into tmp_path/full, and into tmp_path/cut stopped after
    ``stop_after`` rounds then resumed. Returns (full summary, resumed summary)."""
    from fedray.runtime import Experiment, run_experiment

    full = run_experiment(cfg, str(tmp_path / "full"), progress=False)
    exp = Experiment(cfg, str(tmp_path / "cut"))
    exp.start()
    for _ in range(stop_after):
        exp.step()
    exp.release()
    return full, run_experiment(cfg, str(tmp_path / "cut"), resume=True, progress=False)


def flower_process(python, script: str, *args: str, pythonpath: str | None = None):
    """Run ``tests/SCRIPT ARGS`` with ``.venv-flower``'s ``python`` (Flower pins its own Ray):
    never joining this session's Ray, fedray's sources on the path only when ``pythonpath``
    says so, Flower's telemetry off. Returns the finished ``subprocess.CompletedProcess``."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    return subprocess.run([str(python), os.path.join(root, "tests", script), *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)


def job_process(ray, script: str, *args: str, timeout: int = 600):
    """Run ``jobs/SCRIPT ARGS`` against the session's Ray (as a submitted job would join it);
    returns the finished ``subprocess.CompletedProcess`` (text stdout/stderr)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    return subprocess.run([sys.executable, f"jobs/{script}", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


def strict_json(text: str) -> dict:
    """The one JSON object ``text`` holds (nothing else, no NaN/Infinity), parsed strictly."""
    import json

    def refuse(name: str):
        raise ValueError(f"non-standard JSON constant {name}")

    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text[-2000:]
    obj = json.loads(lines[0], parse_constant=refuse)
    assert isinstance(obj, dict)
    return obj


def run_job(ray, script: str, *args: str, timeout: int = 600) -> dict:
    """:func:`job_process` with ``--json`` that must succeed: its one strict JSON object on
    stdout, its stage progress on stderr; also checks the script's ``--help``."""
    res = job_process(ray, script, *args, "--json", timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[stage 1/" in res.stderr, res.stderr[-2000:]
    helped = job_process(ray, script, "--help", timeout=60)
    assert helped.returncode == 0 and "--smoke" in helped.stdout
    return strict_json(res.stdout)


def wait_for_checkpoint(latest, at_least: int, timeout: float = 240) -> None:
    """Poll ``RUN_DIR/checkpoints/LATEST`` (a Path) until it names round ``at_least`` or
    later (a run in another process, to be stopped mid-way)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if latest.exists() and int((latest.read_text() or "0").split()[0]) >= at_least:
            return
        time.sleep(0.05)


def build_site(out, config=None):
    """``mkdocs build --strict`` of the documentation site (or of ``config``) into ``out``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(out), "-f", str(config or root / "mkdocs.yml")],
                          cwd=root, env=env, text=True, capture_output=True, timeout=600)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site as ``make docs`` builds it, once per test session."""
    out = tmp_path_factory.mktemp("site")
    res = build_site(out)
    assert res.returncode == 0, res.stderr[-4000:]
    return out
