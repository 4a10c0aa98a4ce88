"""Populations whose memory and setup follow the clients sampled, not the population.

Two kinds of client data that never hold a Python object per client:

- :class:`SyntheticPopulation` (``data.dataset=synthetic`` with ``data.synthetic_per_client``):
  client ``c``'s samples are drawn on demand from (seed, c) — nothing is stored per client,
  so ten million clients cost what ten do.
- :class:`TablePopulation` (``data.dataset=parquet`` or ``hf``): a table with a natural
  client column (author, writer, device) split one client per id. The rows are reordered
  once, client by client, train rows before test rows, into an uncompressed Arrow IPC file
  (the layout Hugging Face ``datasets`` memory-maps) kept in a cache keyed by the source
  files (path, size, modification time) and the split settings (seed included); a
  client is then a contiguous slice, located by a CSR index (one offsets array), and every
  executor memory-maps the file from its path (what crosses Ray is the path and the
  offsets, never the rows). The partition is written to the run directory as
  ``partition.parquet``.

:func:`build_client_data` is the one entry point (the methods' default ``build_data``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.core.config import DataConfig, ExperimentConfig
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, redact
from fedray.data.federated import local_test_count

GLOBAL_TEST_MAX = 10_000


def build_client_data(cfg: ExperimentConfig, dataset: Any = None) -> Any:
    """The client data of ``cfg``: a synthetic or table population, else the dataset split
    among the clients (:func:`fedray.data.federated.build_federated`)."""
    d = cfg.data
    n = cfg.clients.num_clients
    if d.dataset == "synthetic" and d.synthetic_per_client is not None:
        return SyntheticPopulation.build(d, n, cfg.seed)
    from fedray.core import registry

    if registry.dataset(d.dataset).kind == "table":
        return TablePopulation.build(d, n, cfg.seed)
    from fedray.data.federated import build_federated

    return build_federated(d, n, cfg.seed, dataset)


def group_by_id(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The natural-id grouping every table-backed population uses (Parquet, HF, BlogText):
    ``(unique ids in sorted order, offsets, order)`` with group ``g``'s rows
    ``order[offsets[g]:offsets[g + 1]]`` in file order — a CSR index, no list per id."""
    natural, code = np.unique(np.asarray(ids), return_inverse=True)
    order = np.argsort(code, kind="stable")
    offsets = np.r_[0, np.cumsum(np.bincount(code, minlength=len(natural)))].astype(np.int64)
    return natural, offsets, order


def local_test_mask(client: np.ndarray, labels: np.ndarray, test_fraction: float,
                    seed: int) -> np.ndarray:
    """Which rows are a client's local test rows, for all clients at once (rows grouped by
    ``client``, in any order): per client ``clip(round(f n), 1, n - 1)`` test rows, drawn by
    systematic sampling over the client's rows ordered by (label, a seeded random key) with a
    random start — so every class gets its proportional share to within one row, with one
    vectorised pass instead of a generator per client."""
    n_rows = len(client)
    gen = rng(seed, -1, -1, "population-split")
    key = gen.random(n_rows)
    order = np.lexsort((key, labels, client))
    c_sorted = client[order]
    starts = np.flatnonzero(np.r_[True, c_sorted[1:] != c_sorted[:-1]])
    sizes = np.diff(np.r_[starts, n_rows])
    n_test = np.clip(np.rint(test_fraction * sizes), 1, np.maximum(sizes - 1, 1))
    rank = np.arange(n_rows) - np.repeat(starts, sizes)
    step = np.repeat(n_test / sizes, sizes)
    offset = np.repeat(gen.random(len(sizes)), sizes)
    picked = np.floor((rank + 1) * step + offset) - np.floor(rank * step + offset) >= 1
    mask = np.zeros(n_rows, dtype=bool)
    mask[order] = picked
    return mask


# ----------------------------------------------------------------------------- synthetic


