"""benchmarks/gpu_check.sh, the GPU machine's check, in --dry-run on the CPU against the
session's Ray (one declared GPU): every check runs and passes, so a lent GPU's time goes to
the GPU, not to debugging the script. The check's own process runs in the simulated device
environment (``benchmarks/device_bundle.py simulate``: the lent machine's packages and the
bundle that travels there, nothing else), so an import the device lacks fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.ray


WARM_RUNS = False  # conftest.warm_runs: its checks run in a subprocess on the session's Ray


def gpu_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, **(env or {})}
    return subprocess.run(["bash", "benchmarks/gpu_check.sh", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def dry_run(ray_session, tmp_path_factory):
    """One dry run of every check (a minute or two) with the device's packages only:
    (completed process, report, out dir)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import device_bundle

    out = tmp_path_factory.mktemp("gpu_check")
    python = device_bundle.simulate(str(tmp_path_factory.mktemp("device") / "venv"))
    res = gpu_check("--dry-run", "--out", str(out),
                    env={"RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
                         "PY": python, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res, json.loads((out / "gpu_check.json").read_text()), out


def test_dry_run_exercises_every_check(dry_run):
    res, report, tmp_path = dry_run
    rows = report["rows"]
    assert report["env"]["dry_run"] and report["env"]["device"] == "cpu"
    assert {r["check"] for r in rows} == {"favor_bf16", "favor_memory", "favor_memory_model",
                                          "favor_cohort", "flite_bf16", "drod_deterministic",
                                          "ray_tiers", "fatal_error", "favor_qlora_fleet",
                                          "drod_fleet_gpu", "flite_resnet18", "pfl_cifar10"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    (cohort,) = [r for r in rows if r["check"] == "favor_cohort"]  # authors through one base
    assert cohort["authors"] == 3 and cohort["max_rel_upload_diff"] <= 1e-4
    assert cohort["sequential_tokens_per_s"] > 0 and cohort["batched_tokens_per_s"] > 0
    (bf16,) = [r for r in rows if r["check"] == "favor_bf16"]
    assert bf16["param_dtype"] == "torch.bfloat16"  # the alignment ran on bf16 hidden states
    assert {r["layers"] for r in rows if r["check"] == "favor_memory"} == {1, 2}
    tiers = [r for r in rows if r["check"] == "ray_tiers"]
    assert len(tiers) == 5 and sum(bool(r["gpu_ids"]) for r in tiers) == 4
    (fatal,) = [r for r in rows if r["check"] == "fatal_error"]
    assert fatal["executor_restarts"] == 1
    (pfl,) = [r for r in rows if r["check"] == "pfl_cifar10"]  # the config's smoke size
    assert (pfl["users"], pfl["per_round"], pfl["rounds"]) == (20, 4, 2)
    assert len(pfl["fedray_round_seconds"]) == 2 and pfl["fedray_s_per_round"] > 0
    md = (tmp_path / "GPU_CHECK.md").read_text()
    assert "| fatal_error | yes |" in md and "| drod_fleet_gpu | yes |" in md
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last == {"ok": True, "failed": [], "out": str(tmp_path)}


def fleet(rows: list[dict], check: str, shares: dict[str, float]) -> dict:
    """The row of a fleet check, after checking what every fleet row must show in a dry
    run: each tier's executors placed by Ray with the declared GPU share (on the declared
    GPU, computing on the CPU), each of them ran clients and reports a peak RSS but no GPU
    peak, each tier trained samples at a positive rate, and the CPU reference run sampled
    the same clients and sent the same bytes, with the same losses bit for bit."""
    (row,) = [r for r in rows if r["check"] == check]
    assert {t: v["num_gpus"] for t, v in row["tiers"].items()} == shares
    for tier, v in row["tiers"].items():
        assert v["ray_gpu_shares"] == [shares[tier]]
        assert v["clients"] > 0 and v["samples_trained"] > 0 and v["samples_per_s"] > 0
    for e in row["executors"]:
        assert e["ray_gpu_share"] == shares[e["executor"].split("/")[0]]
        assert e["device"] == "cpu" and e["gpu_ids"] and e["clients"] > 0
        assert e["peak_gpu_mib"] is None and e["peak_rss_mib"] > 0
    ref = row["cpu_reference"]
    assert ref["different"] == [] and set(ref["equal"]) >= {"sampled", "tier",
                                                            "upload_bytes", "num_samples"}
    assert ref["upload_bytes"] == ref["cpu_upload_bytes"] > 0
    assert ref["round1_loss_rel_diff"] == 0.0
    return row


def test_dry_run_fleets_on_fractional_gpus(dry_run):
    """The three fleets of issue #15 in the dry run: FAVoR's QLoRA fleet (quantization off
    on the CPU, said so), DROD's tiers at 0.5 / 0.25 / 0.125 GPU, FLITE on a ResNet-18 at
    CIFAR's shape."""
    rows = dry_run[1]["rows"]
    favor = fleet(rows, "favor_qlora_fleet", {"lm": 0.125})
    assert len(favor["executors"]) == 2  # the GPU run's 8, scaled to a 2-core machine
    assert favor["linear4bit_layers"] == 0 and favor["quantization"].startswith("off")
    # the bundle carries MiniLM without its weights: the check builds it from its config
    assert favor["asce_encoder"].startswith("MiniLM-L6 from its config, random weights")
    drod = fleet(rows, "drod_fleet_gpu", {"t100": 0.5, "t025": 0.25, "t006": 0.125})
    assert [drod["tiers"][t]["capacity"] for t in ("t100", "t025", "t006")] == [
        1.0, 0.251, 0.064]
    assert not drod["deterministic"]  # no GPU type to pin in a dry run
    flite = fleet(rows, "flite_resnet18", {"gpu": 0.25})
    assert flite["mapped_layers"] == 20 and flite["latents"] == 1280
    assert flite["latent_bytes"] == 648  # int4: 640 B of codes + scale and zero-point
    (sent,) = flite["upload_bytes_per_client"]  # every upload the same: z and its header
    assert sent == 648 + flite["header_bytes"]
    assert flite["cpu_reference"]["upload_bytes"] == (
        sent * flite["clients_per_round"] * flite["rounds"])


def test_without_cuda_it_refuses_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = gpu_check("--out", str(tmp_path))
    assert res.returncode == 2
    assert "no CUDA device" in res.stderr and "--dry-run" in res.stderr
    assert not (tmp_path / "gpu_check.json").exists()
    helped = gpu_check("--help")  # says how to run it on a GPU machine
    assert helped.returncode == 0
    assert "bash benchmarks/gpu_check.sh --out runs/gpu_check" in helped.stdout


def test_a_second_run_with_the_same_state_goes_on_where_the_first_stopped(tmp_path):
    """``--state``: a device call cut off at its limit is followed by a second one on the
    same machine, which runs only the checks that have not passed and reports them all."""
    every = ["favor", "favor_cohort", "flite", "drod", "ray", "favor_qlora_fleet",
             "drod_fleet_gpu", "flite_resnet18", "pfl_cifar10"]
    state, first, second = tmp_path / "state", tmp_path / "one", tmp_path / "two"
    res = gpu_check("--dry-run", "--out", str(first), "--state", str(state), "--skip",
                    *[s for s in every if s != "drod"])
    assert res.returncode == 0, res.stderr[-2000:]
    one = json.loads((first / "gpu_check.json").read_text())
    assert one == json.loads((state / "gpu_check.json").read_text())
    assert list(one["steps"]) == ["drod"] and one["env"]["carried_over"] == []
    res = gpu_check("--dry-run", "--out", str(second), "--state", str(state), "--skip",
                    *[s for s in every if s not in ("drod", "flite")])
    assert res.returncode == 0, res.stderr[-2000:]
    two = json.loads((second / "gpu_check.json").read_text())
    assert two["env"]["carried_over"] == ["drod"]
    assert [r["check"] for r in two["rows"]] == ["drod_deterministic", "flite_bf16",
                                                 "flite_bf16"]
    assert two["rows"][0] == one["rows"][0]  # carried, not run again
    assert "drod_deterministic" not in res.stdout  # only the new checks are printed
    assert two["env"]["step_seconds"]["drod"] == one["env"]["step_seconds"]["drod"]
    # a run in the other mode carries nothing over; a failed check is run again
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from gpu_check import carried

    assert carried(str(state), {"device": "cuda", "dry_run": False}) == ([], {}, {})
    assert carried(str(state), {"device": "cpu", "dry_run": True})[1] == {
        "drod": [0], "flite": [1, 2]}
    (state / "gpu_check.json").write_text(json.dumps(one)[:200])  # cut off mid-write
    assert carried(str(state), {"device": "cpu", "dry_run": True}) == ([], {}, {})
    failed = dict(one, rows=[dict(one["rows"][0], ok=False)])
    (state / "gpu_check.json").write_text(json.dumps(failed))
    from_failed = gpu_check("--dry-run", "--out", str(tmp_path / "three"), "--state",
                            str(state), "--skip", *[s for s in every if s != "drod"])
    assert "drod_deterministic" in from_failed.stdout
