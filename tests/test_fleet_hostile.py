"""Hostile inputs to the fleet (issue #34): the trace commands never replace or half-write
files, FedScale pickles with overflowing or non-numeric values are one error, the importer
stays fast on long behaviour traces, a link or speed that overflows the virtual clock is
refused before any Ray work, and messages show the value as written but never the content
of a file a trace path points at. Real files throughout (pickles, CSV and Parquet written
with pyarrow); the commands through the real CLI. No Ray."""

from __future__ import annotations

import json
import os
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedray.core.config import ConfigError, load_config
from fedray.front.cli import app
from fedray.services.fleet import Fleet, check_clock, fedscale_sessions, import_fedscale

CAP = {"7": {"computation": 162.0, "communication": 5648.1},
       "3": {"computation": 20.0, "communication": 100.0}}
BEH = {"7": {"active": [0, 50], "inactive": [20, 80], "finish_time": 100}}


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def dump(path, obj) -> str:
    path.write_bytes(pickle.dumps(obj))
    return str(path)


def one_error_line(res) -> str:
    """The CLI refused with exit 2 and one line on stderr (no traceback)."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config error at"), res.stderr
    return lines[0]


def listing(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, files in os.walk(root) for f in files)


def write_table(path, columns: dict) -> str:
    """A trace written by pyarrow (CSV or Parquet by the name's ending)."""
    table = pa.table(columns)
    if str(path).endswith(".parquet"):
        pq.write_table(table, str(path))
    else:
        pacsv.write_csv(table, str(path))
    return str(path)


# ----------------------------------------------------------------- 1. no replace, no half


def test_fleet_example_refuses_to_replace_files_without_overwrite(tmp_path):
    out = tmp_path / "ex"
    assert cli("fleet", "example", "--out", str(out), "--clients", "5").exit_code == 0
    (out / "devices.csv").write_text("mine\n")
    before = (out / "availability.csv").read_text()
    line = one_error_line(cli("fleet", "example", "--out", str(out), "--clients", "7"))
    assert "devices.csv" in line and "--overwrite" in line
    assert (out / "devices.csv").read_text() == "mine\n"
    assert (out / "availability.csv").read_text() == before
    assert listing(out) == ["availability.csv", "devices.csv"]

    res = cli("fleet", "example", "--out", str(out), "--clients", "7", "--json")
    assert res.exit_code == 2 and "--overwrite" in json.loads(res.stdout)["error"]

    res = cli("fleet", "example", "--out", str(out), "--clients", "7", "--overwrite", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["devices"] == str(out / "devices.csv")
    assert len((out / "devices.csv").read_text().splitlines()) == 8  # header + 7 clients
    assert listing(out) == ["availability.csv", "devices.csv"]


def test_fedscale_import_refuses_to_replace_files_without_overwrite(tmp_path):
    cap, beh = dump(tmp_path / "cap.pkl", CAP), dump(tmp_path / "beh.pkl", BEH)
    out = tmp_path / "fs"
    out.mkdir()
    (out / "availability.csv").write_text("mine\n")
    line = one_error_line(cli("fleet", "import-fedscale", cap, "--out", str(out),
                              "--behaviour", beh))
    assert "availability.csv" in line and "--overwrite" in line
    assert listing(out) == ["availability.csv"]  # ids.csv, devices.csv not written either
    assert (out / "availability.csv").read_text() == "mine\n"

    # without --behaviour, availability.csv is not one of the command's files
    assert cli("fleet", "import-fedscale", cap, "--out", str(out)).exit_code == 0
    assert listing(out) == ["availability.csv", "devices.csv", "ids.csv"]

    res = cli("fleet", "import-fedscale", cap, "--out", str(out), "--behaviour", beh,
              "--overwrite", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["written"] == [str(out / n) for n in
                                                 ("devices.csv", "ids.csv", "availability.csv")]
    assert (out / "availability.csv").read_text().splitlines()[1:] == ["1,0.0,20.0",
                                                                      "1,50.0,80.0"]


def _many(n: int, bad_at: int | None = None) -> tuple[dict, dict]:
    cap = {i: {"computation": 1.0 + i, "communication": 100.0} for i in range(n)}
    beh = {i: {"active": [0, 100], "inactive": [50, 150], "finish_time": 200}
           for i in range(n)}
    if bad_at is not None:
        beh[bad_at]["inactive"][1] = "later"
    return cap, beh


@pytest.mark.parametrize("how", ["truncated", "bad-value"])
def test_a_failed_import_leaves_nothing_behind(tmp_path, how):
    cap_obj, beh_obj = _many(2000, bad_at=1000 if how == "bad-value" else None)
    cap = dump(tmp_path / "cap.pkl", cap_obj)
    data = pickle.dumps(beh_obj)
    (tmp_path / "beh.pkl").write_bytes(data[:len(data) // 2] if how == "truncated" else data)
    beh = str(tmp_path / "beh.pkl")

    out = tmp_path / "new" / "fs"  # two directories the command would create
    line = one_error_line(cli("fleet", "import-fedscale", cap, "--out", str(out),
                              "--behaviour", beh))
    assert beh in line
    if how == "bad-value":
        assert "client 1000 field inactive[1]" in line and "'later'" in line
    assert not (tmp_path / "new").exists()

    # into a directory holding an earlier import, with --overwrite: the earlier files stay
    old = tmp_path / "old"
    good = dump(tmp_path / "good.pkl", _many(3)[1])
    assert cli("fleet", "import-fedscale", dump(tmp_path / "cap3.pkl", _many(3)[0]),
               "--out", str(old), "--behaviour", good).exit_code == 0
    before = {n: (old / n).read_bytes() for n in listing(old)}
    one_error_line(cli("fleet", "import-fedscale", cap, "--out", str(old), "--behaviour", beh,
                       "--overwrite"))
    assert {n: (old / n).read_bytes() for n in listing(old)} == before


# ----------------------------------------------------------------- 2. a linear importer


def reference_sessions(active, inactive, finish):
    """The importer's original per-interval search (quadratic), kept as the definition."""
    out = []
    offs = list(inactive)
    for j, a in enumerate(active):
        end = next((o for o in offs if o > a), finish)
        if j + 1 < len(active):
            end = min(end, active[j + 1])
        if end > a:
            out.append((a, end))
    return out


def reference_availability(cap: dict, beh: dict) -> str:
    keys = sorted(cap, key=lambda k: (str(type(k)), k))
    index = {k: i for i, k in enumerate(keys)}
    text = "client_id,start_s,end_s\n"
    for k in keys:
        if k not in beh:
            continue
        b = beh[k]
        finish = float(b.get("finish_time", max(b["active"] + b["inactive"] or [0])))
        for a, end in reference_sessions(b["active"], b["inactive"], finish):
            text += f"{index[k]},{float(a)},{float(end)}\n"
    return text


def _random_times(gen: random.Random, n: int) -> list:
    kind = gen.choice(["int", "float", "mixed", "dups"])
    if kind == "int":
        return [gen.randrange(0, 100) for _ in range(n)]
    if kind == "float":
        return [gen.uniform(0, 100) for _ in range(n)]
    if kind == "dups":
        return [gen.choice([0, 10, 10.0, 20, 30.5]) for _ in range(n)]
    return [gen.choice([gen.randrange(0, 100), gen.uniform(0, 100)]) for _ in range(n)]


def test_the_linear_search_gives_the_original_sessions_on_random_inputs():
    gen = random.Random(34)
    for _ in range(3000):
        active = _random_times(gen, gen.randrange(0, 12))
        inactive = _random_times(gen, gen.randrange(0, 12))
        if gen.random() < 0.5:  # most real traces are sorted
            active.sort()
            inactive.sort()
        finish = float(gen.choice([0, 50, 100, gen.uniform(0, 120)]))
        got = fedscale_sessions(active, inactive, finish)
        want = reference_sessions(active, inactive, finish)
        assert got == want and [type(v) for s in got for v in s] == \
            [type(v) for s in want for v in s], (active, inactive, finish)
    # exact comparison of ints beyond 2**53 with floats, as Python compares them
    big = 2 ** 60
    for active, inactive in [([big], [float(big), big + 1]), ([big + 1], [float(big)])]:
        assert fedscale_sessions(active, inactive, 2e18) == \
            reference_sessions(active, inactive, 2e18)


def test_imported_availability_is_byte_identical_to_the_original_algorithm(tmp_path):
    gen = random.Random(7)
    ids = [5, 2, "b", "a", (1, 2), (0, 9), 3.5, -1, 10 ** 20]  # ids the old code sorted
    cap = {k: {"computation": gen.uniform(1, 50), "communication": gen.randrange(1, 10 ** 6)}
           for k in ids}
    beh = {}
    for k in ids[:-1]:  # one client without a behaviour trace
        b = {"active": _random_times(gen, gen.randrange(0, 30)),
             "inactive": _random_times(gen, gen.randrange(0, 30))}
        if gen.random() < 0.5:
            b["active"].sort()
            b["inactive"].sort()
        if gen.random() < 0.7:
            b["finish_time"] = gen.choice([100, 80.5])
        beh[k] = b
    beh["not a client"] = {"active": [1], "inactive": [2]}
    out = import_fedscale(dump(tmp_path / "c.pkl", cap), str(tmp_path / "o"),
                          dump(tmp_path / "b.pkl", beh))
    assert open(out[2]).read() == reference_availability(cap, beh)
    rows = open(out[1]).read().splitlines()
    assert rows[0] == "client_id,fedscale_id" and len(rows) == len(ids) + 1


# ------------------------------------------------------- 3. overflow in a FedScale pickle


@pytest.mark.parametrize("which,client,field,value,shown", [
    ("cap", 7, "computation", 10 ** 400, "1000000"),
    ("cap", "x", "communication", float("inf"), "inf"),
    ("cap", (1, 2), "computation", float("nan"), "nan"),
    ("cap", 7, "communication", -5.0, "-5.0"),
    ("cap", 7, "computation", "fast", "'fast'"),
    ("cap", 7, "computation", 10 ** 5000, "digits"),
    ("beh", 7, "active[1]", 10 ** 400, "1000000"),
    ("beh", "x", "inactive[0]", float("nan"), "nan"),
    ("beh", 7, "finish_time", float("inf"), "inf"),
    ("beh", 7, "active[0]", -1, "-1"),
], ids=["cap-10**400", "cap-inf", "cap-nan", "cap-negative", "cap-str", "cap-10**5000",
        "beh-10**400", "beh-nan", "beh-finish-inf", "beh-negative"])
def test_a_bad_number_in_a_pickle_is_one_error_naming_pickle_client_and_field(
        tmp_path, which, client, field, value, shown):
    cap = {7: {"computation": 5.0, "communication": 10.0},
           "x": {"computation": 1.0, "communication": 2.0},
           (1, 2): {"computation": 1.0, "communication": 2.0}}
    beh = {k: {"active": [0, 10], "inactive": [5, 20], "finish_time": 30} for k in cap}
    if which == "cap":
        cap[client][field] = value
    else:
        name, _, pos = field.partition("[")
        if pos:
            beh[client][name][int(pos[:-1])] = value
        else:
            beh[client][name] = value
    cap_path, beh_path = dump(tmp_path / "cap.pkl", cap), dump(tmp_path / "beh.pkl", beh)
    out = tmp_path / "o"
    line = one_error_line(cli("fleet", "import-fedscale", cap_path, "--out", str(out),
                              "--behaviour", beh_path))
    pickle_path = cap_path if which == "cap" else beh_path
    assert f"({pickle_path}) client {client!r} field {field}'" in line, line
    assert shown in line and "a finite number" in line, line
    assert not out.exists()


# --------------------------------------------------- 4. a clock that overflows is refused


@pytest.mark.parametrize("override,field,value", [
    ("fleet.down_kbps=1.0e-300", "fleet.down_kbps", 1e-300),
    ("fleet.up_kbps=1.0e-290", "fleet.up_kbps", 1e-290),
    ("fleet.compute_ms_per_sample=1.0e+300", "fleet.compute_ms_per_sample", 1e300),
    ("fleet.bandwidth_sigma=100", "fleet.bandwidth_sigma", 100),
    ("fleet.compute_sigma=90", "fleet.compute_sigma", 90),
    ("fleet.tier_speed={default: 1.0e-300}", "fleet.tier_speed.default", 1e-300),
    ("fleet.latency_ms=1.0e+305", "fleet.latency_ms", 1e305),
])
def test_fleet_settings_that_overflow_the_clock_are_refused(override, field, value):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.path == field and err.value.value == value
    assert "simulated time for one round stays finite" in err.value.allowed


def test_ordinary_fleet_settings_pass_the_clock_check():
    for overrides in ([], ["fleet.down_kbps=1", "fleet.bandwidth_sigma=3"],
                      ["fleet.compute_ms_per_sample=1.0e+6", "fleet.compute_sigma=2"]):
        load_config(None, overrides)
    cfg = load_config(None, [])
    check_clock(cfg.fleet, ["default"])


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
@pytest.mark.parametrize("col,value", [("up_kbps", 1e-300), ("down_kbps", 5e-324),
                                       ("compute_ms_per_sample", 1e300),
                                       ("latency_ms", 1e306)])
def test_a_trace_row_that_overflows_the_clock_is_refused(tmp_path, suffix, col, value):
    cols = {"client_id": [0, 1, 2], "compute_ms_per_sample": [5.0, 5.0, 5.0],
            "down_kbps": [100.0, 100.0, 100.0], "up_kbps": [100.0, 100.0, 100.0],
            "latency_ms": [10.0, 10.0, 10.0]}
    cols[col][1] = value
    path = write_table(tmp_path / f"devices.{suffix}", cols)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=3", f"fleet.trace={path}"])
    assert err.value.path == f"fleet.trace ({path}) row 2 column {col}"
    assert err.value.value == value
    assert "simulated time for one round stays finite" in err.value.allowed


def test_a_clock_overflow_on_the_command_line_is_one_json_error_and_no_run_dir(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("clients: {num_clients: 4}\n")
    res = cli("run", str(cfg), "-s", "fleet.down_kbps=1.0e-300", "-o", str(tmp_path / "run"),
              "--json")
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 and "fleet.down_kbps" in err and "1e-300" in err
    assert "stays finite" in err
    assert not (tmp_path / "run").exists()


def test_the_clock_refuses_a_non_finite_time_at_run_time():
    fleet = Fleet.of(load_config(None, ["clients.num_clients=4"]))
    ok = fleet.seconds(np.arange(2), ["default"] * 2, np.array([1e6, 1e6]),
                       np.array([1e6, 1e6]), np.array([10, 10]))
    assert np.isfinite(ok["total"]).all()
    with pytest.raises(ConfigError) as err:
        fleet.seconds(np.arange(2), ["default"] * 2, np.array([1e6, 1.7e308]),
                      np.array([1e6, 1e6]), np.array([10, 10]))
    assert err.value.path == "fleet: simulated time of client 1"
    assert "a finite number of seconds" in err.value.allowed and "kbps" in err.value.allowed


# --------------------------------------------- 5. messages show what the user gave, no more


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
@pytest.mark.parametrize("key", ["trace", "availability"])
def test_a_huge_client_id_is_reported_as_written(tmp_path, suffix, key):
    if key == "trace":
        cols = {"client_id": [0.0, 1e30], "compute_ms_per_sample": [5.0, 5.0],
                "down_kbps": [100.0, 100.0], "up_kbps": [100.0, 100.0]}
    else:
        cols = {"client_id": [0.0, 1e30], "start_s": [0.0, 0.0], "end_s": [10.0, 10.0]}
    path = write_table(tmp_path / f"t.{suffix}", cols)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=4", f"fleet.{key}={path}"])
    text = str(err.value)
    assert "row 2 column client_id" in text and "got 1e+30" in text, text
    assert "9223372036854775808" not in text


def _assert_no_content(text: str, content: str, path) -> None:
    """No line of ``content``, nor any field of one (6 characters or more), in ``text``
    once the path the user gave is taken out of it."""
    text = text.replace(str(path), "")
    for line in content.splitlines():
        for piece in [line] + line.split(":") + line.split(","):
            if len(piece) >= 6:
                assert piece not in text, (piece, text)


@pytest.mark.parametrize("key", ["trace", "availability"])
def test_a_trace_linked_to_a_system_file_never_shows_its_content(tmp_path, key):
    link = tmp_path / "devices.csv"
    link.symlink_to("/etc/passwd")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=4", f"fleet.{key}={link}"])
    text = str(err.value)
    assert str(link) in text and "allowed: a" in text, text
    with open("/etc/passwd") as f:
        _assert_no_content(text, f.read(), link)


@pytest.mark.parametrize("content,rule", [
    # no comma anywhere: read as one column whose name is the first line
    ("root:x:0:0:root:/root:/bin/bash\nsecretuser:x:1000:1000::/home/s:/bin/sh\n",
     "a column named 'client_id'"),
    # uneven rows: pyarrow's message quotes the offending row
    ("client_id,compute_ms_per_sample,down_kbps,up_kbps\n0,1,1,1\nhunter2-password,xyz\n",
     "a row has 2 columns where the header has 4"),
])
def test_pyarrow_errors_are_stripped_of_file_content(tmp_path, content, rule):
    secret = tmp_path / "secret.txt"
    secret.write_text(content)
    link = tmp_path / "devices.csv"
    link.symlink_to(secret)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=4", f"fleet.availability={link}"])
    text = str(err.value)
    assert str(link) in text and rule in text, text
    _assert_no_content(text, content, link)


def test_a_parquet_that_is_not_one_is_named_without_content(tmp_path):
    path = tmp_path / "devices.parquet"
    path.write_bytes(b"PAR1" + b"secret-bytes-here" * 20 + b"PAR1")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=4", f"fleet.trace={path}"])
    text = str(err.value)
    assert str(path) in text and "not a Parquet file" in text and "secret" not in text


def test_a_pickle_linked_to_a_system_file_never_shows_its_content(tmp_path):
    link = tmp_path / "cap.pkl"
    link.symlink_to("/etc/passwd")
    line = one_error_line(cli("fleet", "import-fedscale", str(link), "--out",
                              str(tmp_path / "o")))
    assert str(link) in line and "allowed: a readable pickle (" in line, line
    with open("/etc/passwd") as f:
        text = f.read()
    assert f"'{text[0]}'" not in line.replace(str(link), "")
    _assert_no_content(line, text, link)
    assert not (tmp_path / "o").exists()


def test_a_text_file_as_a_pickle_is_refused_without_its_bytes(tmp_path):
    path = tmp_path / "cap.pkl"
    path.write_text("zebra-secret-token,1,2\n")
    line = one_error_line(cli("fleet", "import-fedscale", str(path), "--out",
                              str(tmp_path / "o")))
    assert "a readable pickle (not a pickle)" in line and "'z'" not in line, line