@dataclass
class SyntheticPopulation:
    """Client ``c`` holds ``per_client`` samples of a fixed Gaussian-mixture task (the
    generative model of :func:`fedray.data.datasets.make_synthetic`), drawn from (seed, c);
    its labels are uniform (``iid``) or follow its own Dirichlet(α) class mix
    (``dirichlet``). The first ``n - clip(round(f n), 1, n - 1)`` samples are its train
    split, the rest its local test split."""

    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    per_client: int
    test_fraction: float
    seed: int
    alpha: float | None
    basis: np.ndarray
    centres: np.ndarray
    noise_scale: float
    x_test: np.ndarray
    y_test: np.ndarray
    _last: tuple[int, tuple] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, d: DataConfig, num_clients: int, seed: int) -> SyntheticPopulation:
        f, c = d.synthetic_features, d.synthetic_classes
        gen = rng(seed, -1, -1, "population-model")
        latent = min(f, max(2, c))
        basis, _ = np.linalg.qr(gen.standard_normal((f, latent)))
        centres = gen.standard_normal((c, 2, latent))
        pop = cls(num_clients, c, (f,), d.synthetic_per_client, d.local_test_fraction, seed,
                  d.alpha if d.partition == "dirichlet" else None, basis.astype(np.float32),
                  centres, float(0.5 / np.sqrt(max(1.0, f / latent))),
                  np.zeros((0, f), np.float32), np.zeros(0, np.int64))
        n_test = max(c, int(d.synthetic_samples * d.synthetic_test_fraction))
        pop.x_test, pop.y_test = pop._draw(rng(seed, -1, -1, "population-test"), n_test,
                                           None)
        return pop

    def _draw(self, gen: np.random.Generator, n: int, alpha: float | None
              ) -> tuple[np.ndarray, np.ndarray]:
        if alpha is None:
            y = gen.integers(0, self.num_classes, n)
        else:
            y = gen.choice(self.num_classes, n, p=gen.dirichlet(np.full(self.num_classes,
                                                                        alpha)))
        cluster = gen.integers(0, 2, n)
        z = self.centres[y, cluster] + 0.6 * gen.standard_normal((n, self.centres.shape[2]))
        x = gen.standard_normal((n, self.input_shape[0]), dtype=np.float32)
        x *= np.float32(self.noise_scale)
        x += z.astype(np.float32) @ self.basis.T
        return x, y.astype(np.int64)

    def _client(self, cid: int) -> tuple:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        if self._last is None or self._last[0] != cid:
            x, y = self._draw(rng(self.seed, -1, cid, "population-client"), self.per_client,
                              self.alpha)
            n, n_test = self.per_client, self._n_test
            self._last = (cid, (x[:n - n_test], y[:n - n_test], x[n - n_test:], y[n - n_test:]))
        return self._last[1]

    def client_arrays(self, cid: int, round: int, split: str = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        x_tr, y_tr, x_te, y_te = self._client(cid)
        return (x_tr, y_tr) if split == "train" else (x_te, y_te)

    def client_extra(self, cid: int, round: int) -> dict[str, Any] | None:
        return None

    @property
    def _n_test(self) -> int:
        return local_test_count(self.per_client, self.test_fraction)

    def num_samples(self, cid: int, split: str = "train") -> int:
        return self.per_client - self._n_test if split == "train" else self._n_test

    def summary(self) -> dict[str, Any]:
        return {"kind": "synthetic-population", "num_clients": self.num_clients,
                "num_classes": self.num_classes, "input_shape": list(self.input_shape),
                "samples_per_client": self.per_client,
                "label_mix": "iid" if self.alpha is None else f"dirichlet({self.alpha})",
                "global_test_size": int(len(self.y_test))}


# ----------------------------------------------------------------------------- tables


def _cache_root(d: DataConfig) -> str:
    return d.cache_dir or os.environ.get("FEDRAY_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fedray")


def _source_files(d: DataConfig) -> list[str]:
    """The data files of ``data.root``: the Parquet file(s), or the Arrow files an ``hf``
    save_to_disk directory's ``state.json`` names (names confined to that directory)."""
    root = os.path.abspath(d.root)
    if d.dataset == "parquet":
        if os.path.isfile(root):
            return [root]
        files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                       if f.endswith(".parquet"))
        if not files:
            raise ConfigError("data.root", d.root, "a Parquet file or a directory holding "
                                                   ".parquet files")
        return files
    state = os.path.join(root, "state.json")
    if not os.path.isfile(state):
        raise ConfigError("data.root", d.root, "a Hugging Face `datasets` save_to_disk "
                                               "directory (holding state.json)")
    try:
        names = [f["filename"] for f in json.load(open(state, encoding="utf-8"))["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError("data.root", f"{d.root}/state.json", "a save_to_disk state.json "
                                                               "listing _data_files") from None
    files = []
    for name in names:
        if not isinstance(name, str) or os.path.basename(name) != name or name in (".", ".."):
            raise ConfigError("data.root", f"{d.root}/state.json", f"plain file names inside "
                              f"the directory (got {name!r})")
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise ConfigError("data.root", path, "an existing Arrow file named by state.json")
        files.append(path)
    return files


def _read_source(d: DataConfig, files: list[str]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if d.dataset == "parquet":
            return pa.concat_tables([pq.read_table(f) for f in files])
        tables = []
        for f in files:
            with pa.memory_map(f) as src:
                tables.append(pa.ipc.open_stream(src).read_all())
        return pa.concat_tables(tables)
    except (pa.ArrowInvalid, OSError) as e:
        reason = " ".join(str(e).split())[:160]
        raise ConfigError("data.root", d.root, f"readable {d.dataset} data ({reason})") from None


def _features(d: DataConfig, table: Any) -> np.ndarray:
    """The (rows, features) float32 matrix of the feature columns."""
    import pyarrow as pa

    skip = {d.client_column, d.label_column}
    names = d.feature_columns or [n for n in table.column_names if n not in skip and (
        pa.types.is_integer(table.schema.field(n).type)
        or pa.types.is_floating(table.schema.field(n).type)
        or pa.types.is_list(table.schema.field(n).type)
        or pa.types.is_fixed_size_list(table.schema.field(n).type))]
    if not names:
        raise ConfigError("data.feature_columns", None, f"numeric feature columns (the table "
                          f"has {table.column_names})")
    for n in names:
        if n not in table.column_names:
            raise ConfigError("data.feature_columns", n, f"columns of the table: "
                                                         f"{table.column_names}")
    if len(names) == 1 and (pa.types.is_list(table.schema.field(names[0]).type)
                            or pa.types.is_fixed_size_list(table.schema.field(names[0]).type)):
        col = table.column(names[0]).combine_chunks()
        lengths = np.asarray(col.value_lengths() if hasattr(col, "value_lengths") else
                             pa.compute.list_value_length(col))
        if len(lengths) and (lengths != lengths[0]).any():
            raise ConfigError("data.feature_columns", names[0], "a list column of one length "
                                                                "in every row")
        return np.asarray(col.flatten().to_numpy(zero_copy_only=False),
                          dtype=np.float32).reshape(len(col), -1)
    cols = []
    for n in names:
        t = table.schema.field(n).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise ConfigError("data.feature_columns", n, f"numeric columns (this one is {t})")
        cols.append(table.column(n).to_numpy(zero_copy_only=False).astype(np.float32))
    return np.stack(cols, axis=1)


@dataclass
class TablePopulation:
    """Clients as contiguous row ranges of a memory-mapped Arrow IPC file: client ``c``'s
    train rows are ``[offsets[c], split[c])``, its local test rows ``[split[c],
    offsets[c+1])``. Only ``path``, the index arrays and the global test set are pickled;
    each process maps the file on first use."""

    path: str
    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    offsets: np.ndarray
    split: np.ndarray
    natural_ids: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    info: dict[str, Any]
    _x: Any = field(default=None, repr=False)
    _y: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_x", "_y")} | {
            "_x": None, "_y": None}

    @classmethod
    def build(cls, d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
        files = _source_files(d)
        stat = [(os.path.abspath(f), os.path.getsize(f), os.path.getmtime(f)) for f in files]
        key = hashlib.sha256(json.dumps([stat, d.dataset, d.client_column, d.label_column,
                                         d.feature_columns, d.min_samples,
                                         d.local_test_fraction, num_clients, seed]).encode()
                             ).hexdigest()[:32]
        folder = os.path.join(_cache_root(d), "populations")
        path = os.path.join(folder, key + ".arrow")
        index_path = os.path.join(folder, key + ".index.npz")
        if os.path.isfile(path) and os.path.isfile(index_path):
            try:
                return cls._from_cache(path, index_path)
            except (ValueError, KeyError, OSError):
                pass  # a damaged cache entry is rebuilt
        return cls._convert(d, files, num_clients, seed, path, index_path)

    @classmethod
    def _convert(cls, d: DataConfig, files: list[str], num_clients: int, seed: int,
                 path: str, index_path: str) -> TablePopulation:
        import pyarrow as pa

        table = _read_source(d, files)
        for col in (d.client_column, d.label_column):
            if col not in table.column_names:
                raise ConfigError("data.client_column" if col == d.client_column else
                                  "data.label_column", col,
                                  f"a column of the table: {table.column_names}")
        labels_raw = table.column(d.label_column).to_numpy(zero_copy_only=False)
        if labels_raw.dtype.kind not in "iu":
            raise ConfigError("data.label_column", d.label_column,
                              f"an integer class column (it holds {labels_raw.dtype})")
        classes, labels = np.unique(labels_raw, return_inverse=True)
        ids_raw = table.column(d.client_column).to_numpy(zero_copy_only=False)
        natural, id_offsets, id_order = group_by_id(ids_raw)
        counts = np.diff(id_offsets)
        client = np.empty(len(ids_raw), dtype=np.int64)
        client[id_order] = np.repeat(np.arange(len(natural)), counts)
        eligible = np.flatnonzero(counts >= max(2, d.min_samples))
        if len(eligible) < num_clients:
            raise ConfigError("clients.num_clients", num_clients,
                              f"at most the {len(eligible)} ids of {d.client_column!r} with "
                              f">= {max(2, d.min_samples)} rows (data.min_samples)")
        keep = eligible[:num_clients]  # the first ids in sorted natural-id order
        code = np.full(len(natural), -1, dtype=np.int64)
        code[keep] = np.arange(num_clients)
        rows = np.flatnonzero(code[client] >= 0)
        c = code[client[rows]]
        y = labels[rows].astype(np.int64)
        is_test = local_test_mask(c, y, d.local_test_fraction, seed)
        order = np.lexsort((np.arange(len(rows)), is_test, c))
        x = _features(d, table.take(pa.array(rows[order])))
        y, c, is_test = y[order], c[order], is_test[order]
        offsets = np.r_[0, np.cumsum(np.bincount(c, minlength=num_clients))].astype(np.int64)
        split = offsets[:-1] + np.bincount(c[~is_test], minlength=num_clients)
        del table
        os.makedirs(os.path.dirname(path), exist_ok=True)
        flat = pa.array(x.reshape(-1))
        out = pa.table({"x": pa.FixedSizeListArray.from_arrays(flat, x.shape[1]), "y": y})
        tmp = f"{path}.tmp{os.getpid()}"
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, out.schema) as writer:
            writer.write_table(out, max_chunksize=max(1, len(y)))
        test_rows = np.flatnonzero(is_test)
        pick = np.sort(rng(seed, -1, -1, "population-global-test").choice(
            test_rows, min(GLOBAL_TEST_MAX, len(test_rows)), replace=False))
        info = {"source": redact(d.root), "dataset": d.dataset, "rows": int(len(y)),
                "ids_total": int(len(natural)),
                "ids_too_small": int(len(natural) - len(eligible)),
                "classes": [str(v) for v in classes.tolist()]}
        tmp_index = f"{index_path}.tmp{os.getpid()}.npz"
        np.savez(tmp_index, offsets=offsets, split=split,
                 natural_ids=natural[keep].astype(str), x_test=x[pick], y_test=y[pick],
                 info=np.array(json.dumps(info)))
        os.replace(tmp_index, index_path)
        os.replace(tmp, path)
        return cls._from_cache(path, index_path)

    @classmethod
    def _from_cache(cls, path: str, index_path: str) -> TablePopulation:
        with np.load(index_path, allow_pickle=False) as z:
            offsets, split = z["offsets"], z["split"]
            pop = cls(path, len(offsets) - 1, 0, (z["x_test"].shape[1],), offsets, split,
                      z["natural_ids"], z["x_test"], z["y_test"], json.loads(str(z["info"])))
        pop.num_classes = len(pop.info["classes"])
        pop._map()
        if len(pop._y) != int(offsets[-1]):
            raise ValueError("cache entry does not match its index")
        return pop

    def _map(self) -> None:
        import pyarrow as pa

        table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()
        xcol, ycol = table.column("x"), table.column("y")
        if xcol.num_chunks != 1 or ycol.num_chunks != 1:
            raise ValueError("expected one record batch")
        self._x = xcol.chunk(0).values.to_numpy(zero_copy_only=True).reshape(
            len(ycol), *self.input_shape)
        self._y = ycol.chunk(0).to_numpy(zero_copy_only=True)

    def client_arrays(self, cid: int, round: int, split: str = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        if self._x is None:
            self._map()
        lo, mid, hi = self.offsets[cid], self.split[cid], self.offsets[cid + 1]
        a, b = (lo, mid) if split == "train" else (mid, hi)
        return self._x[a:b], self._y[a:b]

    def client_extra(self, cid: int, round: int) -> dict[str, Any] | None:
        return None

    def num_samples(self, cid: int, split: str = "train") -> int:
        if split == "train":
            return int(self.split[cid] - self.offsets[cid])
        return int(self.offsets[cid + 1] - self.split[cid])

    def partition_table(self) -> Any:
        """client_id, natural id and row counts per client (``partition.parquet``)."""
        import pyarrow as pa

        return pa.table({"client_id": np.arange(self.num_clients),
                         "natural_id": self.natural_ids,
                         "train_rows": self.split - self.offsets[:-1],
                         "test_rows": self.offsets[1:] - self.split})

    def summary(self) -> dict[str, Any]:
        train = self.split - self.offsets[:-1]
        return {"kind": "table-population", "num_clients": self.num_clients,
                "num_classes": self.num_classes, "input_shape": list(self.input_shape),
                "train_rows_min_median_max": [int(train.min()), float(np.median(train)),
                                              int(train.max())],
                "global_test_size": int(len(self.y_test)), **self.info}


__all__ = ["SyntheticPopulation", "TablePopulation", "build_client_data", "group_by_id",
           "local_test_mask"]
