"""benchmarks/gpu_check.sh, the GPU machine's check, in --dry-run on the CPU against the
session's Ray (one declared GPU): every check runs and passes, so a lent GPU's time goes to
the GPU, not to debugging the script."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.ray


def gpu_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PY=sys.executable, **(env or {}))
    return subprocess.run(["bash", "benchmarks/gpu_check.sh", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_dry_run_exercises_every_check(ray_session, tmp_path):
    res = gpu_check("--dry-run", "--out", str(tmp_path),
                    env={"RAY_ADDRESS": ray_session.get_runtime_context().gcs_address})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = report["rows"]
    assert report["env"]["dry_run"] and report["env"]["device"] == "cpu"
    assert {r["check"] for r in rows} == {"favor_bf16", "favor_memory", "favor_memory_model",
                                          "flite_bf16",
                                          "drod_deterministic", "ray_tiers", "fatal_error"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    (bf16,) = [r for r in rows if r["check"] == "favor_bf16"]
    assert bf16["param_dtype"] == "torch.bfloat16"  # the alignment ran on bf16 hidden states
    assert {r["layers"] for r in rows if r["check"] == "favor_memory"} == {1, 2}
    tiers = [r for r in rows if r["check"] == "ray_tiers"]
    assert len(tiers) == 5 and sum(bool(r["gpu_ids"]) for r in tiers) == 4
    (fatal,) = [r for r in rows if r["check"] == "fatal_error"]
    assert fatal["executor_restarts"] == 1
    assert "| fatal_error | yes |" in (tmp_path / "GPU_CHECK.md").read_text()
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last == {"ok": True, "failed": [], "out": str(tmp_path)}


def test_without_cuda_it_refuses_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = gpu_check("--out", str(tmp_path))
    assert res.returncode == 2
    assert "no CUDA device" in res.stderr and "--dry-run" in res.stderr
    assert not (tmp_path / "gpu_check.json").exists()
