"""Datasets split by natural client and by train/test (LEAF, TFF) into the population
cache, streamed: a reader yields its clients one at a time in sorted natural-id order and
:class:`EntryWriter` writes them as Arrow record batches of whole clients, so that a build
holds one batch of rows (about :data:`BATCH_BYTES`), never the whole dataset. The readers'
per-file work runs in a pool of processes (:func:`ordered_map`, results in order) when
there is enough of it; the entry is the same bytes with or without the pool, on any
machine (work units and record batches have fixed sizes).

The cache entry is keyed by the files (path, size, modification time),
``clients.num_clients``, ``data.min_samples``, the seed and the reader's own settings; the
clients kept are the first ``clients.num_clients`` in sorted id order with at least
``data.min_samples`` rows (train + test), each client's train rows then its test rows; the
test partition is the kept clients' test rows, or a reader's own held-out users (FLAIR's
test users) written as a second entry beside the first (``<its own key>.test``, keyed by
the files and what decides those rows, so shared by every client count and seed); the
global test set is up to 10,000 of the test partition's rows (seeded; fewer for large
inputs: :func:`fedray.data.population.global_test_size`), or all of them streamed
(``eval.global_test_set=all``). 8-bit images are stored as 8-bit and multi-hot targets as
float32.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, redact
from fedray.core.storage import open_new
from fedray.data.population import (
    DAMAGED_ENTRY,
    GLOBAL_TEST_RULE,
    TablePopulation,
    _remove_stale_temps,
    _temp_name,
    batch_arrays,
    entry_paths,
    global_test_size,
    held_out_entry,
    populations_folder,
    rows_table,
)

SPLITS = ("train", "test")
BATCH_BYTES = 64 << 20  # rows buffered before a record batch is written
POOL_MIN_UNITS = 8  # fewer work units than this run in the calling process
Parts = list[tuple[np.ndarray, np.ndarray]]


@dataclass
class Block:
    """Consecutive clients in sorted id order: their ids, train and test row counts, and
    their rows, client by client (each client's train rows, then its test rows). The
    dtypes are part of the contract: ``x`` in uint8 means 8-bit pixels (stored as they are,
    read as x / 255), any other ``x`` is stored as float32; ``y`` in a float dtype means
    multi-hot targets (multi-label), integer ``y`` class ids (one per row or per token)."""

    users: list[str]
    n_train: np.ndarray
    n_test: np.ndarray
    x: np.ndarray
    y: np.ndarray

    @classmethod
    def of(cls, user: str, train: Parts, test: Parts, shape: tuple[int, ...]) -> Block:
        """One client's block from its (x, y) parts (``shape`` the input shape when it
        has none)."""
        parts = [(x.reshape(len(x), *shape), y) for x, y in train + test if len(y)]
        x = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, *shape),
                                                                         np.float32)
        y = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        return cls([user], np.array([sum(len(v) for _, v in train)]),
                   np.array([sum(len(v) for _, v in test)]), x, y)


@dataclass
class Natural:
    """What a reader hands :func:`natural_split_population`: ``blocks`` yields
    :class:`Block` s in sorted client-id order; ``shape`` (the input shape) and
    ``classes`` (a class count, the class names, or None for 0..the largest label) are read
    once ``blocks`` is exhausted, with ``info`` (what the reader adds to the entry's info)."""

    blocks: Generator[Block, None, None]
    shape: Callable[[], tuple[int, ...]]
    classes: Callable[[], int | list[str] | None] = field(default=lambda: None)
    info: Callable[[], dict[str, Any]] = field(default=lambda: {})
    # the test partition's users when they are not clients (FLAIR's test users): blocks of
    # them in sorted id order, every row a test row, written as the held-out entry; None:
    # the test partition is the clients' own test rows
    held_out: Callable[[], Generator[Block, None, None]] | None = None
    # what decides the held-out rows besides the files (the held-out entry's key: shared
    # by every client count, seed and per-client cap)
    held_out_key: list[Any] = field(default_factory=list)


@dataclass
class HeldOut:
    """The held-out entry to write beside a natural entry: its name (``<32 hex>.test``,
    keyed by the files and :attr:`Natural.held_out_key`) and its users' blocks."""

    name: str
    blocks: Callable[[], Generator[Block, None, None]]


def natural_split_population(d: DataConfig, num_clients: int, seed: int, kind: str,
                             files: list[str], read: Callable[[str], Natural], split_note: str,
                             key_extra: list[Any] | None = None,
                             extra_info: dict[str, Any] | None = None) -> TablePopulation:
    """The cache entry of a natural-split dataset (see the module docstring): mapped when
    it exists, else written from ``read(scratch)`` (``scratch`` a folder name in the cache
    that the reader may create for its own temporary files; removed afterwards)."""
    stat = [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]
    key = hashlib.sha256(json.dumps([kind, stat, d.min_samples, num_clients, seed,
                                     key_extra or [], GLOBAL_TEST_RULE]).encode()
                         ).hexdigest()[:32]
    folder = populations_folder(d)
    _remove_stale_temps(folder)
    path, index_path = (os.path.join(folder, key + ext) for ext in (".arrow", ".index.npz"))
    if all(os.path.isfile(p) and resolves_inside(p, folder) for p in (path, index_path)):
        try:
            pop = TablePopulation._from_cache(path, index_path)
        except DAMAGED_ENTRY:
            pass  # a damaged cache entry is rebuilt
        else:
            return _same_vocabulary(pop, extra_info or {})
    os.makedirs(folder, exist_ok=True)
    writer = EntryWriter(path, index_path, num_clients, d.min_samples)
    scratch = _temp_name(os.path.join(folder, key + ".spool"))
    source = None
    try:
        source = read(scratch)
        for block in source.blocks:
            writer.add(block)
        if writer.eligible < num_clients:
            raise ConfigError("clients.num_clients", num_clients,
                              f"at most the {writer.eligible} users of {d.root} with >= "
                              f"{d.min_samples} samples (data.min_samples)")
        classes = source.classes()
        names = classes if isinstance(classes, list) else [
            str(c) for c in range(classes or writer.max_label + 1)]
        info = {"source": redact(d.root), "dataset": kind, "ids_total": writer.total,
                "ids_too_small": writer.total - writer.eligible, "classes": names,
                "input_shape": list(source.shape()), "split": split_note,
                **source.info(), **(extra_info or {})}
        held = None if source.held_out is None else HeldOut(hashlib.sha256(json.dumps(
            [kind, "held-out", stat, source.held_out_key]).encode()).hexdigest()[:32] + ".test",
            source.held_out)
        return writer.finish(seed, info, held)
    finally:
        if source is not None:
            source.blocks.close()  # a reader's pool stops with it
        writer.discard()
        shutil.rmtree(scratch, ignore_errors=True)


def _same_vocabulary(pop: TablePopulation, extra: dict[str, Any]) -> TablePopulation:
    """``pop``, unless it was built with another vocabulary file than this one (the file
    changed in place keeps its key: size and time are all the key sees)."""
    sha = extra.get("vocab_sha256")
    if sha is not None and pop.info.get("vocab_sha256") != sha:
        raise ConfigError("data.vocab", extra.get("vocab_file"), f"the vocabulary file the "
                                                                 f"cache entry "
                                                                 f"{os.path.basename(pop.path)}"
                                                                 f" was built with (SHA-256 "
                                                                 f"{pop.info.get('vocab_sha256')}"
                                                                 f", this file's {sha}); "
                                                                 f"remove the entry to "
                                                                 f"rebuild it")
    return pop


class EntryWriter:
    """Writes one cache entry client by client: rows go to a temporary Arrow IPC file in
    record batches of whole clients, the index (offsets, split points, natural ids, the
    global test set, ``info``) to a temporary ``.npz``; :meth:`finish` renames both into
    place, :meth:`discard` removes whatever is left (an interrupted build leaves nothing)."""

    def __init__(self, path: str, index_path: str, num_clients: int, min_samples: int):
        self.path, self.index_path = path, index_path
        self.tmp, self.tmp_index = _temp_name(path), _temp_name(index_path)
        self.num_clients, self.min_samples = num_clients, min_samples
        self.total = self.eligible = 0
        self.max_label = -1
        self.label_shape: tuple[int, ...] = ()
        self.offsets, self.split, self.keep = [0], [], []
        self._xs: list[np.ndarray] = []
        self._ys: list[np.ndarray] = []
        self._bytes = 0
        self._sink: Any = None
        self._writer: Any = None
        self._schema: Any = None

    def add(self, block: Block) -> None:
        """A block's clients: each kept when it has ``min_samples`` rows and fewer than
        ``num_clients`` are kept so far."""
        n_train, n = np.asarray(block.n_train), np.asarray(block.n_train) + block.n_test
        self.total += len(block.users)
        if block.y.ndim == 1 and len(block.y):  # classes 0..the largest label of any client
            self.max_label = max(self.max_label, int(block.y.max()))
        ok = n >= self.min_samples
        self.eligible += int(ok.sum())
        take = np.flatnonzero(ok)[:self.num_clients - len(self.keep)]
        if not len(take):
            return
        keep = np.zeros(len(n), bool)
        keep[take] = True
        rows = np.repeat(keep, n)
        x, y = (block.x, block.y) if rows.all() else (block.x[rows], block.y[rows])
        if len(y):
            if not self._bytes and self._writer is None:
                self.label_shape = tuple(int(s) for s in y.shape[1:])
            # 8-bit pixels stay 8-bit (as_inputs scales them when read), multi-hot stays float
            self._xs.append(np.ascontiguousarray(x, np.uint8 if x.dtype == np.uint8 else
                                                 np.float32).reshape(len(x), -1))
            self._ys.append(np.ascontiguousarray(y, np.float32 if y.dtype.kind == "f" else
                                                 np.int64))
            self._bytes += self._xs[-1].nbytes + self._ys[-1].nbytes
        ends = self.offsets[-1] + np.cumsum(n[take])
        self.split.extend((ends - n[take] + n_train[take]).tolist())
        self.offsets.extend(ends.tolist())
        self.keep.extend(block.users[i] for i in take.tolist())
        if self._bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self, width: int = 1, label_shape: tuple[int, ...] = ()) -> None:
        import pyarrow as pa

        if self._xs:
            x, y = np.concatenate(self._xs), np.concatenate(self._ys)
        elif self._writer is None:  # an entry without rows: one empty batch
            x = np.zeros((0, width), np.float32)
            y = np.zeros((0, *label_shape), np.int64)
        else:
            return
        self._xs, self._ys, self._bytes = [], [], 0
        table = rows_table(x, y)
        if self._writer is None:
            self._sink = open_new(self.tmp)
            self._writer = pa.ipc.new_file(self._sink, table.schema)
            self._schema = table.schema
        elif table.schema != self._schema:
            raise ValueError(f"rows of another shape than the first batch's ({table.schema})")
        self._writer.write_table(table, max_chunksize=max(1, len(y)))

    def finish(self, seed: int, info: dict[str, Any], held_out: HeldOut | None = None,
               sample: bool = True) -> TablePopulation:
        """Write the last batch and the index, rename both into place, map the entry. The
        test partition is the kept clients' test rows, or with ``held_out`` the rows of its
        blocks: the entry ``held_out.name`` (every row a test row;
        ``info["held_out_entry"]``), written first unless one that fits is there; the
        global test set is a seeded draw of :func:`global_test_size` rows of the test
        partition, in its order (none with ``sample`` false: the held-out entry's index)."""
        shape = tuple(int(s) for s in info["input_shape"])
        label_shape = self.label_shape
        if label_shape:
            info = {**info, "label_shape": [int(s) for s in label_shape]}
        self._flush(int(np.prod(shape)), label_shape)
        self._writer.close()
        self._sink.close()
        self._writer = None
        offsets, split = np.asarray(self.offsets, np.int64), np.asarray(self.split, np.int64)
        source = self.tmp
        if held_out is not None:
            held = self._held_out(held_out, seed, info)
            info = {**info, "held_out_entry": held_out.name,
                    "held_out_rows": int(held.offsets[-1])}
            source, test_rows = held.path, np.arange(int(held.offsets[-1]))
        else:
            test_rows = np.concatenate([np.arange(a, b) for a, b in zip(
                split, offsets[1:], strict=True)] or [np.zeros(0, np.int64)])
        pick = np.sort(rng(seed, -1, -1, "population-global-test").choice(
            test_rows, global_test_size(len(test_rows), int(np.prod(shape))) if sample else 0,
            replace=False))
        x_test, y_test = _rows_of(source, pick, shape, tuple(label_shape)) if len(pick) else \
            (np.zeros((0, *shape), np.float32), np.zeros((0, *label_shape), np.int64))
        info = {**info, "rows": int(offsets[-1])}
        with open_new(self.tmp_index) as fh:  # a file object: savez adds no suffix
            np.savez(fh, offsets=offsets, split=split,
                     natural_ids=np.asarray(self.keep).astype(str),
                     x_test=x_test.reshape(len(x_test), int(np.prod(shape))), y_test=y_test,
                     info=np.array(json.dumps(info)))
        os.replace(self.tmp_index, self.index_path)
        os.replace(self.tmp, self.path)
        return TablePopulation._from_cache(self.path, self.index_path)

    def _held_out(self, held: HeldOut, seed: int, info: dict[str, Any]) -> TablePopulation:
        """The held-out users' rows as an entry of their own beside this one (every user
        kept, every row a test row), renamed into place before this entry is; one already
        there that loads and has this entry's input shape and classes is kept (its key is
        the files and the reader's ``held_out_key``: every client count, seed and cap of
        the same files shares it)."""
        folder = os.path.dirname(self.path)
        try:
            return held_out_entry(folder, held.name, info["input_shape"], info["classes"])
        except DAMAGED_ENTRY:
            pass  # missing, damaged or not fitting: written below
        writer = EntryWriter(*entry_paths(folder, held.name), 1 << 62, 0)
        source = held.blocks()
        try:
            for block in source:
                writer.add(block)
            return writer.finish(seed, {**info, "ids_total": writer.total, "ids_too_small": 0,
                                        "split": f"the held-out users: {info['split']}"},
                                 sample=False)
        finally:
            source.close()  # a reader's pool stops with it
            writer.discard()

    def discard(self) -> None:
        """Close and remove the temporary files (nothing once :meth:`finish` renamed them)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None
        for name in (self.tmp, self.tmp_index):
            if os.path.lexists(name):
                os.remove(name)


def _rows_of(path: str, rows: np.ndarray, shape: tuple[int, ...],
             label_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` (sorted) of the entry file at ``path``: its record batches read one at
    a time, not memory-mapped (a mapping's pages, faulted in around every row, count as
    this process's memory)."""
    import pyarrow as pa

    xs, ys, at = [], [], 0
    with pa.OSFile(path, "rb") as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            x, y = batch_arrays(reader.get_batch(i), shape, label_shape)
            want = rows[(rows >= at) & (rows < at + len(y))] - at
            if len(want):
                xs.append(x[want])
                ys.append(y[want])
            at += len(y)
    if not xs:
        return np.zeros((0, *shape), np.float32), np.zeros((0, *label_shape), np.int64)
    return np.concatenate(xs), np.concatenate(ys)


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """``__main__``'s file and spec hidden while pool workers start: a ``spawn``ed worker
    would otherwise run the caller's script again (a script without an ``if __name__ ==
    "__main__":`` guard would start its own build there and break the pool). The workers
    need only fedray's modules, which they import by name."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__")
             if main is not None and k in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None  # spawn reads it; None: nothing to import
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def ordered_map(fn: Callable[[Any], Any], units: list[Any]) -> Iterator[Any]:
    """``fn`` over ``units``, results in order: in a pool of as many processes as this
    process may use cores (at most 8; started with ``spawn`` without the caller's
    ``__main__``, so nothing of the caller's state is inherited or run again) when there
    are at least :data:`POOL_MIN_UNITS` units and two cores, else here. At most two units
    per worker are in flight, so finished results never pile up ahead of the consumer; an
    error raised in a worker is raised here and the units not started are dropped."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    workers = min(8, cores, len(units))
    if workers < 2 or len(units) < POOL_MIN_UNITS:
        yield from map(fn, units)
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        pending: deque[Any] = deque()
        todo = iter(units)
        with _main_hidden():  # the workers start here
            for unit in todo:
                pending.append(ex.submit(fn, unit))
                if len(pending) >= 2 * workers:
                    break
        while pending:
            result = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(ex.submit(fn, nxt))
            yield result
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def vocab_path(d: DataConfig, root: str) -> str | None:
    """The vocabulary file: ``data.vocab`` (inside ``data.root``), else the one
    ``*.word_count`` file of ``data.root``, else None (the train split's counts)."""
    if d.vocab is None:
        found = sorted(f for f in os.listdir(root) if f.endswith(".word_count"))
        if len(found) > 1:
            raise ConfigError("data.vocab", None, f"one word-count file named (data.root "
                                                  f"holds {len(found)}: {found[:3]})")
        if not found:
            return None
        path = os.path.join(root, found[0])
    else:
        path = os.path.join(root, d.vocab)
    if not resolves_inside(path, root) or not os.path.isfile(path):
        raise ConfigError("data.vocab", d.vocab or path, f"a regular file inside data.root "
                                                         f"({root})")
    return path


def one_file_in(root: str, keep: Callable[[str], bool], what: str) -> str:
    """The one file of the directory ``root`` that ``keep`` accepts by name (``what`` says
    which, e.g. ``*train*.h5``), a regular file resolving inside ``root``; otherwise a
    :class:`ConfigError` at ``data.root``."""
    found = sorted(f for f in os.listdir(root) if keep(f))
    if len(found) != 1:
        raise ConfigError("data.root", root, f"exactly one {what} file (found {len(found)})")
    path = os.path.join(root, found[0])
    if not resolves_inside(path, root) or not os.path.isfile(path):
        raise ConfigError("data.root", path, f"a regular file inside {root} (this one "
                                             f"resolves to {os.path.realpath(path)})")
    return path


def bad_file(path: str, what: str, rule: str) -> ConfigError:
    """The one error of a natural reader's file: ``data.root (<file>)``, the part of it at
    fault (``what``: the file, a client, a dataset) and the rule it breaks."""
    return ConfigError(f"data.root ({path})", what, rule)


def open_hdf5(path: str) -> Any:
    """``h5py.File(path, "r")``, or one :func:`bad_file` line when it is not a readable
    HDF5 file (truncated, another format)."""
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise bad_file(path, "the file", f"a readable HDF5 file "
                                         f"({' '.join(str(e).split())[:100]})") from None


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
