"""The CLI and the job entry point, for real (Ray runs via the session's instance or, for
subprocesses, by joining it through RAY_ADDRESS)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import strict_json, tiny_overrides, wait_for_checkpoint
from typer.testing import CliRunner

from fedray.core import checkpoint
from fedray.core.storage import Storage
from fedray.front.cli import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runner = CliRunner()


WARM_RUNS = False  # conftest.warm_runs: its jobs run as subprocesses on the session Ray


def one_json(result) -> dict:
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_models_json():
    out = one_json(runner.invoke(app, ["models", "--json"]))
    assert {m["name"] for m in out["models"]} >= {"mlp", "cnn", "lstm", "resnet18", "resnet34"}
    out = one_json(runner.invoke(app, ["models", "show", "resnet18", "--num-classes", "100",
                                       "--json"]))
    assert out["parameters"] == 11_220_132 and round(out["flops"] / 1e9, 3) == 1.111
    out = one_json(runner.invoke(app, ["models", "show", "mlp", "--input-shape", "784",
                                       "--json"]))
    assert out["parameters"] == 203_530 and out["flops"] == 2 * (784 * 256 + 256 * 10)


def test_models_show_errors():
    res = runner.invoke(app, ["models", "show", "vgg", "--json"])
    assert res.exit_code == 2 and "resnet18" in json.loads(res.stdout)["error"]


def test_config_json_and_keys():
    out = one_json(runner.invoke(app, ["config", "-s", "local.lr=0.3", "--json"]))
    assert out["local"]["lr"] == 0.3 and out["runtime"]["tiers"][0]["name"] == "default"
    keys = one_json(runner.invoke(app, ["config", "--keys", "--json"]))["keys"]
    assert any(k["key"] == "data.alpha" and "Dirichlet" in k["help"] for k in keys)
    assert [k["key"] for k in keys if not k["help"] or not k["type"]] == []  # every knob
    rows = {(k["key"], tuple(k["applies_to"])): k for k in keys}
    assert rows[("model.hidden", ("mlp",))]["default"] == [256]
    assert rows[("model.hidden", ("mlp",))]["type"] == "a list of int"
    assert "mlp" in rows[("model.name", ())]["type"] and ("model", ()) not in rows


def test_methods_lists_capabilities_and_server_optimizers():
    out = one_json(runner.invoke(app, ["methods", "--json"]))
    rows = {r["name"]: r for r in out["methods"]}
    assert {"fedavg", "fedadam", "orders", "drod", "favor", "flite"} <= set(rows)
    assert rows["fedavg"]["server_optimizer"] == "any (default sgd)"
    assert rows["fedavgm"]["server_optimizer"] == "momentum (fixed)"
    assert rows["drod"]["server_optimizer"] is None and "continual" in rows["drod"][
        "capabilities"]
    assert "linear" in rows["fedavg"]["capabilities"]
    assert "linear" not in rows["orders"]["capabilities"]
    assert "asynchronous" in rows["fedbuff"]["capabilities"]
    assert set(out["capabilities"]) >= {"dp", "transforms", "linear", "vectorizable"}
    assert {r["name"] for r in out["methods"] if r["sweep_preset"]} == {"drod", "orders",
                                                                        "flite", "favor"}


def test_run_bad_config_fails_before_ray(tmp_path):
    res = runner.invoke(app, ["run", str(tmp_path / "nope.yaml"), "--json"])
    assert res.exit_code == 2 and "config file" in json.loads(res.stdout)["error"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 2\nlocal:\n  lr: -1\n")
    res = runner.invoke(app, ["run", str(cfg)])
    assert res.exit_code == 2 and "local.lr" in res.output and "> 0" in res.output


@pytest.mark.ray
def test_run_report_compare(ray_session, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: cli\n")
    runs = []
    for algo in ["fedavg", "fedprox"]:
        sets = []
        for o in tiny_overrides(**{"algorithm.name": algo, "rounds": 2}):
            sets += ["-s", o]
        out = one_json(runner.invoke(app, ["run", str(cfg), *sets, "-o",
                                           str(tmp_path / algo), "--json", "--no-progress"]))
        assert out["algorithm"] == algo and out["rounds"] == 2
        runs.append(str(tmp_path / algo))
    rep = one_json(runner.invoke(app, ["report", runs[0], "--json"]))
    assert all(os.path.getsize(p) > 10_000 for p in rep["plots"])
    assert "| cli |" in open(rep["markdown"]).read()
    cmp = one_json(runner.invoke(app, ["compare", *runs, "--out", str(tmp_path / "cmp"),
                                       "--json"]))
    assert len(cmp["metrics"]) == 2 and [os.path.basename(p) for p in cmp["plots"]] == [
        "accuracy_vs_round.png", "accuracy_vs_bytes.png", "accuracy_vs_sim_time.png"]


def _env(ray_session) -> dict:
    env = dict(os.environ)
    env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    return env


@pytest.mark.ray
def test_kill_then_resume_reaches_uninterrupted_state(ray_session, tmp_path):
    """Start `fedray run` in a subprocess, SIGKILL it after its second checkpoint,
    `fedray run --resume`, compare with an uninterrupted run bitwise."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: killme\n")
    sets = []
    for o in tiny_overrides(rounds=6, **{"local.momentum": 0.9,
                                         "local.keep_optimizer_state": "true",
                                         "clients.fraction": 0.5}):
        sets += ["-s", o]
    cmd = [sys.executable, "-m", "fedray", "run", str(cfg), *sets, "--no-progress", "--json"]
    full = subprocess.run(cmd + ["-o", str(tmp_path / "full")], env=_env(ray_session),
                          capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr[-2000:]

    victim = subprocess.Popen(cmd + ["-o", str(tmp_path / "cut")], env=_env(ray_session),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    latest = tmp_path / "cut" / "checkpoints" / "LATEST"
    wait_for_checkpoint(latest, 2)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    # the driver actor lives in the session's Ray, not in the killed process group: until
    # Ray reaps it (its owner is dead) it may still checkpoint a round; read LATEST once it
    # has stopped changing
    cut_at, still = int(latest.read_text().split()[0]), time.monotonic()
    while time.monotonic() - still < 3:
        time.sleep(0.2)
        now = int(latest.read_text().split()[0])
        if now != cut_at:
            cut_at, still = now, time.monotonic()
    assert 2 <= cut_at < 6, "the run finished before it could be killed"

    res = subprocess.run([sys.executable, "-m", "fedray", "run", "--resume", str(tmp_path / "cut"),
                          "--no-progress", "--json"], env=_env(ray_session),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["rounds"] == 6 and summary["rounds_this_session"] == 6 - cut_at

    def final(d):
        return checkpoint.read(Storage(str(d)))["server"]["params"]

    a, b = final(tmp_path / "full"), final(tmp_path / "cut")
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.ray
def test_job_entry_point_joins_ray_address(ray_session, tmp_path):
    """Also fedavg_digits.py's case of the next test: one strict JSON object on stdout, its
    stage progress on stderr (the job's --no-progress runs in tests/test_runtime.py)."""
    res = subprocess.run([sys.executable, "jobs/fedavg_digits.py", "--smoke",
                          "--run-dir", str(tmp_path / "job"), "--json"], cwd=ROOT,
                         env=_env(ray_session), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = strict_json(res.stdout)
    assert "[stage 1/" in res.stderr, res.stderr[-2000:]  # progress: stderr
    assert summary["rounds"] == 3 and summary["final_global_accuracy"] > 0.3
    assert os.path.exists(summary["report"])


def test_json_output_is_strict_json():
    """NaN and ±Infinity (bare in json.dumps output, rejected by strict parsers) are null in
    everything the CLI and the jobs print with --json."""
    import math

    import numpy as np

    from fedray.observe.metrics import json_text

    obj = {"a": math.nan, "b": [1.5, math.inf, -math.inf], "c": np.float32("nan"),
           "d": np.float64(2.0), "e": {"f": (np.int64(3), None)}, "g": object}
    text = json_text(obj)
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert back == {"a": None, "b": [1.5, None, None], "c": None, "d": 2.0,
                    "e": {"f": [3, None]}, "g": str(object)}


def json_commands() -> set[tuple[str, ...]]:
    """Every command and sub-command of the app (methods' plugins included) that takes
    --json, read from the app itself."""
    import typer.main

    found = set()

    def walk(cmd, path: tuple[str, ...]) -> None:
        if any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            found.add(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


@pytest.fixture(scope="module")
def small_run(ray_session, tmp_path_factory) -> str:
    """One small finished run for the commands that read a run directory."""
    from fedray.core.config import load_config
    from fedray.runtime import run_experiment

    out = str(tmp_path_factory.mktemp("small") / "run")
    run_experiment(load_config(None, tiny_overrides(rounds=2)), out, progress=False)
    return out


@pytest.mark.ray
def test_every_json_command_prints_one_strict_json_object(small_run, tmp_path, monkeypatch):
    """Each command with --json, given a cheap valid invocation: exit 0 and exactly one JSON
    object on stdout that a strict parser reads. A command missing here fails the test."""
    import pickle

    monkeypatch.setenv("FEDRAY_VERBOSE", "0")  # restored after `fedray -v` below

    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: json\n")
    sets = [a for o in tiny_overrides(rounds=1) for a in ("-s", o)]
    with open(tmp_path / "cap.pkl", "wb") as f:
        pickle.dump({7: {"computation": 12.0, "communication": 900.0}}, f)
    invocations = {
        ("run",): ["run", str(cfg), *sets, "-o", str(tmp_path / "run")],
        ("demo",): ["demo", "--rounds", "1", "--no-report", "-o", str(tmp_path / "demo")],
        ("report",): ["report", small_run, "--out", str(tmp_path / "report")],
        ("compare",): ["compare", small_run, str(tmp_path / "run"),
                       "--out", str(tmp_path / "cmp")],
        ("tune",): ["tune", str(cfg), *sets, "--space", "local.lr=grid:0.1",
                    "--storage", str(tmp_path / "sweeps")],
        ("pretrain",): ["pretrain", str(cfg), *sets, "-s", "pretrain.epochs=1",
                        "-o", str(tmp_path / "base")],
        ("config",): ["config", "-s", "local.lr=0.3"],
        ("models",): ["models"],
        ("methods",): ["methods"],
        ("models", "show"): ["models", "show", "mlp", "--input-shape", "784"],
        ("fleet", "example"): ["fleet", "example", "--out", str(tmp_path / "fleet"),
                               "--clients", "5"],
        ("fleet", "import-fedscale"): ["fleet", "import-fedscale", str(tmp_path / "cap.pkl"),
                                       "--out", str(tmp_path / "fedscale")],
        ("drod", "ladder"): ["drod", "ladder", "--width", "8", "--num-classes", "10",
                             "--input-shape", "3,8,8"],
        ("favor", "adapter-size"): ["favor", "adapter-size", "--model",
                                    "qwen2.5-0.5b-instruct"],
        ("flite", "info"): ["flite", "info", "--model", "cnn", "--num-classes", "10"],
    }
    assert json_commands() == set(invocations), "give each --json command an invocation here"
    outputs = {}
    for path, args in invocations.items():
        res = runner.invoke(app, [*args, "--json"])
        assert res.exit_code == 0, (path, res.output[-2000:])
        outputs[path] = strict_json(res.stdout)
    assert outputs[("run",)]["rounds"] == 1 and outputs[("tune",)]["trials"] == 1
    res = runner.invoke(app, ["run", "--resume", str(tmp_path / "run"), "-s", "rounds=2"])
    assert res.exit_code == 0 and "2 rounds in" in res.stdout  # without --json: for people
    assert f"files in {tmp_path / 'run'}:" in res.stdout and "rounds.parquet" in res.stdout
    assert "[stage 1/1] json" not in res.stdout  # progress: stderr only
    import yaml  # the raised rounds are the run's now: recorded, and never lowered again

    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["rounds"] == 2
    res = runner.invoke(app, ["run", "--resume", str(tmp_path / "run"), "-s", "rounds=1"])
    assert res.exit_code == 2 and "at least the 2 rounds the run has on record" in res.output
    res = runner.invoke(app, ["-v", "config", "--json"])  # the global option
    assert res.exit_code == 0 and strict_json(res.stdout)["rounds"] > 0


@pytest.mark.ray
def test_every_job_json_prints_one_strict_json_object(ray_session, tmp_path):
    """The same for every jobs/*.py script (each has --json): its --smoke, joining the
    session's Ray as a submitted job would. A script missing here fails the test."""
    from conftest import job_process

    tiers = "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"
    invocations = {
        # its --smoke --json (strict JSON, stages on stderr) is the previous test's run
        "fedavg_digits.py": None,
        "orders_noniid.py": ["--smoke", "--run-dir", str(tmp_path / "orders")],
        # their --smoke runs with --json through conftest.run_job (strict JSON, stages) in
        # tests/test_drod.py and tests/test_flite.py
        "drod_split_cifar100.py": None,
        "flite_cifar100.py": None,
        "sweep.py": ["configs/fedavg_digits.yaml", "--smoke", "--space", "local.lr=grid:0.1",
                     "-s", "rounds=1", "-s", "clients.num_clients=6", "-s", tiers],
        "sweep_orders.py": ["--smoke"],
        # one θ of the preset's grid: a two-θ grid runs (and is counted) as a submitted job
        # in tests/cluster/run.sh
        "sweep_drod.py": ["--smoke", "--space", "algorithm.theta=grid:0.5"],
        "sweep_flite.py": ["--smoke"],
        "sweep_favor.py": ["--smoke"],
        # its --smoke (minutes) runs once, with --json, in tests/test_favor.py (end to end)
        "favor_blogtext.py": None,
    }
    jobs = {p for p in os.listdir(os.path.join(ROOT, "jobs"))
            if p.endswith(".py") and not p.startswith("_")}
    assert jobs == set(invocations), "give each job an invocation here"
    for script, args in invocations.items():
        if args is None:
            continue
        if script.startswith("sweep"):
            args = [*args, "--storage", str(tmp_path / "sweeps")]
        res = job_process(ray_session, script, *args, "--json", timeout=600)
        assert res.returncode == 0, (script, res.stderr[-3000:])
        strict_json(res.stdout)
        assert "[stage 1/" in res.stderr, (script, res.stderr[-2000:])  # progress: stderr


def test_the_summary_says_what_the_global_accuracy_was_scored_on():
    from fedray.front.cli import summary_text

    base = {"run_dir": "runs/x", "algorithm": "fedavg", "model": "mlp", "dataset": "flair",
            "num_clients": 3, "rounds": 2, "wall_seconds": 1.0,
            "final_global_accuracy": 0.5, "best_global_accuracy": 0.5,
            "final_personalized_accuracy": None, "total_upload_bytes": 1,
            "total_download_bytes": 2, "client_failures": 0, "executor_restarts": 0}
    assert "global test set: all of it (12,519 scored)" in summary_text(
        base | {"global_test_set": "all", "final_global_n": 12519.0})
    assert "global test set: a sample (682 scored)" in summary_text(
        base | {"global_test_set": "sample", "final_global_n": 682.0})
    assert "global test set" not in summary_text(base | {"final_global_n": None})
