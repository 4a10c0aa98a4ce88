"""Hostile datasets (#34): every bad Parquet or Hugging Face table, planted manifest,
oversized configuration or damaged cache ends in one ConfigError naming the file, the
column or field, the value and the rule — before any Ray work — and the population cache
never keeps a temp file. The inputs are real files: Parquet written with pyarrow, Hugging
Face directories written by ``datasets.save_to_disk``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.data import population
from fedray.data.population import TablePopulation, build_client_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 40  # rows: writers w0..w7, five rows each
IDS = [f"w{i % 8}" for i in range(N)]
LABELS = [i % 3 for i in range(N)]
FEATS = np.random.default_rng(0).standard_normal((N, 4)).astype(np.float32)


def _fixed(values: np.ndarray = FEATS) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _write(tmp_path, columns: dict, name: str = "t.parquet") -> str:
    path = tmp_path / "src" / name
    path.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return str(path)


def _overrides(tmp_path, root: str, *extra: str, dataset: str = "parquet") -> list[str]:
    return [f"data.dataset={dataset}", f"data.root={root}", "data.client_column=w",
            "clients.num_clients=4", f"data.cache_dir={tmp_path / 'cache'}", *extra]


def _error(overrides: list[str], at_load: bool) -> str:
    """The message of the ConfigError the config raises: from load_config itself when the
    check is cheap (``at_load``), else from building the data (still before Ray)."""
    if at_load:
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides)
    else:
        cfg = load_config(None, overrides)
        with pytest.raises(ConfigError) as err:
            build_client_data(cfg)
    return str(err.value)


# (columns, extra overrides, field, column, fragments the rule must state, raised at load)
TYPE_CASES = {
    "list of strings": ({"w": IDS, "f": [["a", "b"]] * N, "label": LABELS}, [],
                        "data.feature_columns", "f", ["list<element: string>"], True),
    "list of strings, named": ({"w": IDS, "f": [["a", "b"]] * N, "label": LABELS},
                               ["data.feature_columns=[f]"], "data.feature_columns", "f",
                               ["list<element: string>"], True),
    "nested lists": ({"w": IDS, "f": [[[1.0, 2.0], [3.0]]] * N, "label": LABELS},
                     ["data.feature_columns=[f]"], "data.feature_columns", "f",
                     ["list<element: list<element: double>>"], True),
    "list-valued ids": ({"w": [[x] for x in IDS], "f": _fixed(), "label": LABELS}, [],
                        "data.client_column", "w", ["list<element: string>",
                                                    "an integer or string column"], True),
    "float ids": ({"w": [float(i % 8) for i in range(N)], "f": _fixed(), "label": LABELS},
                  [], "data.client_column", "w", ["double"], True),
    "list-valued labels": ({"w": IDS, "f": _fixed(), "label": [[x] for x in LABELS]}, [],
                           "data.label_column", "label", ["list<element: int64>"], True),
    "empty lists (no values at all)": ({"w": IDS, "f": [[]] * N, "label": LABELS},
                                       ["data.feature_columns=[f]"], "data.feature_columns",
                                       "f", ["list<element: null>"], True),
    "strings in a feature column": ({"w": IDS, "a": FEATS[:, 0], "s": ["x"] * N,
                                     "label": LABELS}, ["data.feature_columns=[a, s]"],
                                    "data.feature_columns", "s", ["is string"], True),
    "null ids": ({"w": [None if i == 3 else x for i, x in enumerate(IDS)], "f": _fixed(),
                  "label": LABELS}, [], "data.client_column", "w", ["row 3: null"], False),
    "null labels": ({"w": IDS, "f": _fixed(), "label": [None if i == 2 else x for i, x in
                                                         enumerate(LABELS)]},
                    [], "data.label_column", "label", ["row 2: null"], False),
    "empty list in a row": ({"w": IDS, "f": pa.array([[] if i == 6 else [1.0, 2.0]
                                                      for i in range(N)],
                                                     pa.list_(pa.float64())),
                             "label": LABELS}, [], "data.feature_columns", "f",
                            ["row 6: 0 values, where other rows hold 2"], False),
    "ragged lists": ({"w": IDS, "f": [[1.0] * (3 if i == 9 else 2) for i in range(N)],
                      "label": LABELS}, [], "data.feature_columns", "f",
                     ["row 9: 3 values, where other rows hold 2"], False),
    "a null list": ({"w": IDS, "f": [None if i == 4 else [1.0, 2.0] for i in range(N)],
                     "label": LABELS}, [], "data.feature_columns", "f", ["row 4: null"],
                    False),
    "a null in a list": ({"w": IDS, "f": [[1.0, None if i == 5 else 2.0] for i in range(N)],
                          "label": LABELS}, [], "data.feature_columns", "f",
                         ["row 5: a null in the list"], False),
    "a null feature": ({"w": IDS, "a": [None if i == 11 else float(i) for i in range(N)],
                        "label": LABELS}, [], "data.feature_columns", "a", ["row 11: null"],
                       False),
}


@pytest.mark.parametrize("case", list(TYPE_CASES))
def test_unsupported_parquet_columns_are_one_config_error(tmp_path, case):
    columns, extra, field, column, fragments, at_load = TYPE_CASES[case]
    path = _write(tmp_path, columns)
    msg = _error(_overrides(tmp_path, path, *extra), at_load)
    assert msg.startswith(f"config error at '{field}'"), msg
    assert path in msg and (repr(column) in msg or f"{column}: " in msg), msg
    for fragment in fragments:
        assert fragment in msg, msg
    assert not (tmp_path / "cache" / "populations").exists() or not any(
        ".tmp" in n for n in os.listdir(tmp_path / "cache" / "populations"))


def test_list_ids_types_and_auto_features_are_checked_at_load_time(tmp_path):
    """Column types come from the Parquet footer: load_config refuses them without reading
    a row, and names what is allowed."""
    path = _write(tmp_path, {"w": [[x] for x in IDS], "f": _fixed(), "label": LABELS})
    with pytest.raises(ConfigError, match="an integer or string column with no nulls"):
        load_config(None, _overrides(tmp_path, path))
    both = _write(tmp_path, {"w": IDS, "a": FEATS[:, 0], "f": _fixed(), "label": LABELS},
                  "both.parquet")
    with pytest.raises(ConfigError, match=r"'data.feature_columns'.*set, choosing among"):
        load_config(None, _overrides(tmp_path, both))
    cfg = load_config(None, _overrides(tmp_path, both, "data.feature_columns=[a]"))
    assert build_client_data(cfg).input_shape == (1,)


def test_files_of_different_schemas_name_the_odd_file(tmp_path):
    _write(tmp_path, {"w": IDS, "f": _fixed(), "label": LABELS}, "a.parquet")
    odd = _write(tmp_path, {"w": IDS, "f": _fixed(), "label": [float(v) for v in LABELS]},
                 "b.parquet")
    with pytest.raises(ConfigError) as err:
        load_config(None, _overrides(tmp_path, str(tmp_path / "src")))
    assert odd in str(err.value) and "double" in str(err.value)


@pytest.mark.parametrize("bad, column, want", [
    (np.nan, "a", "nan"), (np.inf, "a", "inf"), (-np.inf, "b", "-inf"),
    (1e39, "b", "inf")])  # beyond float32's range
def test_non_finite_features_name_the_file_column_and_first_row(tmp_path, bad, column, want):
    """NaN/Inf are found in the conversion pass (every row, used by a client or not),
    before Ray, and the row is counted in the file that holds it."""
    first = {"w": IDS, "a": FEATS[:, 0].astype(np.float64), "b": FEATS[:, 1].astype(np.float64),
             "label": LABELS}
    _write(tmp_path, first, "part-0.parquet")
    second = dict(first, **{column: np.where(np.isin(np.arange(N), [13, 30]), bad,
                                             first[column])})
    path = _write(tmp_path, second, "part-1.parquet")
    msg = _error(_overrides(tmp_path, str(tmp_path / "src")), at_load=False)
    assert msg.startswith("config error at 'data.feature_columns'"), msg
    assert f"column {column!r} of {path}, row 13: {want})" in msg, msg
    assert "finite float32 values" in msg


def test_non_finite_values_in_a_list_column(tmp_path):
    feats = FEATS.copy()
    feats[21, 2] = np.nan
    path = _write(tmp_path, {"w": IDS, "f": _fixed(feats), "label": LABELS})
    msg = _error(_overrides(tmp_path, path), at_load=False)
    assert f"column 'f' of {path}, row 21: nan" in msg


def test_fedray_run_on_a_nan_table_is_one_line_before_ray(tmp_path):
    """Through the CLI: one error line, no traceback, no run directory content, no Ray."""
    path = _write(tmp_path, {"w": IDS, "a": np.where(np.arange(N) == 17, np.nan, 1.0),
                             "label": LABELS})
    (tmp_path / "tiny.yaml").write_text("rounds: 1\nmodel: {hidden: [4]}\n")
    args = [sys.executable, "-m", "fedray", "run", str(tmp_path / "tiny.yaml"), "-o",
            str(tmp_path / "run"), "--no-progress"]
    for o in _overrides(tmp_path, path):
        args += ["-s", o]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: config error at 'data.feature_columns'")
    assert f"of {path}, row 17: nan" in line and "Traceback" not in res.stderr
    assert "Started a local Ray instance" not in res.stderr + res.stdout
    run = tmp_path / "run"
    assert not run.exists() or os.listdir(run) == []


# ----------------------------------------------------------------------------- Hugging Face


@pytest.fixture
def hf_dir(tmp_path):
    datasets = pytest.importorskip("datasets")
    gen = np.random.default_rng(1)
    ds = datasets.Dataset.from_dict({"w": IDS, "f1": gen.standard_normal(N).tolist(),
                                     "label": LABELS})
    ds.save_to_disk(str(tmp_path / "hf"))
    return tmp_path / "hf"


def _plant(hf_dir, name: str) -> None:
    state = json.loads((hf_dir / "state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (hf_dir / "state.json").write_text(json.dumps(state))


def test_a_save_to_disk_directory_still_loads(tmp_path, hf_dir):
    data = build_client_data(load_config(None, _overrides(tmp_path, str(hf_dir),
                                                          dataset="hf")))
    assert data.input_shape == (1,) and data.num_clients == 4


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "link out", "link to a dir out"])
def test_state_json_naming_files_outside_the_directory_is_refused(tmp_path, hf_dir, kind):
    """The manifest is input: a name climbing out, an absolute name, or a link in the
    directory pointing out of it is refused at load_config, naming state.json and the
    file — nothing outside the directory is opened."""
    real = next(p for p in hf_dir.iterdir() if p.suffix == ".arrow")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "data.arrow"
    target.write_bytes(real.read_bytes())
    if kind == "dotdot":
        name = "../outside/data.arrow"
    elif kind == "absolute":
        name = str(target)
    elif kind == "link out":
        name = "linked.arrow"
        os.symlink(target, hf_dir / name)
    else:
        os.symlink(outside, hf_dir / "sub")
        name = "sub"
    _plant(hf_dir, name)
    with pytest.raises(ConfigError) as err:
        load_config(None, _overrides(tmp_path, str(hf_dir), dataset="hf"))
    msg = str(err.value)
    assert msg.startswith("config error at 'data.root'") and "state.json" in msg, msg
    assert name in msg or os.path.basename(name) in msg, msg


def test_a_linked_state_json_or_parquet_file_leaving_the_directory_is_refused(tmp_path,
                                                                             hf_dir):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.replace(hf_dir / "state.json", outside / "state.json")
    os.symlink(outside / "state.json", hf_dir / "state.json")
    with pytest.raises(ConfigError, match="a state.json inside"):
        load_config(None, _overrides(tmp_path, str(hf_dir), dataset="hf"))
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"w": IDS, "f": _fixed(), "label": LABELS}), outside / "x.parquet")
    os.symlink(outside / "x.parquet", src / "x.parquet")
    with pytest.raises(ConfigError, match="this one is a link to"):
        load_config(None, _overrides(tmp_path, str(src)))


# ----------------------------------------------------------------------------- memory


def test_a_pooled_synthetic_set_too_big_for_memory_fails_at_config_time():
    """20M pooled samples x 784 features for 1M clients: refused in well under a second,
    before any allocation, with the estimate, the limit and data.synthetic_per_client."""
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.dataset=synthetic", "data.synthetic_samples=20000000",
                           "clients.num_clients=1000000", "eval.clients=none"])
    assert time.perf_counter() - t0 < 5
    msg = str(err.value)
    assert msg.startswith("config error at 'data.synthetic_samples': got 20000000")
    assert " GB" in msg and ("available" in msg or "object store" in msg), msg
    assert "data.synthetic_per_client" in msg


def test_the_estimate_follows_the_arrays():
    from fedray.data import memory

    est = memory.pooled(1000, 10, 5, "k", temporaries=2)
    assert est.held == 1000 * 10 * 4 + 1000 * 24 + 5 * memory.PER_CLIENT_BYTES  # label, index, id
    assert est.peak == est.held + 2 * 1000 * 10 * 4
    available, total = memory.machine_memory()
    assert 0 < available <= total
    with pytest.raises(ConfigError, match=r"'data.root'.*GB.*knob"):
        memory.require("data.root", "x", memory.Estimate(total, total, "knob"))
    memory.require("data.root", "x", memory.Estimate(1000, 2000, "knob"))


def test_populations_and_packaged_configs_still_pass_the_memory_check():
    cfg = load_config(None, ["data.dataset=synthetic", "data.synthetic_per_client=20",
                             "clients.num_clients=10000000", "eval.clients=none"])
    assert cfg.clients.num_clients == 10_000_000
    with pytest.raises(ConfigError, match="global test set"):  # 4M x 784 test samples
        load_config(None, ["data.dataset=synthetic", "data.synthetic_per_client=20",
                           "data.synthetic_samples=200000000", "eval.clients=none"])
    for name in sorted(os.listdir(os.path.join(ROOT, "fedray", "configs"))):
        if name.endswith(".yaml") and name != "flite_digits.yaml":  # needs a pretrain dir
            load_config(os.path.join(ROOT, "fedray", "configs", name))


# ----------------------------------------------------------------------------- cache


@pytest.fixture
def table_cfg(tmp_path):
    path = _write(tmp_path, {"w": IDS, "f": _fixed(), "label": LABELS})
    return load_config(None, _overrides(tmp_path, path)), tmp_path / "cache" / "populations"


def _temps(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp" in n] if folder.exists() else []


def test_an_interrupted_conversion_leaves_no_temp_file(table_cfg, monkeypatch):
    cfg, folder = table_cfg
    real = np.savez

    def interrupted(file, **arrays):  # the index half written, then Ctrl-C
        file.write(b"PK\x03\x04partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_client_data(cfg)
    assert folder.exists() and _temps(folder) == [] and os.listdir(folder) == []
    monkeypatch.setattr(np, "savez", real)
    assert isinstance(build_client_data(cfg), TablePopulation)
    assert _temps(folder) == [] and len(os.listdir(folder)) == 2


def test_stale_temp_files_of_a_killed_process_are_removed(table_cfg):
    """A process killed mid-write leaves its temp files; the next build removes them and
    keeps a live process's temp file and any file that is not a cache temp file."""
    cfg, folder = table_cfg
    folder.mkdir(parents=True)
    key = "0" * 32
    script = ("import os, signal, sys; from fedray.data.population import _temp_name; "
              "[open(_temp_name(os.path.join(sys.argv[1], n)), 'wb').write(b'half') "
              "for n in (sys.argv[2] + '.arrow', sys.argv[2] + '.index.npz')]; "
              "os.kill(os.getpid(), signal.SIGKILL)")
    res = subprocess.run([sys.executable, "-c", script, str(folder), key], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True)
    assert res.returncode == -9, res.stderr
    assert len(_temps(folder)) == 2
    live = os.path.basename(population._temp_name(str(folder / (key + ".arrow")))).replace(
        f"-{os.getpid()}", f"-{os.getppid()}")
    (folder / live).write_bytes(b"being written")
    (folder / "notes.tmp-keep").write_bytes(b"not ours")
    build_client_data(cfg)
    assert sorted(_temps(folder)) == sorted([live, "notes.tmp-keep"])


