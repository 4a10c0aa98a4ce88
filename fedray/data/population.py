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
import re
import shutil
import socket
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fedray.core.config import DataConfig, ExperimentConfig
from fedray.core.outputs import refuse_links, resolves_inside
from fedray.core.seeding import bounded_integers, rng, rngs
from fedray.core.spec import ConfigError, redact, short_repr
from fedray.core.storage import open_new
from fedray.data.federated import local_test_count

GLOBAL_TEST_MAX = 10_000
GLOBAL_TEST_BYTES = 512 << 20  # and at most this many bytes of float32 inputs (FLAIR: 682)
GLOBAL_TEST_RULE = [GLOBAL_TEST_MAX, GLOBAL_TEST_BYTES]  # in every cache key: an entry built
# under another rule holds another global test set


def global_test_size(available: int, row_values: int) -> int:
    """Rows of the global test set: all ``available`` up to :data:`GLOBAL_TEST_MAX`, and no
    more than :data:`GLOBAL_TEST_BYTES` of float32 inputs of ``row_values`` values each
    (every process holds the set: 10,000 images of 256×256×3 would be 7.9 GB)."""
    return int(min(available, GLOBAL_TEST_MAX, max(1, GLOBAL_TEST_BYTES // (4 * row_values))))


def as_inputs(x: np.ndarray) -> np.ndarray:
    """Model inputs from stored rows: 8-bit pixels (an entry that keeps images as the
    source stores them, a quarter of float32's bytes) scaled to float32 in [0, 1], as
    ``_images`` and the table readers scale them; float rows as they are."""
    if x.dtype == np.uint8:
        return x.astype(np.float32) * np.float32(1 / 255)
    return x


class Rows:
    """Rows ``[lo[i], hi[i])`` of a memory-mapped cache entry's ``x`` or ``y`` column, in
    that order, as one read-only array-like: a slice reads only the rows asked for (8-bit
    pixels scaled as :func:`as_inputs` scales them) into a new array, so a scorer walks a
    test partition larger than memory batch by batch, as every ``evaluate`` loop does (a
    slice may be followed by more indices: ``x[a:b, 0]``). ``np.asarray`` reads the whole
    column, and so does any other index (an integer, a list): meant for the targets, not
    for a large ``x``."""

    def __init__(self, parts: tuple[np.ndarray, list[np.ndarray], list[np.ndarray]],
                 lo: np.ndarray, hi: np.ndarray, column: Literal["x", "y"]):
        starts, xs, ys = parts
        self._arrays = xs if column == "x" else ys
        self._scale = column == "x" and self._arrays[0].dtype == np.uint8
        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        lo, hi = lo[hi > lo], hi[hi > lo]
        k = np.searchsorted(starts, lo, side="right") - 1  # a batch holds whole clients
        new = np.r_[True, (k[1:] != k[:-1]) | (lo[1:] != hi[:-1])][:len(lo)]  # adjacent
        last = np.r_[np.flatnonzero(new)[1:] - 1, len(hi) - 1][:len(lo)]  # ranges merged
        self._k, self._a = k[new], lo[new] - starts[k[new]]
        self._cum = np.r_[0, np.cumsum(hi[last] - lo[new])].astype(np.int64)
        first = self._arrays[0]
        self.dtype = np.dtype(np.float32) if self._scale else first.dtype
        self.shape = (int(self._cum[-1]), *first.shape[1:])
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple) and key and isinstance(key[0], slice):
            return self[key[0]][(slice(None), *key[1:])]
        if not isinstance(key, slice) or key.indices(len(self))[2] != 1:
            return np.asarray(self)[key]  # the whole column first
        start, stop, _ = key.indices(len(self))
        cum = self._cum
        pieces = [self._arrays[self._k[s]][self._a[s] + max(start - cum[s], 0):
                                           self._a[s] + min(stop, cum[s + 1]) - cum[s]]
                  for s in range(int(np.searchsorted(cum, start, side="right")) - 1,
                                 int(np.searchsorted(cum, stop, side="left")))]
        out = np.concatenate(pieces) if pieces else self._arrays[0][:0]
        return as_inputs(out) if self._scale else out  # a writable copy, never the mapping

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy is False:
            raise ValueError("streamed rows are read into a new array: copy=False is "
                             "impossible")
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)


def global_test_set(data: Any, which: Literal["sample", "all"]) -> tuple[Any, Any]:
    """The global test set the scorer evaluates (``eval.global_test_set``): ``sample`` the
    population's in-memory ``x_test``/``y_test``; ``all`` its whole stored test partition
    streamed from the cache (:meth:`TablePopulation.test_partition`) where it has one —
    a dataset held in memory (digits, CIFAR, the synthetic population) already scores its
    whole test set, so ``all`` is its ``x_test`` too."""
    if which == "all" and hasattr(data, "test_partition"):
        return data.test_partition()
    return data.x_test, data.y_test


def build_client_data(cfg: ExperimentConfig, dataset: Any = None) -> Any:
    """The client data of ``cfg``: a synthetic or table population, else the dataset split
    among the clients (:func:`fedray.data.federated.build_federated`)."""
    d = cfg.data
    n = cfg.clients.num_clients
    if d.dataset == "synthetic" and d.synthetic_per_client is not None:
        return SyntheticPopulation.build(d, n, cfg.seed)
    from fedray.core import registry

    entry = registry.dataset(d.dataset)
    if entry.population is not None:  # a reader of its own format (LEAF, ...)
        return entry.population(d, n, cfg.seed)
    if entry.kind == "table":
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

READY_BYTES = 64 << 20  # a synthetic read-ahead draws its clients together up to this size


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
    _ready: dict[int, tuple] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)
    _ahead: dict[int, np.random.Generator] = field(default_factory=dict, init=False,
                                                   repr=False, compare=False)

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
        """``n`` samples (x, y) from ``gen``: :meth:`_draw_many` of one generator."""
        x, y = self._draw_many([gen], n, alpha)
        return x[0], y[0]

    def _draw_many(self, gens: Sequence[np.random.Generator], n: int, alpha: float | None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` samples from each generator, stacked ((K, n, ...) inputs, (K, n) labels).
        Each generator is read in the same order (labels, clusters, latent noise, input
        noise; without a Dirichlet skew the labels and clusters of all generators are drawn
        together by :func:`~fedray.core.seeding.bounded_integers`, the same numbers); the
        arithmetic after it runs on the stack at once, elementwise, and the projection is
        one matmul per generator's slice (a stacked ``@``), so a client's samples are the
        same bits whichever clients are drawn beside it."""
        k, f, latent = len(gens), self.input_shape[0], self.centres.shape[2]
        if alpha is None:
            y, cluster = bounded_integers(gens, (self.num_classes, 2), n)
        else:
            y, cluster = np.empty((k, n), np.int64), np.empty((k, n), np.int64)
        noise = np.empty((k, n, latent))
        x = np.empty((k, n, f), np.float32)
        for i, gen in enumerate(gens):
            if alpha is not None:
                y[i] = gen.choice(self.num_classes, n,
                                  p=gen.dirichlet(np.full(self.num_classes, alpha)))
                cluster[i] = gen.integers(0, 2, n)
            gen.standard_normal(out=noise[i])
            gen.standard_normal(dtype=np.float32, out=x[i])
        z = self.centres[y, cluster] + 0.6 * noise
        x *= np.float32(self.noise_scale)
        x += z.astype(np.float32) @ self.basis.T
        return x, y

    def _split(self, x: np.ndarray, y: np.ndarray) -> tuple:
        n, n_test = self.per_client, self._n_test
        return x[:n - n_test], y[:n - n_test], x[n - n_test:], y[n - n_test:]

    def _client(self, cid: int) -> tuple:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        if self._last is None or self._last[0] != cid:
            got = self._ready.pop(cid, None)
            if got is None:
                gen = self._ahead.pop(cid, None)
                if gen is None:
                    gen = rng(self.seed, -1, cid, "population-client")
                got = self._split(*self._draw(gen, self.per_client, self.alpha))
            self._last = (cid, got)
        return self._last[1]

    def read_ahead(self, cids: Sequence[int]) -> None:
        """The clients about to be read: their generators seeded in one pass
        (:func:`~fedray.core.seeding.rngs`, the same streams as one by one) and, up to
        :data:`READY_BYTES` of samples, their samples drawn together
        (:meth:`_draw_many`), each kept for its client's next read; what an earlier call
        prepared and was not read by now is dropped, with the last client's arrays (views
        into an earlier stack)."""
        ids = [c for c in dict.fromkeys(cids) if 0 <= c < self.num_clients]
        self._last = None
        gens = rngs(self.seed, -1, ids, "population-client")
        size = len(ids) * self.per_client * (self.input_shape[0] + self.centres.shape[2]) * 8
        if ids and size <= READY_BYTES:
            x, y = self._draw_many(gens, self.per_client, self.alpha)
            self._ready = {c: self._split(x[i], y[i]) for i, c in enumerate(ids)}
            self._ahead = {}
        else:
            self._ready = {}
            self._ahead = dict(zip(ids, gens, strict=True))

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


ID_RULE = "an integer or string column with no nulls"
LABEL_RULE = "an integer class column with no nulls"
FEATURE_RULE = ("integer or floating columns, or one list column of integers or floats "
                "(list, large_list or fixed_size_list) of one non-zero length in every row, "
                "or one encoded-image column (a Hugging Face Image feature: struct of bytes "
                "and path) of one size and mode in every row")
STALE_TEMP_S = 24 * 3600
# what reading a damaged cache entry raises (it is then rebuilt)
DAMAGED_ENTRY = (ValueError, KeyError, IndexError, TypeError, OSError, zipfile.BadZipFile)
_TEMP = re.compile(r"^[0-9a-f]{32}(?:\.test)?\.(?:arrow|index\.npz|spool)\.tmp-"
                   r"(?P<host>[A-Za-z0-9._-]+)-(?P<pid>[0-9]+)$")


def _cache_root(d: DataConfig) -> str:
    return d.cache_dir or os.environ.get("FEDRAY_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fedray")


def populations_folder(d: DataConfig) -> str:
    """The cache's folder of population entries, ``CACHE/populations``: the cache root is
    the user's choice (and may be a link), the folder below it may not be one — entries
    are written and stale temporary files deleted there, never through a link."""
    return refuse_links(_cache_root(d), "populations", "data.cache_dir")


def _parquet(d: DataConfig) -> bool:
    """Whether the source files are Parquet (``parquet``, and ``hf`` from the hub cache) or
    Arrow streams (``hf`` save_to_disk)."""
    return d.dataset == "parquet" or getattr(d, "hf_id", None) is not None


def _source_key(d: DataConfig) -> str:
    """The config field that names the source files (for error messages)."""
    return "data.hf_id" if getattr(d, "hf_id", None) is not None else "data.root"


def _source_files(d: DataConfig) -> list[str]:
    """The data files of ``data.root``: the Parquet file(s), or the Arrow files an ``hf``
    save_to_disk directory's ``state.json`` names. A file of a directory must lie inside it
    once links are resolved: a manifest name with ``..``, an absolute name or a link out of
    the directory is refused, so a planted directory cannot make fedray read elsewhere."""
    if d.dataset == "hf" and d.hf_id is not None:  # Parquet files of the hub cache
        from fedray.data.hub import split_files

        return split_files(d.hf_id, d.hf_split, d.hf_revision, d.download, d.hf_config)
    root = os.path.abspath(d.root)
    if d.dataset == "parquet":
        if os.path.isfile(root):
            return [root]
        files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                       if f.endswith(".parquet"))
        if not files:
            raise ConfigError("data.root", d.root, "a Parquet file or a directory holding "
                                                   ".parquet files")
        for path in files:
            if not resolves_inside(path, root):
                raise ConfigError("data.root", path, f"files inside {d.root} (this one is a "
                                                     f"link to {os.path.realpath(path)})")
        return files
    state = os.path.join(root, "state.json")
    if not os.path.isfile(state):
        raise ConfigError("data.root", d.root, "a Hugging Face `datasets` save_to_disk "
                                               "directory (holding state.json)")
    if not resolves_inside(state, root):
        raise ConfigError("data.root", state, f"a state.json inside {d.root} (this one is a "
                                              f"link to {os.path.realpath(state)})")
    try:
        with open(state, encoding="utf-8") as fh:
            names = [f["filename"] for f in json.load(fh)["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError("data.root", state, "a save_to_disk state.json listing "
                                              "_data_files") from None
    if not names:
        raise ConfigError("data.root", state, "a state.json listing at least one data file")
    files = []
    for name in names:
        if not isinstance(name, str) or os.path.basename(name) != name or name in (".", ".."):
            raise ConfigError("data.root", state, f"plain file names inside the directory "
                                                  f"(got {short_repr(name)})")
        path = os.path.join(root, name)
        if not resolves_inside(path, root):
            raise ConfigError("data.root", state, f"files inside the directory ({name!r} is "
                                                  f"a link to {os.path.realpath(path)})")
        if not os.path.isfile(path):
            raise ConfigError("data.root", path, "an existing Arrow file named by state.json")
        files.append(path)
    return files


def _file_schema(d: DataConfig, path: str) -> tuple[Any, int, int]:
    """``(schema, rows, bytes in memory)`` of one source file, from its footer (Parquet) or
    stream header (Arrow); rows is -1 where only reading the file would tell."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if _parquet(d):
            meta = pq.read_metadata(path)
            size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            return meta.schema.to_arrow_schema(), meta.num_rows, size
        with pa.memory_map(path) as src:
            return pa.ipc.open_stream(src).schema, -1, os.path.getsize(path)
    except (pa.ArrowInvalid, OSError) as e:
        reason = " ".join(str(e).split())[:160]
        raise ConfigError(_source_key(d), path, f"readable {d.dataset} data ({reason})"
                          ) from None


def _is_number(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_image(t: Any) -> bool:
    """A Hugging Face ``Image`` feature as Arrow stores it: struct<bytes, path>."""
    import pyarrow as pa

    return pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == {
        "bytes", "path"}


def _is_id(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _check_schema(d: DataConfig, path: str, schema: Any) -> list[str]:
    """The feature column names of a file of ``schema``, once the id, label and feature
    columns are of types a population can hold: the first that is not is a
    :class:`ConfigError` naming the file, the column, its Arrow type and the rule."""
    import pyarrow as pa

    names = schema.names
    for key, col in (("data.client_column", d.client_column),
                     ("data.label_column", d.label_column)):
        if col not in names:
            raise ConfigError(key, col, f"a column of the table ({path} has {names})")
    t = schema.field(d.client_column).type
    if not _is_id(t):
        raise ConfigError("data.client_column", d.client_column,
                          f"{ID_RULE} (column {d.client_column!r} of {path} is {t})")
    t = schema.field(d.label_column).type
    if not pa.types.is_integer(t):
        raise ConfigError("data.label_column", d.label_column,
                          f"{LABEL_RULE} (column {d.label_column!r} of {path} is {t})")
    skip = {d.client_column, d.label_column}
    if d.feature_columns is None:
        scalars = [n for n in names if n not in skip and _is_number(schema.field(n).type)]
        lists = [n for n in names if n not in skip and _is_list(schema.field(n).type)
                 and _is_number(schema.field(n).type.value_type)]
        if scalars and lists or len(lists) > 1:
            raise ConfigError("data.feature_columns", None, f"set, choosing among the "
                              f"numeric columns {scalars} and list columns {lists} of {path} "
                              f"({FEATURE_RULE})")
        chosen = scalars or lists
        if not chosen:
            types = ", ".join(f"{f.name}: {f.type}" for f in schema)
            raise ConfigError("data.feature_columns", None, f"{FEATURE_RULE} ({path} has "
                                                            f"{types})")
        return chosen
    for n in d.feature_columns:
        if n not in names:
            raise ConfigError("data.feature_columns", n, f"columns of the table: {names} "
                                                         f"({path})")
        t = schema.field(n).type
        if _is_number(t) or ((_is_list(t) and _is_number(t.value_type) or _is_image(t))
                             and len(d.feature_columns) == 1):
            continue
        raise ConfigError("data.feature_columns", n, f"{FEATURE_RULE} (column {n!r} of "
                                                     f"{path} is {t})")
    return list(d.feature_columns)


@dataclass
class SourceCheck:
    """What the config-time pass over a table source found: its files, the feature columns
    and the bytes the conversion will hold in memory (``table_bytes``: the table read and
    its reordered copy; ``rows``, -1 where unknown)."""

    files: list[str]
    features: list[str]
    rows: int
    table_bytes: int


def check_table_source(d: DataConfig) -> SourceCheck:
    """The cheap checks of a ``parquet``/``hf`` source, run by ``load_config``
    (:func:`fedray.data.catalog._check_table`): the files (confined to ``data.root``), and
    each file's schema read from its footer or stream header — column presence and types,
    one schema across files. Row-level checks (nulls, list lengths, NaN/Inf) need the data
    and run in the conversion pass (:meth:`TablePopulation._convert`)."""
    files = _source_files(d)
    first, features, rows, size = None, [], 0, 0
    for path in files:
        schema, n, b = _file_schema(d, path)
        features = _check_schema(d, path, schema)
        if first is None:
            first = (path, schema)
        elif not schema.equals(first[1], check_metadata=False):
            raise ConfigError(_source_key(d), path, f"files of one schema (this one differs "
                                                    f"from {first[0]}'s)")
        rows = -1 if n < 0 or rows < 0 else rows + n
        size += b
    return SourceCheck(files, features, rows, size)


def _read_source(d: DataConfig, files: list[str]) -> tuple[Any, list[str], np.ndarray]:
    """``(table, feature column names, row offsets of the files in it)``, every file checked
    against :func:`_check_schema` as it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables, features = [], []
    for f in files:
        try:
            if _parquet(d):
                t = pq.read_table(f)
            else:
                with pa.memory_map(f) as src:
                    t = pa.ipc.open_stream(src).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            reason = " ".join(str(e).split())[:160]
            raise ConfigError(_source_key(d), f, f"readable {d.dataset} data ({reason})"
                              ) from None
        features = _check_schema(d, f, t.schema)
        if tables and not t.schema.equals(tables[0].schema, check_metadata=False):
            raise ConfigError("data.root", f, f"files of one schema (this one differs from "
                                              f"{files[0]}'s)")
        tables.append(t)
    starts = np.r_[0, np.cumsum([t.num_rows for t in tables])].astype(np.int64)
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return table, features, starts


class _Rows:
    """Names a row of the source: row ``r`` of the concatenated table is row
    ``r - starts[k]`` of file ``k``."""

    def __init__(self, files: list[str], starts: np.ndarray):
        self.files, self.starts = files, starts

    def first(self, bad: np.ndarray) -> tuple[str, int]:
        """The file and row (in that file) of the earliest of the rows ``bad``."""
        r = int(np.min(bad))
        k = int(np.searchsorted(self.starts, r, side="right") - 1)
        return self.files[k], r - int(self.starts[k])

    def error(self, key: str, col: str, rule: str, bad: np.ndarray, what: str
              ) -> ConfigError:
        path, row = self.first(bad)
        return ConfigError(key, col, f"{rule} (column {col!r} of {path}, row {row}: {what})")


def _nulls(column: Any) -> np.ndarray:
    """Positions of the nulls of a (chunked) Arrow array."""
    return np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))


def _features(d: DataConfig, table: Any, names: list[str], rows: _Rows) -> np.ndarray:
    """The (rows, features) float32 matrix of the feature columns of every row, in one pass
    over the values: a null, an empty or ragged list, or a value that is not a finite
    float32 (NaN, Inf, or beyond float32's range) is a :class:`ConfigError` naming the
    column, the file and the first bad row. Every row is checked, used by a client or not,
    so whether a file is accepted does not depend on ``clients.num_clients``."""
    import pyarrow.compute as pc

    key = "data.feature_columns"
    if len(names) == 1 and _is_image(table.schema.field(names[0]).type):
        return _decoded_images(table.column(names[0]).combine_chunks(), names[0], rows)
    if len(names) == 1 and _is_list(table.schema.field(names[0]).type):
        name = names[0]
        col = table.column(name).combine_chunks()
        if col.null_count:
            raise rows.error(key, name, FEATURE_RULE, _nulls(col), "null")
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        width = int(lengths[0]) if len(lengths) else 1
        if width == 0:
            raise rows.error(key, name, FEATURE_RULE, np.flatnonzero(lengths == 0),
                             "an empty list")
        bad = np.flatnonzero(lengths != width)
        if len(bad):
            raise rows.error(key, name, FEATURE_RULE, bad, f"{int(lengths[bad[0]])} values, "
                             f"where other rows hold {width}")
        values = col.flatten()
        if values.null_count:
            raise rows.error(key, name, FEATURE_RULE, _nulls(values) // width,
                             "a null in the list")
        with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
            x = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32
                           ).reshape(len(col), width)
        columns = [name] * width
    else:
        x = np.empty((table.num_rows, len(names)), dtype=np.float32)
        for j, name in enumerate(names):
            col = table.column(name)
            if col.null_count:
                raise rows.error(key, name, FEATURE_RULE, _nulls(col), "null")
            with np.errstate(over="ignore"):
                x[:, j] = col.to_numpy()
        columns = names
    block = max(1, (1 << 20) // max(1, x.shape[1]))
    for lo in range(0, len(x), block):  # the first non-finite value, in file order
        finite = np.isfinite(x[lo:lo + block])
        if not finite.all():
            i, j = (int(v[0]) for v in np.nonzero(~finite))
            path, row = rows.first(np.array([lo + i]))
            raise ConfigError(key, columns[j], f"finite float32 values (column "
                              f"{columns[j]!r} of {path}, row {row}: {x[lo + i, j]})")
    return x


def _decoded_images(col: Any, name: str, rows: _Rows) -> np.ndarray:
    """An encoded-image column (PNG/JPEG bytes, as Flower Datasets' ``flwrlabs/femnist`` or
    ``cifar10`` store them) decoded with Pillow into (rows, C, H, W) float32 in [0, 1] (8-bit
    modes; grey images get one channel; palette, alpha and CMYK images are converted to RGB,
    grey-with-alpha and other modes to grey; a decompression bomb is refused). Every row
    must decode to the first row's size and mode; an image stored by ``path`` only (not
    embedded) is refused: the path would point outside ``data.root``."""
    import io

    from PIL import Image, UnidentifiedImageError

    key = "data.feature_columns"
    if col.null_count:
        raise rows.error(key, name, FEATURE_RULE, _nulls(col), "null")
    data = col.field("bytes")
    first = None
    out: np.ndarray | None = None
    for i in range(len(col)):
        raw = data[i].as_py()
        if raw is None:
            raise rows.error(key, name, FEATURE_RULE, np.array([i]),
                             "an image stored by path, not embedded")
        try:
            with Image.open(io.BytesIO(raw)) as im:
                mode, size = im.mode, im.size
                if mode not in ("L", "RGB"):  # palette, alpha, CMYK: as grey or colour
                    im = im.convert("RGB" if mode in ("P", "RGBA", "CMYK", "YCbCr") else "L")
                arr = np.asarray(im)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            raise rows.error(key, name, FEATURE_RULE, np.array([i]),
                             "bytes that do not decode as an image") from None
        if first is None:
            first = (mode, size)
            if arr.dtype != np.uint8:
                raise rows.error(key, name, FEATURE_RULE, np.array([i]),
                                 f"an 8-bit image (mode {mode})")
            chw = (1, *arr.shape) if arr.ndim == 2 else (arr.shape[2], *arr.shape[:2])
            out = np.empty((len(col), *chw), np.float32)
        elif (mode, size) != first:
            raise rows.error(key, name, FEATURE_RULE, np.array([i]),
                             f"mode {mode} size {size}, where row 0 is {first[0]} {first[1]}")
        out[i] = (arr if arr.ndim == 2 else arr.transpose(2, 0, 1)) / np.float32(255)
    if out is None:
        return np.zeros((0, 1), np.float32)
    return out


def _temp_name(path: str) -> str:
    """Where ``path`` is written before its atomic rename: named by host and process, so
    that a later build can tell a temp file of a killed process from one being written."""
    return f"{path}.tmp-{socket.gethostname() or 'host'}-{os.getpid()}"


def _remove_stale_temps(folder: str) -> None:
    """Delete the cache's temp files that no process will finish: those of a process of
    this host that is gone, and any older than a day (a crash elsewhere). A live writer's
    temp file is left alone; names that are not cache temp files are never touched."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    host, now = socket.gethostname() or "host", time.time()
    for name in names:
        m = _TEMP.match(name)
        if m is None:
            continue
        full = os.path.join(folder, name)
        try:
            if m["host"] == host and not _alive(int(m["pid"])) or \
                    now - os.lstat(full).st_mtime > STALE_TEMP_S:
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)  # a natural-split build's spool folder
                else:
                    os.remove(full)
        except OSError:
            pass  # removed meanwhile by another build


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process writes no temp file while it cleans
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def rows_table(x: np.ndarray, y: np.ndarray) -> Any:
    """Rows as a cache entry's Arrow table: ``x`` flattened into a fixed-size list column,
    ``y`` as it is, or for per-token labels (y of shape (N, steps)) a fixed-size list."""
    import pyarrow as pa

    x2 = x.reshape(len(x), int(np.prod(x.shape[1:])))  # also without rows
    ycol: Any = pa.array(y) if y.ndim == 1 else pa.FixedSizeListArray.from_arrays(
        pa.array(y.reshape(-1)), int(np.prod(y.shape[1:])))
    return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x2.reshape(-1)),
                                                           x2.shape[1]), "y": ycol})


def batch_arrays(batch: Any, input_shape: tuple[int, ...], label_shape: tuple[int, ...]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """One record batch of a cache entry (:func:`rows_table`) as NumPy views (no copy)."""
    xcol, ycol = batch.column("x"), batch.column("y")
    n = len(ycol)
    if xcol.offset or ycol.offset or xcol.null_count or ycol.null_count:
        raise ValueError("unexpected record batch layout")
    x = xcol.values.to_numpy(zero_copy_only=True).reshape(n, *input_shape)
    y = ycol.values.to_numpy(zero_copy_only=True).reshape(n, *label_shape) if label_shape \
        else ycol.to_numpy(zero_copy_only=True)
    return x, y


def mapped_batches(path: str, input_shape: tuple[int, ...], label_shape: tuple[int, ...]
                   ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """A cache entry's rows, memory-mapped: the first row of each record batch and each
    batch's x and y as NumPy views (no copy). A batch holds whole clients."""
    import pyarrow as pa

    reader = pa.ipc.open_file(pa.memory_map(path))
    starts, xs, ys, at = [], [], [], 0
    for i in range(reader.num_record_batches):
        x, y = batch_arrays(reader.get_batch(i), input_shape, label_shape)
        xs.append(x)
        ys.append(y)
        starts.append(at)
        at += len(y)
    if not xs:  # an entry without rows
        starts, xs, ys = [0], [np.zeros((0, *input_shape), np.float32)], [
            np.zeros((0, *label_shape), np.int64)]
    return np.asarray(starts, np.int64), xs, ys


def write_cache_entry(path: str, index_path: str, x: np.ndarray, y: np.ndarray,
                      offsets: np.ndarray, split: np.ndarray, natural_ids: np.ndarray,
                      x_test: np.ndarray, y_test: np.ndarray, info: dict[str, Any]
                      ) -> TablePopulation:
    """Write one population cache entry — the rows (client by client, train before test)
    as an uncompressed Arrow IPC file, the index (offsets, split points, natural ids, the
    global test set, ``info``) as a plain ``.npz`` — through temporary names, so that an
    interrupted write leaves nothing half-written; return it, memory-mapped. ``info`` may
    hold ``input_shape`` (default: flat rows); per-token labels (y of shape (N, steps))
    are stored as fixed-size lists and ``info["label_shape"]`` set."""
    import pyarrow as pa

    if y.ndim > 1:
        info = {**info, "label_shape": [int(s) for s in y.shape[1:]]}
    out = rows_table(x, y)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp, tmp_index = _temp_name(path), _temp_name(index_path)
    try:
        with open_new(tmp) as sink, pa.ipc.new_file(sink, out.schema) as writer:
            writer.write_table(out, max_chunksize=max(1, len(y)))
        with open_new(tmp_index) as fh:  # a file object: savez adds no suffix
            np.savez(fh, offsets=offsets, split=split, natural_ids=natural_ids,
                     x_test=x_test.reshape(len(x_test), -1), y_test=y_test,
                     info=np.array(json.dumps(info)))
        os.replace(tmp_index, index_path)
        os.replace(tmp, path)
    except BaseException:  # a failed or interrupted write leaves no temp file behind
        for name in (tmp, tmp_index):
            if os.path.lexists(name):
                os.remove(name)
        raise
    return TablePopulation._from_cache(path, index_path)


@dataclass
class TablePopulation:
    """Clients as contiguous row ranges of a memory-mapped Arrow IPC file: client ``c``'s
    train rows are ``[offsets[c], split[c])``, its local test rows ``[split[c],
    offsets[c+1])``. Only ``path``, the index arrays and the global test set are pickled;
    each process maps the file on first use.

    The global test set is kept as stored (``x_test_rows``: 8-bit pixels stay 8-bit, a
    quarter of float32's bytes in the index, in every pickle and in every process that
    never scores it); ``x_test`` is those rows as models read them (:func:`as_inputs`),
    converted on first use and kept."""

    path: str
    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    offsets: np.ndarray
    split: np.ndarray
    natural_ids: np.ndarray
    x_test_rows: np.ndarray
    y_test: np.ndarray
    info: dict[str, Any]
    _parts: Any = field(default=None, repr=False)  # (batch start rows, xs, ys), mapped
    _x_test: Any = field(default=None, repr=False, compare=False)  # x_test, once converted
    _held: Any = field(default=None, repr=False, compare=False)  # the held-out entry, mapped

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_parts": None, "_x_test": None, "_held": None}

    def test_partition(self) -> tuple[Rows, Rows]:
        """Every row of the dataset's test partition as streamed :class:`Rows` (x, y): the
        rows of the held-out entry when the dataset keeps its test users apart from the
        clients (FLAIR: ``info["held_out_entry"]``, all of its images), else every kept
        client's local test rows in client order."""
        held = self.info.get("held_out_entry")
        if held is not None:
            if self._held is None:
                self._held = self._held_out(held)
            return self._held.test_partition()
        if self._parts is None:
            self._map()
        hi = self.offsets[1:]
        return Rows(self._parts, self.split, hi, "x"), Rows(self._parts, self.split, hi, "y")

    def _held_out(self, name: Any) -> TablePopulation:
        """This entry's held-out entry: :func:`held_out_entry` with its input shape, classes
        and ``info["held_out_rows"]`` rows."""
        return held_out_entry(os.path.dirname(self.path), name, self.input_shape,
                              self.info["classes"], int(self.info["held_out_rows"]))

    def test_partition_size(self) -> int:
        """Rows of :meth:`test_partition` (from the index: nothing is mapped)."""
        held = self.info.get("held_out_rows")
        return int(held) if held is not None else int((self.offsets[1:] - self.split).sum())

    @property
    def x_test(self) -> np.ndarray:
        if self._x_test is None:
            self._x_test = as_inputs(self.x_test_rows)
        return self._x_test

    @classmethod
    def build(cls, d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
        files = _source_files(d)
        stat = [(os.path.abspath(f), os.path.getsize(f), os.path.getmtime(f)) for f in files]
        key = hashlib.sha256(json.dumps([stat, d.dataset, d.client_column, d.label_column,
                                         d.feature_columns, d.min_samples,
                                         d.local_test_fraction, num_clients, seed,
                                         GLOBAL_TEST_RULE]).encode()
                             ).hexdigest()[:32]
        folder = populations_folder(d)
        _remove_stale_temps(folder)
        path = os.path.join(folder, key + ".arrow")
        index_path = os.path.join(folder, key + ".index.npz")
        if all(os.path.isfile(p) and resolves_inside(p, folder) for p in (path, index_path)):
            try:
                return cls._from_cache(path, index_path)
            except DAMAGED_ENTRY:
                pass  # a damaged cache entry is rebuilt
        return cls._convert(d, files, num_clients, seed, path, index_path)

    @classmethod
    def _convert(cls, d: DataConfig, files: list[str], num_clients: int, seed: int,
                 path: str, index_path: str) -> TablePopulation:
        table, names, starts = _read_source(d, files)
        source = _Rows(files, starts)
        for key, col, rule in (("data.client_column", d.client_column, ID_RULE),
                               ("data.label_column", d.label_column, LABEL_RULE)):
            if table.column(col).null_count:
                raise source.error(key, col, rule, _nulls(table.column(col)), "null")
        labels_raw = table.column(d.label_column).to_numpy()
        classes, labels = np.unique(labels_raw, return_inverse=True)
        ids_raw = table.column(d.client_column).to_numpy()
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
        x = _features(d, table, names, source)[rows[order]]  # every row checked, once
        y, c, is_test = y[order], c[order], is_test[order]
        offsets = np.r_[0, np.cumsum(np.bincount(c, minlength=num_clients))].astype(np.int64)
        split = offsets[:-1] + np.bincount(c[~is_test], minlength=num_clients)
        del table
        test_rows = np.flatnonzero(is_test)
        pick = np.sort(rng(seed, -1, -1, "population-global-test").choice(
            test_rows, global_test_size(len(test_rows), int(np.prod(x.shape[1:]))),
            replace=False))
        source = d.root if d.root is not None else \
            f"hf://{d.hf_id}@{d.hf_revision}/{d.hf_split}"
        info = {"source": redact(source), "dataset": d.dataset, "rows": int(len(y)),
                "ids_total": int(len(natural)),
                "ids_too_small": int(len(natural) - len(eligible)),
                "classes": [str(v) for v in classes.tolist()],
                "input_shape": [int(s) for s in x.shape[1:]]}
        return write_cache_entry(path, index_path, x, y, offsets, split,
                                 natural[keep].astype(str), x[pick], y[pick], info)

    @classmethod
    def _from_cache(cls, path: str, index_path: str) -> TablePopulation:
        """The entry at ``path``: its index read as plain arrays (no pickle), the rows
        memory-mapped; a damaged entry raises ValueError, KeyError, IndexError or OSError."""
        with np.load(index_path, allow_pickle=False) as z:
            offsets, split = z["offsets"], z["split"]
            if offsets.ndim != 1 or split.ndim != 1 or len(offsets) != len(split) + 1 or \
                    offsets.dtype.kind not in "iu" or split.dtype.kind not in "iu" or \
                    offsets[0] != 0 or (np.diff(offsets) < 0).any() or \
                    (split < offsets[:-1]).any() or (split > offsets[1:]).any():
                raise ValueError("cache index: client rows that are not in order")
            info = json.loads(str(z["info"]))
            shape = tuple(int(s) for s in info.get("input_shape", [z["x_test"].shape[1]]))
            pop = cls(path, len(offsets) - 1, 0, shape, offsets, split, z["natural_ids"],
                      z["x_test"].reshape(-1, *shape), z["y_test"], info)
        pop.num_classes = len(pop.info["classes"])
        held = info.get("held_out_entry")
        if held is not None:  # an entry whose held-out rows are missing or other is rebuilt
            pop._held = pop._held_out(held)
        pop._map()
        starts, _, ys = pop._parts
        if starts[-1] + len(ys[-1]) != int(offsets[-1]) or len(split) != pop.num_clients \
                or not np.isin(starts, offsets).all():  # a batch holds whole clients
            raise ValueError("cache entry does not match its index")
        return pop

    def _map(self) -> None:
        self._parts = mapped_batches(self.path, self.input_shape,
                                     tuple(int(s) for s in self.info.get("label_shape", ())))

    def client_arrays(self, cid: int, round: int, split: str = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        if self._parts is None:
            self._map()
        starts, xs, ys = self._parts
        lo, mid, hi = self.offsets[cid], self.split[cid], self.offsets[cid + 1]
        a, b = (lo, mid) if split == "train" else (mid, hi)
        k = max(int(np.searchsorted(starts, lo, side="right")) - 1, 0)  # its record batch
        return as_inputs(xs[k][a - starts[k]:b - starts[k]]), ys[k][a - starts[k]:b - starts[k]]

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
                "global_test_size": int(len(self.y_test)),
                "test_partition_size": self.test_partition_size(), **self.info}


def held_out_entry(folder: str, name: Any, input_shape: Sequence[int], classes: list[str],
                   rows: int | None = None) -> TablePopulation:
    """The held-out entry ``name`` in ``folder``, mapped and checked to be one that fits:
    an entry of its own (no held-out entry itself) with this input shape and these
    classes, and ``rows`` rows when given (what the main entry recorded); a
    :data:`DAMAGED_ENTRY` error otherwise (ValueError when it is missing or does not
    fit)."""
    paths = entry_paths(folder, str(name))
    if not re.fullmatch(r"[0-9a-f]{32}\.test", str(name)) or not all(
            os.path.isfile(p) and resolves_inside(p, folder) for p in paths):
        raise ValueError(f"held-out entry {name!r} missing")
    held = TablePopulation._from_cache(*paths)
    if "held_out_entry" in held.info or list(held.input_shape) != list(input_shape) or \
            held.info["classes"] != classes or \
            rows is not None and int(held.offsets[-1]) != rows:
        raise ValueError(f"held-out entry {name!r} does not fit")
    return held


def entry_paths(folder: str, name: str) -> tuple[str, str]:
    """A cache entry's two files: its rows (``<name>.arrow``) and its index
    (``<name>.index.npz``)."""
    return os.path.join(folder, name + ".arrow"), os.path.join(folder, name + ".index.npz")


__all__ = ["SyntheticPopulation", "TablePopulation", "build_client_data", "group_by_id",
           "local_test_mask"]
