"""Hostile inputs, second round (#34): links and names that leave their directory, unbounded
work on read-back paths, tracebacks, checks that came after Ray started, silent garbage,
messages that showed the wrong thing, signals.

:data:`CLI_CASES` lists every command-line case with the exit status and the message it
asserts; each runs the real ``fedray`` entry point in this process with ``RAY_ADDRESS``
pointing at a port where nothing listens, so an input that slipped past the checks to Ray
would fail with a different message. The fleet's and the datasets' cases are in
``test_fleet_hostile.py`` and ``test_data_hostile.py``; the first round's in
``test_bad_inputs.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import yaml

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.core.storage import StateFileError, Storage, pack_state, unpack_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "fedavg_digits.yaml")
TINY = ["clients.num_clients=4", "model.hidden=[8]", "rounds=2"]
DEAD_RAY = "127.0.0.1:9"  # the discard port: nothing answers, check_reachable fails fast


WARM_RUNS = False  # conftest.warm_runs: its runs are stopped by signals in subprocesses


def no_ray(cfg):
    raise ConfigError("test", "init_ray", "no Ray work: this input should have been refused "
                                          "before Ray")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``fedray ARGV`` in this process: (exit status, stdout, stderr). Starting or joining
    Ray is an error here (this process may hold the session's Ray, which an input that
    slipped past the checks would otherwise use), and so is a reachable RAY_ADDRESS."""
    import fedray.runtime
    import fedray.runtime.experiment as experiment
    from fedray.front.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = DEAD_RAY
    saved = experiment.init_ray, fedray.runtime.init_ray
    experiment.init_ray = fedray.runtime.init_ray = no_ray
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0
    finally:
        experiment.init_ray, fedray.runtime.init_ray = saved
        if old is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = old
    return code, out.getvalue(), err.getvalue()


def one_json(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout[-2000:]
    return json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"non-strict {c}"))


def snapshot(path) -> dict:
    """Every entry under ``path`` (links as links): name -> bytes or link target."""
    out = {}
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[p] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[p] = f.read()
    return out


