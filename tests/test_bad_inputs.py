"""Bad input, as a new user (or an attacker) gives it: each case ends in one clear line
naming the field or file, the value and the rule — before any Ray work — and leaves an
existing run directory exactly as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from fedray.core.config import ConfigError, load_config
from fedray.core.storage import StateFileError, Storage
from fedray.runtime import Experiment, resumable, resume_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["clients.num_clients=4", "model.hidden=[8]", "rounds=2"]

# (overrides, the field the message must name, a fragment of the rule it must state)
CONFIG_CASES = [
    (["local.lr=-1"], "local.lr", "a number > 0"),
    (["local.lr=abc"], "local.lr", "a number"),
    (["local.lr=.nan"], "local.lr", "a finite number"),
    (["rounds=0"], "rounds", ">= 1"),
    (["rounds=2.5"], "rounds", "an integer"),
    (["eval.global_test=1"], "eval.global_test", "true or false"),
    (["locall.lr=0.1"], "locall", "known keys of 'config'"),
    (["local.lrr=0.1"], "local.lrr", "known keys of 'local'"),
    (["local.keep_optimizer_state=true"], "local.keep_optimizer_state",
     "plain SGD keeps no state"),
    (["eval.finetune_epochs=1", "algorithm.name=favor", "algorithm.base=x"],
     "eval.finetune_epochs", "lacks the 'finetune' capability"),
    (["eval.local_before_after=true", "algorithm.name=flite", "algorithm.identity_check=false"],
     "eval.local_before_after", "lacks the 'before_after' capability"),
    (["algorithm.name=favor", "algorithm.base=x", "algorithm.variant=pfedme",
      "algorithm.align=true"], "algorithm.align", "has no alignment loss"),
    (["local.lr"], "local.lr", "key.sub=value"),
    (["=3"], "=3", "a dotted key"),
    (["data.partition=bogus"], "data.partition", "one of"),
    (["model.name=nope"], "model.name", ""),
    (["algorithm.name=nope"], "algorithm.name", ""),
    (["model.width=3"], "model.width", "known keys"),
    (["clients.num_clients=4", "clients.per_round=5"], "clients.per_round",
     "at most clients.num_clients"),
    (["clients.fraction=0"], "clients.fraction", "> 0"),
    (["clients.num_clients=3", "clients.tiers=[default]"], "clients.tiers", "one per client"),
    (["clients.num_clients=2", "clients.tiers=[default, gpu]"], "clients.tiers[1]",
     "one of the tiers"),
    (["runtime.tiers=[{name: a}, {name: a}]"], "runtime.tiers", "unique tier names"),
    (["runtime.tiers=[]"], "runtime.tiers", "at least one tier"),
    (["runtime.tiers.0.executors=0"], "runtime.tiers.0", "give it whole"),
    (["runtime.tiers=[{name: a}]", "runtime.tiers.3.executors=1"], "runtime.tiers.3",
     "an index below 1"),
    (["runtime.tiers=[{name: a, executors: 0}]"], "runtime.tiers[0].executors", ">= 1"),
    (["runtime.tiers=[{name: a, num_gpus: 2}]"], "runtime.tiers[0].num_gpus", "<= 1"),
    (["runtime.tiers=[{name: a, gpus: 1}]"], "runtime.tiers[0].gpus", "known keys"),
    (["runtime.tiers=[{name: a, resources: {x: -1}}]"], "runtime.tiers[0].resources.x",
     "an amount >= 0"),
    (["runtime.tiers=[{name: a, resources: {CPU: 1}}]"], "runtime.tiers[0].resources.CPU",
     "a custom resource name"),
    (["runtime.device=cuda"], "runtime.tiers[0].num_gpus", "runtime.device=cuda"),
    (["runtime.device=tpu"], "runtime.device", "one of"),
    (["runtime.deterministic=true", "runtime.tiers=[{name: g, num_gpus: 0.5}]"],
     "runtime.tiers[0].accelerator_type", "one type per tier"),
    (["clients.num_clients=10", "clients.per_round=2", "runtime.min_accepted=3"],
     "runtime.min_accepted", "at most the 2 clients"),
    (["runtime.placement_timeout_s=-5"], "runtime.placement_timeout_s", "> 0"),
    (["payload.upload=int3"], "payload.upload", "one of"),
    (["data.dataset=cifar10"], "data.root", "a local directory"),
    (["data.dataset=cifar10", "data.root=/nonexistent/cifar"], "data.root",
     "an existing directory"),
    (["data.dataset=blogtext", "data.root=/nonexistent.csv"], "data.root",
     "an existing BlogText-schema CSV"),
    (["data.partition=pathological", "data.classes_per_client=11"],
     "data.classes_per_client", "at most the dataset's 10 classes"),
    (["rounds=3", "data.drift_round=4"], "data.drift_round", "a round in 1..rounds"),
    (["continual.tasks=3", "algorithm.name=drod", "model.name=sliceable_resnet18"],
     "continual.tasks", "a divisor"),
    (["continual.tasks=2", "continual.rounds_per_task=5"], "continual.tasks",
     "lacks the 'continual' capability"),
    (["algorithm.name=fedavg", "algorithm.base=/nonexistent"], "algorithm.base",
     "fedray pretrain"),
    (["algorithm.name=favor"], "algorithm.base", "a hub id or a model directory"),
    (["algorithm.name=orders", "algorithm.weighting=linear"], "algorithm.weighting", "one of"),
    (["algorithm.name=flite", "algorithm.r=0"], "algorithm.r", ">= 1"),
    # runtime.vectorize=on where cohorts cannot run (tests/test_vectorize.py has the CLI's)
    (["runtime.vectorize=on", "algorithm.name=drod", "model.name=sliceable_resnet18",
      "continual.tasks=2", "continual.rounds_per_task=5", "continual.method=er",
      "data.partition=dirichlet"],
     "runtime.vectorize",
     "continual.method=er replays"),
    (["runtime.vectorize=on", "algorithm.name=fedbuff"], "runtime.vectorize", "vectorizable"),
    (["runtime.vectorize=on", "local.dp_noise_multiplier=1.0"], "runtime.vectorize",
     "DP-SGD"),
    (["runtime.vectorize=on", "local.bf16=true"], "runtime.vectorize", "bf16"),
    (["runtime.vectorize=on", "runtime.cohort_size=0"], "runtime.cohort_size", ">= 1"),
    (["runtime.vectorize=on", "runtime.cohort_size=1000000000000", "model.hidden=[512]"],
     "runtime.cohort_size", "GB"),
]


WARM_RUNS = False  # conftest.warm_runs: its commands run in subprocesses on the session's Ray


@pytest.mark.parametrize("overrides,field,rule", CONFIG_CASES,
                         ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_bad_config_values(overrides, field, rule):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    text = str(err.value)
    assert f"config error at '{field}'" in text and rule in text, text
    assert "\n" not in text and len(text) < 600


BOMB = "name: [" + ", ".join(  # a billion laughs: 9**8 leaves once expanded
    f"&{k} [{', '.join(['*' + p] * 9 if p else ['x'] * 9)}]"
    for k, p in zip("abcdefgh", ["", *"abcdefg"], strict=True)) + "]\n"

FILE_CASES = [
    ("bad.yaml", b"rounds: [1, 2\n", "valid yaml"),
    ("list.yaml", b"- 1\n- 2\n", "a mapping at the top level"),
    ("latin1.yaml", b"name: caf\xe9\n", "UTF-8 text"),
    ("bad.toml", b"rounds = = 3\n", "valid toml"),
    ("bad.json", b"{rounds: 3}", "valid json"),
    ("bomb.yaml", BOMB.encode(), "at most 100,000 values (YAML aliases counted expanded)"),
    ("twice.yaml", b"name: x\nlocal: {lr: 0.5}\nrounds: 2\nlocal: {epochs: 3}\n",
     "found the key 'local' twice"),
    ("twice-nested.yaml", b"local:\n  lr: 0.5\n  lr: 0.1\n", "found the key 'lr' twice"),
    ("twice.json", b'{"name": "x", "name": "y"}', "the key 'name' appears twice"),
    ("huge.yaml", b"rounds: " + b"1" * 5000 + b"\n", "valid yaml"),
    ("huge.json", b'{"rounds": ' + b"1" * 5000 + b"}", "valid json"),
    ("huge.toml", b"rounds = " + b"1" * 5000 + b"\n", "valid toml"),
]


@pytest.mark.parametrize("name,content,rule", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_config_files(tmp_path, name, content, rule):
    path = tmp_path / name
    path.write_bytes(content)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.monotonic() - t0 < 5  # the alias bomb is shown, not expanded
    text = str(err.value)
    assert rule in text and len(text) < 600 and "\n" not in text, text


def test_a_yaml_merge_may_still_override_and_a_huge_override_is_one_line(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_bytes(b"base: &b {lr: 0.5, epochs: 2}\nlocal:\n  <<: *b\n  lr: 0.1\n")
    from fedray.core.config import load_yaml, parse_override

    assert load_yaml(path.read_text())["local"] == {"lr": 0.1, "epochs": 2}
    with pytest.raises(ConfigError, match="'rounds'.*a value YAML can read") as err:
        parse_override("rounds=" + "1" * 5000)
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="an existing .yaml"):
        load_config(tmp_path / "nope.yaml")


def snapshot(path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(tmp_path):
    """A run directory holding a finished-looking run: config, metrics part, checkpoint."""
    cfg = load_config(None, TINY)
    d = tmp_path / "run"
    s = Storage(str(d))
    import yaml

    s.write_bytes("config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode())
    s.write_bytes("metrics/rounds-000001.parquet", b"PAR1")
    s.write_checkpoint(1, {"round": 1, "global_state": {"w": np.ones(2, np.float32)}})
    return d


def test_new_run_into_a_run_dir_is_refused_and_nothing_changes(run_dir):
    before = snapshot(run_dir)
    with pytest.raises(ConfigError, match="--resume continues .* --overwrite replaces"):
        Experiment(load_config(None, TINY), str(run_dir))
    assert snapshot(run_dir) == before


def test_new_run_into_a_dir_without_checkpoint_is_refused_too(tmp_path):
    """It used to replace config.yaml and delete earlier metrics without a word."""
    d = tmp_path / "half"
    d.mkdir()
    (d / "config.yaml").write_text("name: earlier\n")
    (d / "notes.txt").write_text("mine")
    before = snapshot(d)
    with pytest.raises(ConfigError, match="an empty or new directory"):
        Experiment(load_config(None, TINY), str(d))
    with pytest.raises(ConfigError, match="'notes.txt' is not one"):  # not a run's file
        Experiment(load_config(None, TINY), str(d), overwrite=True)
    assert snapshot(d) == before


def old_run(d) -> None:
    (d / "metrics" / "rounds").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    (d / "config.yaml").write_text("name: earlier\n")
    (d / "summary.json").write_text("{}")
    (d / "metrics" / "rounds" / "000001.parquet").write_text("x")
    (d / "checkpoints" / "LATEST").write_text("1 " + "0" * 64)


@pytest.mark.ray
def test_overwrite_replaces_the_old_run_once_the_new_one_started(ray_session, tmp_path):
    d = tmp_path / "old"
    old_run(d)
    before = snapshot(d)
    exp = Experiment(load_config(None, TINY), str(d), overwrite=True)
    try:
        assert {k: v for k, v in snapshot(d).items() if not k.endswith(".lock")} == before
        exp.start()
        assert sorted(os.listdir(d)) == [".lock", "config.yaml", "data.json",
                                         "partition.parquet"] and exp.round == 0
        assert yaml.safe_load((d / "config.yaml").read_text())["runtime"]["device"] == "auto"
    finally:
        exp.release()
    assert sorted(os.listdir(d)) == ["config.yaml", "data.json", "partition.parquet"]


def test_overwrite_edge_cases_are_decided_before_anything_is_deleted(tmp_path):
    """A stale lock alone is an empty directory; a killed writer's temp files are a run's;
    a link among the run's names is refused before anything goes; a signal before the new
    run started says the old one was left as it was."""
    from fedray.core.storage import StateFileError

    lone = tmp_path / "lone"
    lone.mkdir()
    # a dead process's lock on this host (taken over)
    (lone / ".lock").write_text(json.dumps({"pid": 2 ** 22 + 7, "host": os.uname().nodename}))
    (lone / "config.yaml.tmp-4242").write_text("half")  # killed while writing its files
    exp = Experiment(load_config(None, TINY), str(lone), overwrite=True)
    assert not exp.replacing and (lone / "config.yaml").exists()
    assert not (lone / "config.yaml.tmp-4242").exists()
    exp.release()
    mine = tmp_path / "mine"
    old_run(mine)
    (mine / "thesis.tmp-final").write_text("mine")  # looks like a temp file, is not fedray's
    with pytest.raises(ConfigError, match="'thesis.tmp-final' is not one"):
        Experiment(load_config(None, TINY), str(mine), overwrite=True)

    d = tmp_path / "old"
    old_run(d)
    (d / "summary.json.tmp-4242").write_text("x")
    (d / ".report.tmp-ab_12").mkdir()
    exp = Experiment(load_config(None, TINY), str(d), overwrite=True)
    assert exp.replacing
    assert "was left as it was" in str(exp.stopped(KeyboardInterrupt()))
    exp.release()

    os.symlink(tmp_path / "lone", d / "report")
    before = snapshot(d)
    with pytest.raises(StateFileError, match="report"):
        Experiment(load_config(None, TINY), str(d), overwrite=True)
    assert snapshot(d) == before


def test_an_overwrite_that_cannot_start_leaves_the_old_run(tmp_path):
    """Ray unreachable: the one-line error, and the old run as it was (nothing deleted)."""
    d = tmp_path / "old"
    old_run(d)
    before = snapshot(d)
    cfg = os.path.join(ROOT, "configs", "fedavg_digits.yaml")
    res = cli("run", cfg, "-s", "rounds=1", "-s", "runtime.ray_address=127.0.0.1:9", "-o",
              str(d), "--overwrite", "--json", "--no-progress")
    assert res.returncode == 2 and "runtime.ray_address" in json.loads(res.stdout)["error"]
    assert snapshot(d) == before


def test_overwrite_never_empties_a_directory_that_is_not_a_run(tmp_path):
    """A mistyped --overwrite path: a directory without a run's config.yaml is refused
    before anything is deleted (one holding a file no run writes: the test above)."""
    home = tmp_path / "thesis"
    (home / "src").mkdir(parents=True)
    (home / "thesis.tex").write_text("mine")
    (home / "src" / "main.py").write_text("print()")
    before = snapshot(home)
    with pytest.raises(ConfigError, match="holding config.yaml") as err:
        Experiment(load_config(None, TINY), str(home), overwrite=True)
    assert err.value.path == "--overwrite" and snapshot(home) == before


def test_two_runs_never_write_one_directory(tmp_path):
    """The second writer is refused while the first holds RUN_DIR/.lock; a lock left by a
    process that died is taken over."""
    import json as _json
    import socket

    d = tmp_path / "run"
    d.mkdir()
    (d / ".lock").write_text(_json.dumps({"pid": 1, "host": socket.gethostname(),
                                          "since": "earlier"}))  # pid 1 is alive
    (d / "config.yaml").write_text("x: 1\n")
    with pytest.raises(ConfigError, match=r"no other run writes to: pid 1 on .* since earlier"):
        Experiment(load_config(None, TINY), str(d), overwrite=True)
    assert (d / "config.yaml").read_text() == "x: 1\n"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (d / ".lock").write_text(_json.dumps({"pid": int(dead), "host": socket.gethostname()}))
    exp = Experiment(load_config(None, TINY), str(d), overwrite=True)
    assert _json.loads((d / ".lock").read_text())["pid"] == os.getpid()
    exp.release()
    assert not (d / ".lock").exists()


def test_resume_of_a_missing_dir_is_refused_and_creates_nothing(tmp_path):
    with pytest.raises(ConfigError, match="a run directory holding config.yaml"):
        resume_config(str(tmp_path / "typo"))
    with pytest.raises(ConfigError, match="a run directory holding config.yaml"):
        Experiment(load_config(None, TINY), str(tmp_path / "typo"), resume=True)
    assert not (tmp_path / "typo").exists()


def test_resume_may_change_rounds_only(run_dir):
    assert resume_config(str(run_dir), ["rounds=5"]).rounds == 5
    assert resume_config(str(run_dir), ["rounds=2"]).rounds == 2
    with pytest.raises(ConfigError, match="at least the 2 rounds the run has on record"):
        resume_config(str(run_dir), ["rounds=1"])
    Storage(str(run_dir)).write_checkpoint(6, {"round": 6}, keep=2)  # it has run 6 rounds
    with pytest.raises(ConfigError, match="at least the 6 rounds the run has on record"):
        resume_config(str(run_dir), ["rounds=5"])
    with pytest.raises(ConfigError, match="only rounds=N may change"):
        resume_config(str(run_dir), ["local.lr=0.5"])


@pytest.mark.parametrize("latest", ["../../x.pkl", "1", "1 beef", "one " + "0" * 64])
def test_a_tampered_latest_is_refused_before_ray(run_dir, latest):
    (run_dir / "checkpoints" / "LATEST").write_text(latest)
    before = snapshot(run_dir)
    with pytest.raises(StateFileError, match="LATEST: got"):
        Experiment(load_config(None, TINY), str(run_dir), resume=True)
    assert snapshot(run_dir) == before


def test_truncated_checkpoint_is_refused_before_ray(run_dir):
    ck = run_dir / "checkpoints" / "000001.npz"
    ck.write_bytes(ck.read_bytes()[:40])
    before = snapshot(run_dir)
    with pytest.raises(StateFileError, match="000001.npz: its SHA-256 differs"):
        Experiment(load_config(None, TINY), str(run_dir), resume=True)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("target,rule", [("file", "a file, not a directory"),
                                         ("nosuchfs://bucket/run", "not a filesystem")])
def test_run_dir_that_is_a_file_or_an_unknown_uri(tmp_path, target, rule):
    if target == "file":
        (tmp_path / "file").write_text("x")
        target = str(tmp_path / "file")
    with pytest.raises(ConfigError, match=f"config error at 'run_dir'.*{rule}"):
        Experiment(load_config(None, TINY), target)


def test_jobs_refuse_to_continue_another_run(run_dir):
    before = snapshot(run_dir)
    assert resumable(str(run_dir), load_config(None, TINY)) is True
    with pytest.raises(ConfigError, match="differs at 'local.lr'"):
        resumable(str(run_dir), load_config(None, [*TINY, "local.lr=0.2"]))
    (run_dir / "config.yaml").rename(run_dir / "config.old")
    with pytest.raises(ConfigError, match="holds files but no config.yaml"):
        resumable(str(run_dir), load_config(None, TINY))
    (run_dir / "config.old").rename(run_dir / "config.yaml")
    assert snapshot(run_dir) == before
    assert resumable(str(run_dir.parent / "fresh"), load_config(None, TINY)) is False


def test_a_run_written_before_a_key_existed_is_still_this_run(run_dir):
    """Keys added by a later version (here payload.transforms and payload.error_feedback)
    take their defaults: the older config.yaml still holds this very run."""
    import yaml

    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    del stored["payload"]["transforms"], stored["payload"]["error_feedback"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(stored))
    assert resumable(str(run_dir), load_config(None, TINY)) is True
    with pytest.raises(ConfigError, match="differs at 'payload.error_feedback'"):
        resumable(str(run_dir), load_config(None, [*TINY, "payload.error_feedback=false"]))


@pytest.mark.parametrize("content,rule", [
    (b"", "reading it failed"),
    (b"\x00\x01\xff\xfe binary\n\x00", "reading it failed"),
    (b"id,gender,age,topic,sign,date,text\nx1,m,20,t,s,d,hello\n", "reading it failed"),
    (b"id,text\n1,hello\n", "lacks ['gender'"),
    (b"id,gender,age,topic,sign,date,text\n", "at least one post"),
])
def test_bad_blogtext_csv(tmp_path, content, rule):
    from fedray.data.blogtext import read_blogtext

    path = tmp_path / "blog.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_blogtext(path)
    text = str(err.value)
    assert "'data.root'" in text and str(path) in text and rule in text, text
    assert "\x00" not in text and "\n" not in text


@pytest.mark.parametrize("arg", ["local.lr", "local.lr=", "local.lr=grid:",
                                 "local.lr=uniform:1", "local.lr=bogus:1,2"])
def test_bad_sweep_space_arguments(arg):
    from fedray.front.tune import load_sweep, parse_space_arg

    cfg = os.path.join(ROOT, "configs", "fedavg_digits.yaml")
    with pytest.raises(ConfigError, match=r"'--space'|'(sweep.space.)?local.lr[.a-z]*'"):
        load_sweep(cfg, TINY, dict([parse_space_arg(arg)]))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedray", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_errors_are_one_object_and_no_traceback(tmp_path, run_dir):
    cfg = os.path.join(ROOT, "configs", "fedavg_digits.yaml")
    before = snapshot(run_dir)
    for args, needle in [
        (["run", cfg, "-s", "local.lr=-1"], "local.lr"),
        (["run", "--resume", str(tmp_path / "typo")], "--resume"),
        (["run", cfg, "-o", str(run_dir)], "run_dir"),
        (["run", "--resume", str(run_dir), "-s", "seed=3"], "only rounds=N"),
        (["run", "--resume", str(run_dir), "-s", "rounds=1"], "at least the 2 rounds"),
        (["run", cfg, "--resume", str(run_dir)], "not both"),
        (["run", "--resume", str(run_dir), "-o", str(tmp_path / "x")], "for a new run"),
        (["demo", "-o", str(run_dir)], "'--run-dir'"),
    ]:
        res = cli(*args, "--no-progress", "--json")
        assert res.returncode == 2, (args, res.stderr[-1500:])
        (line,) = res.stdout.strip().splitlines()
        assert needle in json.loads(line)["error"]
        assert "Traceback" not in res.stderr
        plain = cli(*args, "--no-progress")
        assert plain.returncode == 2 and plain.stdout == ""
        assert plain.stderr.startswith("error: ") and "Traceback" not in \
            plain.stderr
    assert snapshot(run_dir) == before
    assert not (tmp_path / "typo").exists()
    res = cli("drod", "ladder", "--theta", "2", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"].startswith("--theta: 2.0")


def test_credentials_in_uris_are_never_echoed(tmp_path):
    from fedray.core.config import redact

    uri = "s3://AKIAEXAMPLE:wJalrSECRET@bucket/runs/x"
    assert redact(f"run at {uri} and gs://tok@b/y") == ("run at s3://***@bucket/runs/x and "
                                                        "gs://***@b/y")
    with pytest.raises(ConfigError) as err:  # pyarrow's own message repeats the password
        Experiment(load_config(None, TINY), "file://user:hunter2@localhost/tmp/x")
    assert "hunter2" not in str(err.value) and "***@" in str(err.value)
    cfg = load_config(None, [*TINY, f"run_dir={uri}"])
    assert cfg.to_dict()["run_dir"] == "s3://***@bucket/runs/x"  # what config.yaml stores
    assert cfg.run_dir == uri  # the run itself still writes there
    assert redact("s3://AKIA:se@cret@bucket/x") == "s3://***@bucket/x"  # "@" in a password
    assert redact("postgresql://h/db?user=u&password=SECRET&x=1 and https://b/o?"
                  "X-Amz-Credential=AKIA&X-Amz-Signature=abc#f") == (
        "postgresql://h/db?user=u&password=***&x=1 and https://b/o?X-Amz-Credential=***&"
        "X-Amz-Signature=***#f")
    assert redact("see https://x.org/a, or mail a@b.org") == "see https://x.org/a, or mail " \
                                                              "a@b.org"
    for bad in ("https://user:pa ss@host", "https://h/?token=SECRET", "https://u:p@h"):
        from fedray.observe.tracking import check_config

        with pytest.raises(ConfigError, match="tracking.mlflow") as err:
            check_config(load_config(None, [*TINY, f"tracking.mlflow={bad}"]))
        assert "SECRET" not in str(err.value) and "pa ss" not in str(err.value)


def test_a_dead_ray_address_fails_in_seconds():
    """`ray.init` waits for a dead head indefinitely; init_ray checks the port first."""
    from fedray.runtime.experiment import check_reachable

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"'runtime.ray_address'.*nothing answered at "
                                          r"127.0.0.1:9"):
        check_reachable("127.0.0.1:9", "runtime.ray_address")
    with pytest.raises(ConfigError, match="'RAY_ADDRESS'"):
        check_reachable("ray://127.0.0.1:9", "RAY_ADDRESS")
    check_reachable("auto", "RAY_ADDRESS")  # left to Ray
    with pytest.raises(ConfigError, match="nothing answered at 127.0.0.1:9") as err:
        check_reachable("ray://admin:hunter2@127.0.0.1:9", "runtime.ray_address")
    assert "hunter2" not in str(err.value) and "admin" not in str(err.value)
    assert time.monotonic() - t0 < 30
    cfg = load_config(None, [*TINY, "runtime.ray_address=ray://admin:hunter2@10.0.0.1:10001"])
    assert cfg.to_dict()["runtime"]["ray_address"] == "ray://***@10.0.0.1:10001"  # config.yaml
    assert cfg.runtime.ray_address == "ray://admin:hunter2@10.0.0.1:10001"


def test_an_error_raised_in_an_actor_is_its_own_one_line():
    """An error raised inside the driver or an executor reaches the entry process as Ray's
    RayTaskError, whose text is the remote traceback in colour: the line a user sees is the
    original error's, with the original's exit status."""
    import ray.exceptions as rx

    from fedray.core.storage import StateFileError
    from fedray.observe.console import failure

    inner = rx.RayTaskError("Driver.run_round", "Traceback (most recent call last):\n  File "
                            "\"storage.py\"\n\x1b[36mray::Driver.run_round()\x1b[39m",
                            StateFileError("checkpoints/000000.npz", "a symbolic link"))
    nested = rx.RayTaskError("Experiment.step", "more traceback", inner.as_instanceof_cause())
    for e in (inner, inner.as_instanceof_cause(), nested):
        assert failure(e) == ("checkpoints/000000.npz: a symbolic link", 2)
    line, code = failure(rx.RayTaskError("f", "\x1b[36mtb\x1b[39m", KeyError("x")))
    assert code == 3 and line.startswith("internal error: KeyError") and "\x1b" not in line


def _parts(**edits) -> dict:
    parts = {"server": {"round": 1, "params": {"w": np.ones(2, np.float32)},
                        "failed_rounds": 0},
             "policy": {}, "ledger": {"totals": {"upload_bytes": 10, "download_bytes": 10},
                                      "has_base": [], "sim_time": 1.5},
             "clients": {"versions": {}}, "dispatcher": {"restarts": 0}, "sampler": {},
             "loop": {}}
    for path, value in edits.items():
        *up, last = path.split("__")
        node = parts
        for k in up:
            node = node[k]
        node[last] = value
    return parts


@pytest.mark.parametrize("edit,needle", [
    ({"server__round": -5}, "server.round is -5; checkpoint 1 holds round 1"),
    ({"server__round": "one"}, "server.round is 'one'"),
    ({"server__round": 10 ** 12}, "server.round is 1000000000000"),
    ({"server__round": 2}, "server.round is 2"),
    ({"server__failed_rounds": 3}, "server.failed_rounds is 3; a count of at most 1"),
    ({"server": [1, 2]}, "part 'server' is [1, 2]; a mapping"),
    ({"ledger__totals": {"upload_bytes": "lots"}}, "ledger.totals is"),
    ({"ledger__sim_time": float("nan")}, "ledger.sim_time is nan"),
])
def test_an_edited_checkpoint_with_a_matching_digest_is_refused_before_ray(run_dir, edit,
                                                                            needle):
    """Whoever rewrites a checkpoint can also rewrite the digest in LATEST: the fields every
    checkpoint holds are checked where it is read, before Ray, and nothing changes (a
    negative round once made the resume delete the rows it should keep)."""
    from fedray.core import checkpoint

    Storage(str(run_dir)).write_checkpoint(1, {"format": checkpoint.FORMAT,
                                               "parts": _parts(**edit)}, keep=2)
    before = snapshot(run_dir)
    with pytest.raises(StateFileError) as err:
        Experiment(load_config(None, TINY), str(run_dir), resume=True)
    assert needle in str(err.value) and "000001.npz" in str(err.value), str(err.value)
    assert snapshot(run_dir) == before


def test_a_well_formed_checkpoint_passes_the_checks(run_dir):
    from fedray.core import checkpoint

    Storage(str(run_dir)).write_checkpoint(1, {"format": checkpoint.FORMAT,
                                               "parts": _parts()}, keep=2)
    assert checkpoint.read(Storage(str(run_dir)))["server"]["round"] == 1


def test_a_link_planted_in_a_run_dir_is_refused_before_ray(run_dir, tmp_path):
    victim = tmp_path / "victim.npz"
    victim.write_bytes(b"keep me")
    (run_dir / "checkpoints" / "000000.npz").symlink_to(victim)
    before = snapshot(run_dir)
    with pytest.raises(StateFileError, match="000000.npz: a symbolic link inside a run "
                                             "directory"):
        Experiment(load_config(None, TINY), str(run_dir), resume=True)
    assert snapshot(run_dir) == before and victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("method,key,value,instead", [
    (["algorithm.name=favor", "algorithm.base=x"], "local.lr", "0.1", "algorithm.lora_lr"),
    (["algorithm.name=favor", "algorithm.base=x"], "local.batch_size", "8",
     "algorithm.micro_batch"),
    (["algorithm.name=favor", "algorithm.base=x"], "local.max_steps", "3", "algorithm.max_steps"),
    (["algorithm.name=flite", "algorithm.identity_check=false"], "local.keep_optimizer_state",
     "true", "afresh"),
    (["algorithm.name=flite", "algorithm.identity_check=false"], "local.weight_decay", "0.01",
     "algorithm.weight_decay"),
    ("configs/drod_split_digits.yaml", "local.keep_optimizer_state", "true",
     "momentum starts at zero"),
])
def test_a_local_knob_the_method_does_not_read_is_refused(method, key, value, instead):
    """A local.* value the method ignores would run a different experiment than asked for
    without a word: one line naming the key, its default and the method's own knob."""
    path, method = (os.path.join(ROOT, method), []) if isinstance(method, str) else (None,
                                                                                    method)
    with pytest.raises(ConfigError) as e:
        load_config(path, [*method, f"{key}={value}"])
    msg = str(e.value)
    assert e.value.path == key and "does not read it" in msg and instead in msg, msg
    assert "\n" not in msg
    load_config(path, method)  # the method's own defaults pass
    if "algorithm.name=flite" in method:  # and so do the local knobs it reads
        load_config(None, [*method, "local.batch_size=8", "local.epochs=2", "local.bf16=true"])


