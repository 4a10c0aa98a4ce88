"""Populations whose memory follows the sampled clients: synthetic clients drawn on demand,
natural-id Parquet and Hugging Face `datasets` tables memory-mapped with a CSR index, the
partition stored in the run dir, sharded client states pruned by what changed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.data.population import (
    SyntheticPopulation,
    TablePopulation,
    build_client_data,
    local_test_mask,
)

SYN = ["data.dataset=synthetic", "data.synthetic_per_client=20", "data.synthetic_features=16",
       "eval.clients=none"]


def _no_per_client_objects(data, num_clients: int) -> None:
    """Nothing in the data is a Python container sized by the population."""
    for name, value in vars(data).items():
        if isinstance(value, (list, dict, tuple, set)):
            assert len(value) < min(num_clients, 1000), (name, len(value))


def test_a_synthetic_population_of_ten_million_costs_what_ten_do():
    cfg = load_config(None, SYN + ["clients.num_clients=10000000"])
    data = build_client_data(cfg)
    assert isinstance(data, SyntheticPopulation)
    _no_per_client_objects(data, 10_000_000)
    assert len(pickle.dumps(data)) < 200_000  # what an executor receives
    x, y = data.client_arrays(9_999_999, 1)
    again = build_client_data(cfg)
    again.client_arrays(3, 1)  # another client first: draws depend on the client alone
    x2, y2 = again.client_arrays(9_999_999, 1)
    assert np.array_equal(x, x2) and np.array_equal(y, y2) and x.shape == (16, 16)
    xt, _ = data.client_arrays(9_999_999, 1, "test")
    assert xt.shape == (4, 16) and not np.array_equal(xt, x[:4])
    with pytest.raises(IndexError):
        data.client_arrays(10_000_000, 1)


def test_dirichlet_label_mix_per_client():
    cfg = load_config(None, SYN + ["clients.num_clients=50", "data.partition=dirichlet",
                                   "data.alpha=0.05", "data.synthetic_per_client=200"])
    data = build_client_data(cfg)
    top = [np.bincount(data.client_arrays(c, 1)[1], minlength=10).max() / 160
           for c in range(50)]
    assert np.mean(top) > 0.7  # skewed clients


def test_local_test_mask_sizes_and_strata():
    gen = np.random.default_rng(0)
    client = np.repeat(np.arange(300), gen.integers(2, 60, 300))
    labels = gen.integers(0, 5, len(client))
    mask = local_test_mask(client, labels, 0.25, seed=1)
    n = np.bincount(client)
    n_test = np.bincount(client[mask], minlength=300)
    assert np.array_equal(n_test, np.clip(np.rint(0.25 * n), 1, n - 1))
    for c in range(0, 300, 17):  # every class within one row of its share
        sel = client == c
        per = np.bincount(labels[sel], minlength=5)
        got = np.bincount(labels[sel & mask], minlength=5)
        assert np.all(np.abs(got - per * n_test[c] / n[c]) < 1 + 1e-9)
    assert np.array_equal(mask, local_test_mask(client, labels, 0.25, seed=1))


def _writers_table(num_writers: int, rows_each: int, seed: int = 0):
    import pyarrow as pa

    gen = np.random.default_rng(seed)
    n = num_writers * rows_each
    writer = np.repeat([f"w{i:06d}" for i in range(num_writers)], rows_each)
    order = gen.permutation(n)  # rows of one writer scattered through the file
    feats = gen.standard_normal((n, 8)).astype(np.float32)
    return pa.table({"writer": writer[order],
                     "pixels": pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)),
                                                                 8),
                     "label": gen.integers(0, 4, n)}), writer[order], feats


@pytest.fixture
def parquet_source(tmp_path):
    import pyarrow.parquet as pq

    table, writer, feats = _writers_table(40, 6)
    path = tmp_path / "writers.parquet"
    pq.write_table(table, path)
    return str(path), table


def test_parquet_natural_ids_memory_mapped_and_cached(tmp_path, parquet_source):
    path, table = parquet_source
    overrides = ["data.dataset=parquet", f"data.root={path}", "data.client_column=writer",
                 "clients.num_clients=30", f"data.cache_dir={tmp_path / 'cache'}"]
    cfg = load_config(None, overrides)
    data = build_client_data(cfg)
    assert isinstance(data, TablePopulation) and data.num_classes == 4
    assert data.input_shape == (8,)
    writer = np.asarray(table.column("writer").to_pylist())
    feats = np.asarray(table.column("pixels").to_pylist(), dtype=np.float32)
    for c in (0, 17, 29):  # client c is the c-th writer in sorted order
        assert data.natural_ids[c] == f"w{c:06d}"
        x_tr, y_tr = data.client_arrays(c, 1)
        x_te, _ = data.client_arrays(c, 1, "test")
        rows = np.sort(np.concatenate([x_tr, x_te]), axis=0)
        want = np.sort(feats[writer == f"w{c:06d}"], axis=0)
        assert np.array_equal(rows, want) and len(x_te) == 1  # round(0.2 * 6)
        assert not x_tr.flags.owndata  # a view over the mapped file
    blob = pickle.dumps(data)
    assert data.path.encode() in blob and len(blob) < 50_000  # a path, not the rows
    clone = pickle.loads(blob)
    assert np.array_equal(clone.client_arrays(5, 1)[0], data.client_arrays(5, 1)[0])
    again = build_client_data(cfg)  # the cache entry is reused, not rebuilt
    assert again.path == data.path
    files = sorted((tmp_path / "cache" / "populations").iterdir())
    assert len(files) == 2
    part = data.partition_table().to_pylist()
    assert part[3] == {"client_id": 3, "natural_id": "w000003", "train_rows": 5,
                       "test_rows": 1}


def test_a_parquet_tables_test_partition_is_its_clients_local_test_rows(tmp_path,
                                                                      parquet_source):
    """``eval.global_test_set=all`` on a Parquet table: every kept writer's local test
    rows, in client order, streamed from the mapped entry (the sample is the same rows)."""
    from fedray.data.population import global_test_set

    path, _ = parquet_source
    cfg = load_config(None, ["data.dataset=parquet", f"data.root={path}",
                             "data.client_column=writer", "clients.num_clients=30",
                             f"data.cache_dir={tmp_path / 'cache'}",
                             "eval.global_test_set=all"])
    data = build_client_data(cfg)
    x, y = global_test_set(data, cfg.eval.global_test_set)
    want = [data.client_arrays(c, 1, "test") for c in range(30)]
    assert len(x) == 30 == data.summary()["test_partition_size"]
    assert np.array_equal(np.asarray(x), np.concatenate([w[0] for w in want]))
    assert np.array_equal(np.asarray(y), np.concatenate([w[1] for w in want]))
    assert sorted(map(tuple, data.x_test)) == sorted(map(tuple, np.asarray(x)))


def test_a_hugging_face_save_to_disk_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    gen = np.random.default_rng(1)
    n = 120
    ds = datasets.Dataset.from_dict({
        "author": [f"a{i % 12}" for i in range(n)], "f1": gen.standard_normal(n).tolist(),
        "f2": gen.standard_normal(n).tolist(), "label": (np.arange(n) % 3).tolist()})
    ds.save_to_disk(str(tmp_path / "hf"))
    cfg = load_config(None, ["data.dataset=hf", f"data.root={tmp_path / 'hf'}",
                             "data.client_column=author", "clients.num_clients=12",
                             f"data.cache_dir={tmp_path / 'cache'}"])
    data = build_client_data(cfg)
    assert data.input_shape == (2,) and data.num_classes == 3
    x, _ = data.client_arrays(0, 1)  # "a0": rows 0, 12, 24, ...
    x_all = np.concatenate([x, data.client_arrays(0, 1, "test")[0]])
    want = np.stack([np.asarray(ds["f1"])[::12], np.asarray(ds["f2"])[::12]], 1)
    assert np.allclose(np.sort(x_all, 0), np.sort(want.astype(np.float32), 0))


def test_bad_table_inputs(tmp_path, parquet_source):
    path, _ = parquet_source
    base = ["data.dataset=parquet", f"data.root={path}", f"data.cache_dir={tmp_path}/c"]
    cases = [(["clients.num_clients=4"], "data.client_column", "the column naming"),
             (["data.client_column=author", "clients.num_clients=4"], "data.client_column",
              "a column of the table"),
             (["data.client_column=writer", "clients.num_clients=41"], "clients.num_clients",
              "at most the 40 ids"),
             (["data.client_column=writer", "clients.num_clients=4",
               "data.feature_columns=[nope]"], "data.feature_columns", "columns of the table")]
    for extra, field, rule in cases:
        with pytest.raises(ConfigError) as err:
            build_client_data(load_config(None, base + extra))
        assert f"'{field}'" in str(err.value) and rule in str(err.value), str(err.value)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "state.json").write_text('{"_data_files": [{"filename": "../x"}]}')
    with pytest.raises(ConfigError, match="plain file names inside the directory"):
        build_client_data(load_config(None, ["data.dataset=hf", f"data.root={tmp_path}/hf",
                                             "data.client_column=a"]))


def test_client_states_are_sharded_and_pruning_lists_only_changed_clients(tmp_path):
    from fedray.core.state_store import ClientStateStore
    from fedray.core.storage import Storage

    storage = Storage(str(tmp_path / "run"))
    store = ClientStateStore(storage)
    for c in (3, 1500, 2999):
        for v in (1, 2, 3):
            store.save(c, v, {"m": np.full(2, v, dtype=np.float32)})
    assert storage.listdir("client_state") == ["00000", "00001", "00002"]
    listed = []
    real = storage.listdir
    storage.listdir = lambda rel: listed.append(rel) or real(rel)
    store.prune({1500}, {1500: 3, 3: 1}, {1500: 2})
    assert listed == ["client_state/00001/00001500"]
    assert real("client_state/00001/00001500") == ["000002.npz", "000003.npz"]
    assert real("client_state/00000/00000003") == ["000001.npz", "000002.npz", "000003.npz"]
    assert store.load(1500, 3)["m"].tolist() == [3, 3]


@pytest.mark.ray
def test_a_hundred_thousand_client_run_keeps_nothing_per_client(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    cfg = load_config(None, SYN + ["clients.num_clients=100000", "clients.per_round=20",
                                   "rounds=2", "model.hidden=[16]", "eval.clients=sampled",
                                   "clients.tier_fractions=[1, 1]",
                                   "runtime.tiers=[{name: a, num_cpus: 0.5, executors: 1}, "
                                   "{name: b, num_cpus: 0.5, executors: 1}]"])
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2 and summary["final_global_accuracy"] is not None
    assert (tmp_path / "run" / "data.json").stat().st_size < 1000
    from fedray.observe.metrics import read_metrics

    clients = read_metrics(str(tmp_path / "run"), "clients").to_pylist()
    assert {r["tier"] for r in clients} == {"a", "b"}
    assert len(clients) == 40 and max(r["client_id"] for r in clients) > 1000


def test_local_test_count_is_the_clipped_rounding():
    """The local test split's size, computed in plain Python per client, is numpy's
    clip(round(f n), 1, n - 1) for every size and fraction (the rule the splits were
    built with), including n = 1 (clip's upper bound 0 wins) and numpy integer sizes."""
    from fedray.data.federated import local_test_count

    for n in range(1, 60):
        for f in (0.0, 0.1, 0.2, 0.25, 0.5, 0.75, 0.99, 1.0):
            want = int(np.clip(round(f * n), 1, n - 1))
            assert local_test_count(n, f) == want, (n, f)
            assert local_test_count(np.int64(n), f) == want, (n, f)
            assert type(local_test_count(np.int64(n), f)) is int


def test_metrics_table_columns_in_first_seen_order():
    """A metrics part file's columns are the union of its rows' keys in first-seen order;
    a numeric column with gaps becomes float with NaN."""
    from fedray.observe.metrics import _table

    t = _table([{"a": 1, "b": 2.0}, {"c": "x", "a": 3}, {"b": None, "d": 4}])
    assert t.column_names == ["a", "b", "c", "d"]
    b = t.column("b").to_pylist()
    assert b[0] == 2.0 and np.isnan(b[1]) and np.isnan(b[2])
    assert t.column("c").to_pylist() == [None, "x", None]


def drawn_alone(pop, cid: int) -> tuple:
    """Client ``cid``'s (x_train, y_train, x_test, y_test) as the synthetic population
    defines them, written out client by client: the oracle of every faster path."""
    from fedray.core.seeding import rng

    gen, n = rng(pop.seed, -1, cid, "population-client"), pop.per_client
    if pop.alpha is None:
        y = gen.integers(0, pop.num_classes, n)
    else:
        y = gen.choice(pop.num_classes, n, p=gen.dirichlet(np.full(pop.num_classes,
                                                                   pop.alpha)))
    cluster = gen.integers(0, 2, n)
    z = pop.centres[y, cluster] + 0.6 * gen.standard_normal((n, pop.centres.shape[2]))
    x = gen.standard_normal((n, pop.input_shape[0]), dtype=np.float32)
    x *= np.float32(pop.noise_scale)
    x += z.astype(np.float32) @ pop.basis.T
    cut = n - pop._n_test
    return x[:cut], y[:cut].astype(np.int64), x[cut:], y[cut:].astype(np.int64)


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
@pytest.mark.parametrize("together", [True, False])
def test_read_ahead_changes_no_draw(partition, together, monkeypatch):
    """A population told which clients come next seeds them in one pass and (up to
    READY_BYTES, ``together``) draws them as one stack; every client's arrays are still
    the bits it draws alone, whether or not it was announced, in any order, twice, or
    after an out-of-range id, and whichever clients were drawn beside it."""
    from fedray.data import population

    if not together:
        monkeypatch.setattr(population, "READY_BYTES", 0)
    cfg = load_config(None, SYN + ["clients.num_clients=5000", f"data.partition={partition}"])
    alone, ahead = build_client_data(cfg), build_client_data(cfg)
    ahead.read_ahead([4999, 17, 3, 17, 12_000, 250])
    for c in (3, 250, 4999, 17, 42):  # 42 was not announced
        want = drawn_alone(alone, c)
        got = ahead.client_arrays(c, 1, "train") + ahead.client_arrays(c, 1, "test")
        got_alone = alone.client_arrays(c, 1, "train") + alone.client_arrays(c, 1, "test")
        for a, b, d in zip(want, got, got_alone, strict=True):
            assert a.dtype == b.dtype == d.dtype and a.tobytes() == b.tobytes() == d.tobytes()
    assert ahead._ahead == {} and ahead._ready == {}  # each prepared client served once
    ahead.read_ahead([1, 2])
    ahead.read_ahead([2, 3])  # a second call drops what the first left unread
    assert sorted(ahead._ready if together else ahead._ahead) == [2, 3]
    assert np.array_equal(ahead.client_arrays(1, 1)[0], alone.client_arrays(1, 1)[0])
    many = build_client_data(cfg)
    many.read_ahead(range(0, 5000, 7))
    for c in (0, 7, 4998):
        for a, b in zip(drawn_alone(alone, c), many.client_arrays(c, 1, "train")
                        + many.client_arrays(c, 1, "test"), strict=True):
            assert a.tobytes() == b.tobytes()
    many.read_ahead([])  # what an executor call does last: nothing prepared is kept
    assert many._ready == {} and many._ahead == {} and many._last is None
    with pytest.raises(IndexError):
        ahead.client_arrays(12_000, 1)