def test_cache_entries_are_data_inside_the_cache_dir(table_cfg, tmp_path):
    """A cache entry linked out of the cache dir is not read but rebuilt in place, and an
    index holding a pickled object is never unpickled."""
    cfg, folder = table_cfg
    first = build_client_data(cfg)
    arrow = folder / os.path.basename(first.path)
    moved = tmp_path / "planted.arrow"
    os.replace(arrow, moved)
    os.symlink(moved, arrow)
    again = build_client_data(cfg)
    assert not arrow.is_symlink() and again.path == str(arrow)
    index = str(arrow)[:-len(".arrow")] + ".index.npz"
    with open(index, "wb") as fh:
        np.savez(fh, offsets=np.array([{"evil": 1}], dtype=object))
    third = build_client_data(cfg)
    assert np.array_equal(third.offsets, first.offsets)
    with np.load(index, allow_pickle=False) as z:
        assert z["offsets"].dtype == np.int64


def test_a_linked_populations_folder_is_refused_and_nothing_outside_changes(table_cfg,
                                                                             tmp_path):
    """The cache root is the user's choice; its populations folder linked elsewhere would
    have fedray write entries there and delete stale temp files there: refused, and the
    folder it points to keeps what it held."""
    cfg, folder = table_cfg
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = outside / ("0" * 32 + ".arrow.tmp-elsewhere-999999")
    planted.write_bytes(b"someone else's")
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, folder)
    with pytest.raises(ConfigError, match="'data.cache_dir'.*not a symbolic link"):
        build_client_data(cfg)
    assert sorted(os.listdir(outside)) == [planted.name] and planted.read_bytes() == \
        b"someone else's"


def test_a_cache_index_with_rows_out_of_order_is_rebuilt(table_cfg):
    """Offsets that go backwards, or a train/test split outside its client's rows, would
    hand a client another client's rows (or negative slices): such an index is a damaged
    entry, rebuilt from the source."""
    cfg, folder = table_cfg
    first = build_client_data(cfg)
    index = first.path[:-len(".arrow")] + ".index.npz"
    with np.load(index, allow_pickle=False) as z:
        good = {k: z[k] for k in z.files}
    want = [first.client_arrays(c, 1)[1].tolist() for c in range(first.num_clients)]
    backwards = good["offsets"].copy()
    backwards[1], backwards[2] = backwards[2], backwards[1]
    split = good["split"].copy()
    split[0] = good["offsets"][1] + 1
    for bad in ({"offsets": backwards}, {"split": split}):
        with open(index, "wb") as fh:
            np.savez(fh, **(good | bad))
        again = build_client_data(cfg)
        assert [again.client_arrays(c, 1)[1].tolist() for c in range(again.num_clients)] == want
        with np.load(index, allow_pickle=False) as z:
            assert np.array_equal(z["offsets"], good["offsets"])