@pytest.mark.parametrize("key,value,rule", [("data.split_seed", "3", "80/10/10"),
                                            ("data.local_test_fraction", "0.5", "80/10/10"),
                                            ("data.alpha", "0.1", "algorithm.gini"),
                                            ("data.partition", "dirichlet", "natural id")])
def test_blogtext_refuses_the_split_knobs_it_does_not_read(tmp_path, key, value, rule):
    """FAVoR's BlogText authors are its clients, each split 80/10/10 (FAVoR §4), their
    imbalance set by algorithm.gini: the array datasets' split knobs would change nothing."""
    csv = tmp_path / "blog.csv"
    csv.write_text("id,gender,age,topic,sign,date,text\n")
    favor = ["data.dataset=blogtext", f"data.root={csv}", "algorithm.name=favor",
             "algorithm.base=x", "algorithm.asce=y"]
    with pytest.raises(ConfigError) as e:
        load_config(None, [*favor, f"{key}={value}"])
    assert e.value.path == key and rule in str(e.value), str(e.value)
    load_config(None, favor)


def test_a_run_stored_before_a_key_was_refused_still_resumes(tmp_path):
    """A run stored with a key its method never read (accepted before the key was refused)
    resumes with that key at its default, what the run read; a new run is refused."""
    import yaml

    from fedray.runtime.experiment import resume_config

    new = ["algorithm.name=fedbuff", "algorithm.concurrency=4", "clients.fraction=0.5"]
    with pytest.raises(ConfigError, match="clients.fraction"):
        load_config(None, new)
    stored = yaml.safe_load(yaml.safe_dump(load_config(None, new[:2]).to_dict()))
    stored["clients"]["fraction"] = 0.5
    stored["local"]["keep_optimizer_state"] = True  # without momentum: nothing was kept
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored))
    cfg = resume_config(str(tmp_path))
    assert cfg.clients.fraction == 1.0 and cfg.local.keep_optimizer_state is False
    assert cfg.algorithm["concurrency"] == 4