def write_run(d, overrides=TINY, checkpoint=True) -> str:
    """A run directory as fedray writes it (config, data summary, metrics, a checkpoint of
    the right shapes, summary), without running one."""
    from fedray.core import checkpoint as ck
    from fedray.core.registry import make_method, method
    from fedray.observe.metrics import json_text

    cfg = load_config(None, overrides)
    s = Storage(str(d))
    s.write_bytes("config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode())
    s.write_parquet("rounds.parquet", [{"round": r, "global_accuracy": 0.1 * r,
                                        "total_bytes": 1000 * r, "upload_bytes": 600 * r,
                                        "download_bytes": 400 * r} for r in (1, 2)])
    s.write_bytes("summary.json", json_text({"name": cfg.name, "rounds": 2}).encode())
    if checkpoint:
        algo = make_method(method(cfg.algorithm["name"]), cfg)
        schema = algo.state_schema((64,), 10)
        params = {k: np.zeros(shape, dtype) for k, (shape, dtype) in schema.items()}
        ck.write(s, 1, {"server": _State({"round": 1, "params": params, "failed_rounds": 0})})
    return str(d)


class _State:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\nname: bomb\n"


# ----------------------------------------------------------------------------- the cases

def _symlinked_checkpoints(tmp):
    run = write_run(os.path.join(tmp, "run"))
    elsewhere = os.path.join(tmp, "elsewhere")
    os.makedirs(elsewhere)
    with open(os.path.join(elsewhere, "precious.npz"), "wb") as f:
        f.write(b"not fedray's")
    os.rename(os.path.join(run, "checkpoints"), os.path.join(tmp, "moved"))
    os.symlink(elsewhere, os.path.join(run, "checkpoints"))
    return ["run", "--resume", run, "--no-progress"]


def _symlinked_report(tmp):
    run = write_run(os.path.join(tmp, "run"))
    target = os.path.join(tmp, "target")
    os.makedirs(target)
    with open(os.path.join(target, "REPORT.md"), "w") as f:
        f.write("mine")
    os.symlink(target, os.path.join(run, "report"))
    return ["report", run]


def _symlinked_summary(tmp):
    run = write_run(os.path.join(tmp, "run"))
    os.remove(os.path.join(run, "summary.json"))
    os.symlink("/etc/passwd", os.path.join(run, "summary.json"))
    return ["report", run, "--out", os.path.join(tmp, "rep")]


def _existing_report(tmp):
    run = write_run(os.path.join(tmp, "run"))
    os.makedirs(os.path.join(run, "report"))
    with open(os.path.join(run, "report", "REPORT.md"), "w") as f:
        f.write("an earlier report")
    return ["report", run]


def _stored(content: bytes):
    def make(tmp):
        run = write_run(os.path.join(tmp, "run"))
        with open(os.path.join(run, "config.yaml"), "wb") as f:
            f.write(content)
        return ["run", "--resume", run, "--no-progress"]
    return make


def _config_file(name: str, content: str):
    def make(tmp):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(content)
        return ["config", path]
    return make


def _huge_npz_header(tmp):
    import hashlib
    import zipfile

    run = write_run(os.path.join(tmp, "run"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        hdr = io.BytesIO()
        np.lib.format.write_array_header_1_0(hdr, {"descr": "<f8", "fortran_order": False,
                                                   "shape": (10 ** 12,)})
        zf.writestr("a0.npy", hdr.getvalue() + b"\0" * 64)
        tree = io.BytesIO()
        np.save(tree, np.frombuffer(b'{"x": {"$np": 0}}', np.uint8))
        zf.writestr("__tree__.npy", tree.getvalue())
    data = buf.getvalue()
    with open(os.path.join(run, "checkpoints", "000001.npz"), "wb") as f:
        f.write(data)
    with open(os.path.join(run, "checkpoints", "LATEST"), "w") as f:
        f.write(f"1 {hashlib.sha256(data).hexdigest()}")
    return ["run", "--resume", run, "--no-progress"]


def _wrong_shape_checkpoint(tmp):
    from fedray.core import checkpoint as ck

    run = write_run(os.path.join(tmp, "run"))
    s = Storage(run)
    state = ck.read(s)
    key = sorted(state["server"]["params"])[0]
    state["server"]["params"][key] = np.zeros((3, 3), np.float32)
    state["server"]["round"] = 2  # checkpoint 2 holds round 2: only the shape is foreign
    ck.write(s, 2, {"server": _State(state["server"])})
    return ["run", "--resume", run, "--no-progress"]


def _run_dir_under_a_file(tmp):
    path = os.path.join(tmp, "plain")
    with open(path, "w") as f:
        f.write("x")
    return ["run", CONFIG, "-o", os.path.join(path, "run"), "--no-progress"]


def _corrupt_rounds(tmp):
    run = write_run(os.path.join(tmp, "run"))
    with open(os.path.join(run, "rounds.parquet"), "wb") as f:
        f.write(b"PAR1 not really")
    return ["report", run, "--out", os.path.join(tmp, "rep")]


def _corrupt_summary(tmp):
    run = write_run(os.path.join(tmp, "run"))
    with open(os.path.join(run, "summary.json"), "w") as f:
        f.write('{"name": ' * 5000)
    return ["report", run, "--out", os.path.join(tmp, "rep")]


def _ids_file(tmp: str, line: str) -> list[str]:
    path = os.path.join(tmp, "ids.txt")
    with open(path, "w") as f:
        f.write(line + "\n")
    return ["config", "-s", f"adversary.clients={path}"]


def _args(*argv):
    return lambda tmp: list(argv)


NESTED = "[" * 10_000 + "]" * 10_000

# (id, setup(tmp) -> argv, exit status, fragment of the one-line message)
CLI_CASES = [
    ("symlinked checkpoints/", _symlinked_checkpoints, 2, "a symbolic link inside a run"),
    ("symlinked report/", _symlinked_report, 2, "not a symbolic link"),
    ("summary.json linked to /etc/passwd", _symlinked_summary, 2, "a symbolic link"),
    ("report over an earlier one", _existing_report, 2, "pass --overwrite"),
    ("name with ..", _args("config", "-s", "name=../../etc"), 2, "a plain name"),
    ("absolute name", _args("config", "-s", "name=/tmp/x"), 2, "no path separator"),
    ("stored config: alias bomb", _stored(alias_bomb().encode()), 2,
     "at most 100,000 values"),
    ("stored config: a list", _stored(b"- 1\n- 2\n"), 2, "a mapping at the top level"),
    ("stored config: not UTF-8", _stored(b"name: \xff\xfe\n"), 2, "UTF-8 text"),
    ("stored config: nested", _stored(("a: " + NESTED + "\n").encode()), 2,
     "nesting at most 32"),
    ("config file: alias bomb", _config_file("bomb.yaml", alias_bomb()), 2,
     "at most 100,000 values"),
    ("config file: nested YAML", _config_file("deep.yaml", "a: " + NESTED), 2,
     "nesting at most 32"),
    ("config file: nested JSON", _config_file("deep.json", '{"a": ' + NESTED + "}"), 2,
     "nesting at most 32"),
    ("config file: nested TOML", _config_file("deep.toml", "a = " + NESTED), 2,
     "nesting at most 32"),
    ("override: nested", _args("config", "-s", "local.lr=" + NESTED), 2,
     "nested at most 32"),
    ("checkpoint header declares 8 TB", _huge_npz_header, 2, "declares shape (1000000000000,)"),
    ("checkpoint of another model", _wrong_shape_checkpoint, 2,
     "a checkpoint of this run's model"),
    ("-o under a regular file", _run_dir_under_a_file, 2, "run_dir"),
    ("-o in /proc", _args("run", CONFIG, "-o", "/proc/fedray-run", "--no-progress"), 2,
     "run_dir"),
    ("corrupt rounds.parquet", _corrupt_rounds, 2, "rounds.parquet"),
    ("corrupt summary.json", _corrupt_summary, 2, "summary.json"),
    ("unknown flag", _args("run", "--bogus"), 2, "usage: No such option: --bogus"),
    ("unknown command", _args("bogus"), 2, "usage:"),
    ("missing argument", _args("models", "show"), 2, "Missing argument"),
    ("demo --rounds 0", _args("demo", "--rounds", "0", "--no-progress"), 2, "'rounds'"),
    ("--target-epsilon not a number", _args("run", CONFIG, "--target-epsilon", "x"), 2,
     "dp.target_epsilon"),
    ("DP without noise", _args("config", "-s", "dp.enabled=true",
                               "-s", "dp.noise_multiplier=0"), 2, "ε = ∞"),
    ("local DP-SGD without noise", _args("config", "-s", "local.dp_noise_multiplier=0"), 2,
     "ε = ∞"),
    ("zero-width hidden layer", _args("config", "-s", "model.hidden=[16, 0]"), 2,
     "model.hidden[1]"),
    ("zero CNN channels", _args("config", "-s", "model.name=cnn", "-s", "model.channels=[0]"),
     2, "a size >= 1"),
    ("key with control characters", _args("config", "-s", "local.l\x1b[2Kr=1"), 2,
     "local.l\\x1b[2Kr"),
    ("compare of one run", _args("compare", "x"), 2, "two or more run directories"),
    ("sweep --name with ..", _args("tune", CONFIG, "--name", "../x", "--space",
                                   "local.lr=grid:0.1"), 2, "'--name'"),
    ("adversary ids: /etc/passwd", _args("config", "-s", "adversary.clients=/etc/passwd"), 2,
     "line 1 is not a non-negative integer"),
    ("adversary ids: a 5,000-digit id", lambda tmp: _ids_file(tmp, "1" * 5000), 2,
     "line 1 is not a non-negative integer of at most 18 digits"),
    ("pretrain into a used --out", lambda tmp: ["pretrain", CONFIG, "-o",
                                                write_run(os.path.join(tmp, "run"))], 2,
     "--overwrite"),
]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
@pytest.mark.parametrize("setup,code,needle", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_every_hostile_cli_input_is_one_line(tmp_path, setup, code, needle, as_json):
    """The documented exit status, one line naming the input and the rule (one strict JSON
    object with ``--json``), no traceback, and nothing under the test's directory changed —
    links' targets included."""
    argv = setup(str(tmp_path))
    before = snapshot(tmp_path)
    rc, out, err = run_cli(argv + (["--json"] if as_json else []))
    assert "Traceback" not in err and "Traceback" not in out
    if as_json:
        msg = one_json(out)
        assert msg["exit_code"] == rc == code, (rc, msg)
        text = msg["error"]
    else:
        assert rc == code, err[-2000:]
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, err[-2000:]
        text = lines[0]
    assert needle in text, text
    assert "root:" not in text  # never the content of a file it should not read
    assert snapshot(tmp_path) == before


def test_the_stored_config_bomb_is_refused_fast(tmp_path):
    import time

    argv = _stored(alias_bomb(12).encode())(str(tmp_path))
    t = time.perf_counter()
    rc, out, _ = run_cli(argv + ["--json"])
    assert rc == 2 and "at most 100,000 values" in one_json(out)["error"]
    assert time.perf_counter() - t < 10


@pytest.mark.parametrize("job,args,needle", [
    ("fedavg_digits.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("fedavg_digits.py", ["--rounds", "0"], "'rounds'"),
    ("fedavg_digits.py", ["-s", "name=../x"], "a plain name"),
    ("sweep_orders.py", ["--bogus"], "unrecognized arguments: --bogus"),
])
def test_jobs_end_every_error_in_one_json_object(job, args, needle):
    """The jobs share the commands' entry-point guard: a usage error or a bad value is one
    JSON object (exit 2), never argparse's usage text or a traceback."""
    res = subprocess.run([sys.executable, os.path.join("jobs", job), *args, "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, RAY_ADDRESS=DEAD_RAY))
    assert res.returncode == 2, res.stderr[-2000:]
    msg = one_json(res.stdout)
    assert needle in msg["error"] and msg["exit_code"] == 2
    assert "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- storage


def test_no_read_write_or_delete_through_a_link_in_a_run_dir(tmp_path):
    """A planted ``checkpoints -> elsewhere``: writing a checkpoint (which deletes older
    ones), reading one and listing are refused; the files there are untouched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "000001.npz").write_bytes(b"keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(elsewhere)
    s = Storage(str(run))
    for call in (lambda: s.write_checkpoint(5, {"x": 1}), lambda: s.read_checkpoint(),
                 lambda: s.listdir("checkpoints"), lambda: s.delete("checkpoints/000001.npz"),
                 lambda: s.write_bytes("../outside", b"x")):
        with pytest.raises(StateFileError, match="symbolic link|inside the run directory"):
            call()
    assert sorted(os.listdir(elsewhere)) == ["000001.npz"]
    assert (elsewhere / "000001.npz").read_bytes() == b"keep me"
    assert not (tmp_path / "outside").exists()


def test_npz_headers_are_checked_before_allocation():
    ok = pack_state({"a": np.arange(6.0).reshape(2, 3), "t": (1, "x"), "s": np.float32(2)})
    got = unpack_state(ok)
    assert got["a"].shape == (2, 3) and got["t"] == (1, "x")
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zipfile.ZipFile(io.BytesIO(ok)) as src:
            for info in src.infolist():
                zf.writestr(info.filename, src.read(info))
    with pytest.raises(StateFileError, match="compressed"):
        unpack_state(buf.getvalue(), "bomb.npz")
    deep = io.BytesIO()
    np.savez(deep, __tree__=np.frombuffer(b"[" * 200_000 + b"]" * 200_000, np.uint8))
    with pytest.raises(StateFileError, match="nests too deep"):
        unpack_state(deep.getvalue(), "deep.npz")


def test_output_files_are_all_or_nothing(tmp_path):
    from fedray.core.outputs import OutputFiles

    out = tmp_path / "new" / "out"
    with pytest.raises(RuntimeError):
        with OutputFiles(str(out), ["a.csv", "b.csv"]) as o:
            o.write_text("a.csv", "1")
            raise RuntimeError("in the middle")
    assert not (tmp_path / "new").exists()
    with OutputFiles(str(out), ["a.csv", "b.csv"]) as o:
        o.write_text("a.csv", "1")
        o.write_text("b.csv", "2")
    assert sorted(os.listdir(out)) == ["a.csv", "b.csv"]
    with pytest.raises(ConfigError, match="pass --overwrite"):
        OutputFiles(str(out), ["a.csv"])
    (out / "c.csv").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match="not a symbolic link"):
        OutputFiles(str(out), ["c.csv"], overwrite=True)


def test_numbers_read_the_same_in_a_file_an_override_and_an_option(tmp_path):
    """YAML 1.2 floats: ``1e-3`` is a number in a config file and in ``-s`` (PyYAML alone
    reads it as a string), as the typed CLI option it mirrors always did."""
    path = tmp_path / "c.yaml"
    path.write_text("local:\n  lr: 1e-3\n")
    assert load_config(path).local.lr == 0.001
    assert load_config(None, ["local.lr=1E-2"]).local.lr == 0.01
    assert load_config(None, ["dp.enabled=true", "dp.target_epsilon=1e1"]).dp.target_epsilon \
        == 10.0
    with pytest.raises(ConfigError, match="'name'"):
        load_config(None, ["name=a/b"])


def test_strict_json_files():
    """Every JSON file fedray writes is strict: NaN and ±Inf become null."""
    from fedray.observe.metrics import json_text

    text = json_text({"a": float("nan"), "b": [float("inf")], "c": 1.5})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "a": None, "b": [None], "c": 1.5}


# ----------------------------------------------------------------------------- before Ray


def test_executors_a_local_ray_cannot_place_fail_before_ray(tmp_path):
    """No Ray address: the executors must fit this machine before Ray starts, and no run
    directory is left behind (a subprocess: this test process may hold the session Ray)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "fedray", "run", CONFIG, "-s",
                          "runtime.tiers=[{name: big, executors: 1, num_cpus: 4096}]",
                          "-o", str(out), "--json", "--no-progress"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "the local Ray this run starts would have" in one_json(res.stdout)["error"]
    assert "Traceback" not in res.stderr and not out.exists()


@pytest.mark.ray
def test_a_new_run_that_fails_after_ray_started_removes_its_directory(ray_session, tmp_path):
    """Connected to a cluster (so the check happens there): executors asking for a resource
    nobody has fail placement, and the run directory the run created is gone, so the same
    command can simply be run again."""
    env = dict(os.environ, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedray", "run", CONFIG, "-s", "rounds=1", "-s",
           "runtime.tiers=[{name: odd, executors: 1, num_cpus: 0.5, resources: {unobtainium: "
           "1}}]", "-s", "runtime.placement_timeout_s=2", "-o", str(out), "--json",
           "--no-progress"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "unobtainium" in one_json(res.stdout)["error"] or "placed" in res.stdout
    assert "Traceback" not in res.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- property


def _property_base() -> str:
    base = tempfile.mkdtemp(prefix="fedray-prop-")
    write_run(os.path.join(base, "run"))
    return base


def _mutate(data: bytes, how: int, at: int, byte: int) -> bytes:
    if not data:
        return bytes([byte])
    at %= len(data)
    if how == 0:
        return data[:at]  # truncated
    if how == 1:
        return data[:at] + bytes([byte]) + data[at + 1:]  # one byte changed
    if how == 2:
        return data[:at] + bytes([byte]) * 64 + data[at:]  # bytes inserted
    return data * 3  # repeated


RUN_FILES = ["config.yaml", "summary.json", "rounds.parquet", "checkpoints/LATEST",
             "checkpoints/000001.npz"]


def test_property_corrupt_run_files_never_end_in_a_traceback():
    """Hypothesis: any one file of a run directory damaged (truncated, a byte changed, bytes
    inserted, repeated) — ``fedray run --resume``, ``report`` and ``config`` of it end with an
    exit status in {0, 1, 2}, exactly one JSON object under --json, no traceback, and the run
    directory unchanged."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base = _property_base()

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(RUN_FILES), how=st.integers(0, 3),
           at=st.integers(0, 1 << 20), byte=st.integers(0, 255),
           command=st.sampled_from(["resume", "report", "config"]))
    def check(name, how, at, byte, command):
        import shutil

        work = tempfile.mkdtemp(dir=base)
        run = os.path.join(work, "run")
        shutil.copytree(os.path.join(base, "run"), run, symlinks=True)
        path = os.path.join(run, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(_mutate(data, how, at, byte))
        before = snapshot(run)
        argv = {"resume": ["run", "--resume", run, "--no-progress"],
                "report": ["report", run, "--out", os.path.join(work, "rep")],
                "config": ["config", os.path.join(run, "config.yaml")]}[command]
        rc, out, err = run_cli(argv + ["--json"])
        assert rc in (0, 1, 2), (rc, out, err[-2000:])
        assert "Traceback" not in err
        msg = one_json(out)
        assert rc == 0 or set(msg) == {"error", "exit_code"}
        assert snapshot(run) == before
        shutil.rmtree(work)

    try:
        check()
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_property_corrupt_traces_never_end_in_a_traceback(tmp_path_factory):
    """Hypothesis: a device or availability trace (CSV or Parquet, as ``fedray fleet
    example`` writes them) damaged in any one way — ``fedray config -s fleet.trace=...``
    exits 0 or 2 with one JSON object and no traceback."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fedray.services.fleet import write_example

    base = tmp_path_factory.mktemp("traces")
    devices, avail = write_example(str(base / "csv"), 20, 0)
    for path in (devices, avail):
        pq.write_table(pacsv.read_csv(path), path.replace(".csv", ".parquet"))
    files = {("trace", "csv"): devices, ("availability", "csv"): avail,
             ("trace", "parquet"): devices.replace(".csv", ".parquet"),
             ("availability", "parquet"): avail.replace(".csv", ".parquet")}

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(which=st.sampled_from(sorted(files)), how=st.integers(0, 3),
           at=st.integers(0, 1 << 16), byte=st.integers(0, 255))
    def check(which, how, at, byte):
        kind, ext = which
        with open(files[which], "rb") as f:
            data = _mutate(f.read(), how, at, byte)
        path = tempfile.mktemp(suffix=f".{ext}", dir=base)
        with open(path, "wb") as f:
            f.write(data)
        argv = ["config", "-s", "clients.num_clients=20", "-s", f"fleet.{kind}={path}",
                "--json"]
        if kind == "availability":
            argv[-1:-1] = ["-s", "fleet.availability_period_s=86400"]
        rc, out, err = run_cli(argv)
        assert rc in (0, 2), (rc, out, err[-2000:])
        assert "Traceback" not in err
        one_json(out)
        os.remove(path)

    check()


KEYS = None


def _keys() -> list[str]:
    global KEYS
    if KEYS is None:
        from fedray.core.config import keys

        KEYS = sorted({k.key for k in keys()})
    return KEYS


def test_property_config_values_never_end_in_a_traceback():
    """Hypothesis: any known key (or a near miss) set to any YAML-ish value — ``fedray config
    -s KEY=VALUE --json`` exits 0 or 2 with one strict JSON object and no traceback."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.integers(-10 ** 30, 10 ** 30), st.floats(allow_nan=True),
                        st.booleans(), st.none(), st.text(max_size=12))
    values = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=8)

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(key=st.sampled_from(_keys()), suffix=st.sampled_from(["", "x", ".0", ".a"]),
           value=values, raw=st.booleans(), text=st.text(max_size=20))
    def check(key, suffix, value, raw, text):
        shown = text if raw else json.dumps(value)
        rc, out, err = run_cli(["config", "-s", f"{key}{suffix}={shown}", "--json"])
        assert rc in (0, 2), (rc, out, err[-2000:])
        assert "Traceback" not in err
        one_json(out)

    check()


# ----------------------------------------------------------------------------- signals


@pytest.mark.ray
def test_sigterm_stops_a_run_with_one_line_and_resume_stays_bitwise(ray_session, tmp_path):
    """SIGTERM mid-run: exit 143 with one line naming the last checkpointed round and the
    resume command; that command finishes bitwise equal to an uninterrupted run."""
    import signal

    from conftest import tiny_overrides, wait_for_checkpoint

    from fedray.core import checkpoint

    env = dict(os.environ, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    sets = []
    for o in tiny_overrides(rounds=6, **{"clients.fraction": 0.5}):
        sets += ["-s", o]
    cmd = [sys.executable, "-m", "fedray", "run", CONFIG, *sets, "--no-progress"]
    full = subprocess.run(cmd + ["-o", str(tmp_path / "full"), "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr[-2000:]
    victim = subprocess.Popen(cmd + ["-o", str(tmp_path / "cut")], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latest = tmp_path / "cut" / "checkpoints" / "LATEST"
    wait_for_checkpoint(latest, 2)
    victim.send_signal(signal.SIGTERM)
    out, err = victim.communicate(timeout=120)
    cut_at = int(latest.read_text().split()[0])
    assert victim.returncode == 143, err[-2000:]
    assert 2 <= cut_at < 6, "the run finished before it could be stopped"
    assert "Traceback" not in err and "Fatal Python error" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert f"stopped by SIGTERM after round {cut_at} was checkpointed" in line
    assert f"fedray run --resume {tmp_path / 'cut'}" in line
    res = subprocess.run([sys.executable, "-m", "fedray", "run", "--resume",
                          str(tmp_path / "cut"), "--no-progress", "--json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]

    def final(d):
        return checkpoint.read(Storage(str(d)))["server"]["params"]

    a, b = final(tmp_path / "full"), final(tmp_path / "cut")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_signal_that_ray_wrapped_still_stops_the_run_as_a_signal(tmp_path, monkeypatch):
    """A SIGINT that arrives while Ray's compiled code runs (``ray.get`` of the driver's
    setup, the seconds a user is most likely to press Ctrl-C) is raised there and comes
    out as Ray's SystemError caused by the signal's Stopped: still the stop's one line and
    exit status, and the new run directory removed — not an internal error, exit 3."""
    from fedray.core.config import load_config
    from fedray.observe.console import Stopped, failure
    from fedray.runtime import experiment

    def start(self):
        self.storage.write_bytes("config.yaml", b"name: x\n")  # the run dir exists
        try:
            raise Stopped("SIGINT", 130)
        except Stopped as stop:
            raise SystemError("<built-in method __new__> returned a result with an "
                              "exception set") from stop

    monkeypatch.setattr(experiment.Experiment, "start", start)
    run = tmp_path / "run"
    with pytest.raises(Stopped) as err:
        experiment.run_experiment(load_config(None, ["clients.num_clients=4", "rounds=1"]),
                                  str(run), progress=False)
    line, code = failure(err.value)
    assert code == 130 and "stopped by SIGINT before its first checkpoint" in line, line
    assert not run.exists()
    try:
        raise SystemError("wrapped") from Stopped("SIGTERM", 143)
    except SystemError as wrapped:
        assert failure(wrapped) == ("stopped by SIGTERM", 143)
