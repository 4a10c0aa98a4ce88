"""TensorFlow Federated's HDF5 client data (issue #31): ``data.dataset=tff`` reads the
``.h5`` files TFF's ``tff.simulation.datasets`` download (federated EMNIST's
``fed_emnist_train.h5`` / ``fed_emnist_test.h5``, CIFAR-100's ``fed_cifar100_*.h5``) with
``h5py`` — no TensorFlow — one client per TFF client id, with TFF's own train/test files.

Layout read (``data.root``): a directory holding exactly one ``*train*.h5`` and one
``*test*.h5``, each ``examples/<client id>/<feature>`` datasets with a leading example
axis. The label is ``data.label_column`` (default ``label``); the input is the one dataset
named in ``data.feature_columns`` (default: ``pixels``, else ``image``). Images are read as
(C, H, W): (N, H, W) gains a channel, (N, H, W, C) with C ≤ 4 is moved channels-first;
``uint8`` pixels are scaled to [0, 1] (EMNIST's float pixels stay as TFF stores them).

Text features become TFF's next-token tasks (``tff.simulation.baselines``), each example a
row of ``data.seq_len`` input ids (stored as floats, for ``next_char_lstm`` /
``word_lstm``) and as many next-token targets, a padded target ``-100`` (out of the loss
and every score, :func:`fedray.models.training.evaluate_tokens`):

- ``snippets`` (Shakespeare, ``char_prediction_preprocessing``): a snippet's bytes looked
  up in TFF's 86 characters (``CHAR_VOCAB``: ids 1..86, pad 0, any other byte the OOV id
  87, BOS 88, EOS 89), framed ``[BOS] ids [EOS]``, zero-padded to a multiple of
  ``seq_len + 1`` (80 + 1) and cut into rows of that length; input = a row but its last
  id, targets = a row but its first.
- ``tokens`` (StackOverflow, ``word_prediction_preprocessing``): a sentence split on
  spaces, its first ``seq_len`` (20) words looked up in the vocabulary (ids 1..V, any
  other word the OOV id V+1), EOS (V+3) appended when the sentence was shorter than
  ``seq_len``, BOS (V+2) put first, zero-padded to ``seq_len + 1``; input and targets as
  above (TFF splits on single spaces; fedray on any whitespace run, the same for TFF's
  tokenized text). The vocabulary is the first ``data.vocab_size`` words of a word-count
  file (TFF's ``stackoverflow.word_count``: a word and the number of train users whose text
  holds it, most frequent first) or, without one, of the same count over the train split
  (ties in sorted-client, first-seen order); it is stored in the population cache as the
  class names, its file's SHA-256 beside it (a file changed in place is refused, not
  silently read differently).

The users, the split and the cache are those of
:func:`fedray.data.natural.natural_split_population` (read in a pool of
processes when there are many clients).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.spec import ConfigError
from fedray.data.leaf import MAX_CLASSES
from fedray.data.natural import (
    SPLITS,
    Block,
    Natural,
    bad_file,
    file_sha256,
    natural_split_population,
    one_file_in,
    open_hdf5,
    ordered_map,
    vocab_path,
)
from fedray.data.population import TablePopulation

FEATURES = ("pixels", "image")
TEXT = ("snippets", "tokens")  # Shakespeare's and StackOverflow's text features
CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]"
              "!%)-159\r")  # TFF's char_prediction_preprocessing.CHAR_VOCAB, in its order
SEQ_LEN = {"snippets": 80, "tokens": 20}
IGNORE = -100  # a padded target (fedray.models.training.IGNORE)
UNIT_CLIENTS = 2_000  # clients read and converted as one work unit
MAX_CLIENT_BYTES = 1 << 30  # one client's dataset, as declared (a tiny file can declare TBs)
CHAR_TABLE = np.full(256, len(CHAR_VOCAB) + 1, np.int64)  # byte -> TFF's character id
CHAR_TABLE[np.frombuffer(CHAR_VOCAB.encode(), np.uint8)] = np.arange(1, len(CHAR_VOCAB) + 1)


def tff_files(root: str) -> dict[str, str]:
    """The train and test ``.h5`` files of ``root`` (one each, inside it)."""
    if not os.path.isdir(root):
        raise ConfigError("data.root", root, "a directory holding TFF's *train*.h5 and "
                                             "*test*.h5 files")
    return {split: one_file_in(root, lambda f, s=split: f.endswith(".h5") and s in f,
                               f"*{split}*.h5") for split in SPLITS}


def _images(x: np.ndarray) -> np.ndarray:
    """(N, H, W) → (N, 1, H, W); (N, H, W, C ≤ 4) → (N, C, H, W); uint8 → [0, 1] float32."""
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] <= 4 < x.shape[1]:
        x = np.transpose(x, (0, 3, 1, 2))
    scale = 1 / 255 if x.dtype == np.uint8 else 1.0
    return (x.astype(np.float32) * np.float32(scale)).astype(np.float32)


def _examples(path: str) -> tuple[Any, Any]:
    """The open file and its ``examples`` group's low-level id (h5py's low-level calls:
    its high-level objects cost ≈ 0.4 ms a client)."""
    fh = open_hdf5(path)
    from h5py import h5g, h5l

    links = fh.id.links
    try:
        hard = links.exists(b"examples") and links.get_info(b"examples").type == h5l.TYPE_HARD
        gid = h5g.open(fh.id, b"examples") if hard else None
    except (KeyError, ValueError, RuntimeError, OSError, TypeError):
        gid = None
    if gid is None:  # no group, or a link (an external one would read another file)
        fh.close()
        raise bad_file(path, "the file", "TFF's layout: an examples group stored in the file, of "
                                         "examples/<client>/<feature> datasets")
    return fh, gid


def _clients_of(path: str) -> list[str]:
    """The client ids of a file, each a group stored in it (an external or soft link
    would read elsewhere: refused)."""
    from h5py import h5l

    fh, gid = _examples(path)
    found: list[tuple[bytes, int]] = []
    with fh:
        gid.links.iterate(lambda name, info: found.append((name, info.type)), info=True)
    for name, kind in found:
        if kind != h5l.TYPE_HARD:
            raise bad_file(path, f"client {name.decode(errors='replace')}", "groups stored in the "
                           "file (an external or soft link would read elsewhere)")
        try:
            name.decode()
        except UnicodeDecodeError:
            raise bad_file(path, f"client {name.decode(errors='replace')}", "client ids in "
                                                                          "UTF-8") from None
    return [name.decode() for name, _ in found]


def _feature_of(d: DataConfig, path: str, user: str) -> str:
    """``data.feature_columns[0]``, else the first of FEATURES + TEXT the client has."""
    if d.feature_columns:
        return d.feature_columns[0]
    from h5py import h5g

    fh, gid = _examples(path)
    with fh:
        try:
            names = sorted(n.decode(errors="replace") for n in _names(h5g.open(
                gid, user.encode())))
        except (KeyError, ValueError, RuntimeError, OSError, TypeError):
            names = []
    found = next((f for f in FEATURES + TEXT if f in names), None)
    if found is None:
        raise bad_file(path, f"client {user}", f"a dataset {' or '.join(FEATURES + TEXT)} (it has "
                                               f"{names})")
    return found


def _client_raw(path: str, gid: Any, user: str, feature: str, label: str) -> Any:
    """A client's strings of a text ``feature``, or its checked (x, y); every rule broken a
    :class:`ConfigError` naming the file and the client."""
    import h5py
    from h5py import h5d, h5g, h5l, h5s, h5t

    text = feature in TEXT
    need = (feature,) if text else (feature, label)
    try:
        ug = h5g.open(gid, user.encode())
    except (KeyError, ValueError, OSError, TypeError):
        raise bad_file(path, f"client {user}", "a group of datasets") from None
    sets = []
    for name in need:
        key = name.encode()
        try:
            link = ug.links.get_info(key).type
        except (KeyError, RuntimeError):  # no such link
            names = sorted(n.decode() for n in _names(ug))
            raise bad_file(path, f"client {user}", f"datasets {' and '.join(map(repr, need))} (it "
                                                   f"has {names})") from None
        if link != h5l.TYPE_HARD:
            raise bad_file(path, f"client {user}", f"{name!r} a dataset stored in the file (not a "
                                                   f"link: it would read elsewhere)")
        try:
            ds = h5d.open(ug, key)
        except (KeyError, ValueError, OSError, TypeError):
            raise bad_file(path, f"client {user}", f"{name!r} a dataset") from None
        space = ds.get_space()
        if space.get_simple_extent_type() != h5s.SIMPLE or \
                space.get_simple_extent_npoints() * ds.get_type().get_size() > MAX_CLIENT_BYTES:
            raise bad_file(path, f"client {user}", f"{name!r} an array of at most "
                                                   f"{MAX_CLIENT_BYTES >> 30} GiB")
        if ds.get_offset() is None:  # not one contiguous block of this file: ask why
            plist = ds.get_create_plist()
            if plist.get_layout() == h5d.VIRTUAL or plist.get_external_count():
                raise bad_file(path, f"client {user}", f"{name!r} stored in the file (not a "
                                                       f"virtual or an external dataset: they "
                                                       f"read other files)")
        sets.append(ds)
    try:
        if text:
            ds, kind, space = sets[0], sets[0].get_type(), sets[0].get_space()
            if kind.get_class() != h5t.STRING or space.get_simple_extent_ndims() != 1:
                raise bad_file(path, f"client {user}", f"{feature!r} one string per example")
            if kind.is_variable_str():  # TFF's; read without h5py's objects
                raw = np.empty(space.shape, dtype=h5py.string_dtype())
                ds.read(h5s.ALL, h5s.ALL, raw)
                return raw
            return h5py.Dataset(ds)[()]
        x, y = (h5py.Dataset(ds)[()] for ds in sets)
    except OSError as e:
        raise bad_file(path, f"client {user}", f"readable datasets ({str(e)[:80]})") from None
    return _numeric(lambda what, rule: bad_file(path, what, rule), user, feature, label, x, y)


def _names(gid: Any) -> list[bytes]:
    found: list[bytes] = []
    gid.links.iterate(found.append)
    return found


@dataclass
class _Unit:
    """Clients of one work unit: their ids, which of them each file holds, and how to
    convert them (``vocab`` the word list of StackOverflow's tokens)."""

    d: DataConfig
    files: dict[str, str]
    users: list[str]
    held: list[tuple[bool, bool]]
    feature: str
    vocab: list[str] | None = None


def _read_unit(unit: _Unit) -> dict[str, dict[str, Any]]:
    """Every client of ``unit`` as read from each file that holds it."""
    out: dict[str, dict[str, Any]] = {u: {} for u in unit.users}
    for i, split in enumerate(SPLITS):
        fh, gid = _examples(unit.files[split])
        with fh:
            for user, held in zip(unit.users, unit.held, strict=True):
                if held[i]:
                    out[user][split] = _client_raw(unit.files[split], gid, user,
                                                   unit.feature, unit.d.label_column)
    return out


def _unit_rows(unit: _Unit) -> Block:
    """A unit's clients as one block of rows (the module docstring): numeric (x, y) as
    read, text converted (StackOverflow's sentences of the whole unit at once)."""
    raw = _read_unit(unit)
    order = [(u, s) for u in unit.users for s in SPLITS if s in raw[u]]
    steps = unit.d.seq_len or SEQ_LEN.get(unit.feature, 0)
    if unit.feature == "tokens":
        index = {w: i + 1 for i, w in enumerate(unit.vocab or [])}
        x, y = word_rows([_text(t) for u, s in order for t in raw[u][s]], index, steps)
        counts = {(u, s): len(raw[u][s]) for u, s in order}
    else:
        parts = {(u, s): char_rows(raw[u][s], CHAR_TABLE, steps)
                 if unit.feature == "snippets" else raw[u][s] for u, s in order}
        shapes = {k: tuple(v[0].shape[1:]) for k, v in parts.items() if len(v[1])}
        for (u, _), got in shapes.items():
            if got != next(iter(shapes.values())):
                raise bad_file(os.path.dirname(unit.files['train']), f"client {u}",
                               f"examples of the dataset's one shape "
                               f"{next(iter(shapes.values()))} (got {got})")
        kept = [v for v in parts.values() if len(v[1])]
        x = np.concatenate([v[0] for v in kept]) if kept else np.zeros((0, 1), np.float32)
        y = np.concatenate([v[1] for v in kept]) if kept else np.zeros(0, np.int64)
        counts = {k: len(v[1]) for k, v in parts.items()}
    return Block(unit.users, *(np.array([counts.get((u, s), 0) for u in unit.users], np.int64)
                               for s in SPLITS), x, y)


def _unit_counts(unit: _Unit) -> Counter[str]:
    """TFF's word counts over a unit's train clients: the clients whose text holds each
    word (first-seen order within the unit)."""
    counts: Counter[str] = Counter()
    for got in _read_unit(unit).values():
        if "train" in got:
            counts.update(dict.fromkeys(w for t in got["train"] for w in _text(t).split()).keys())
    return counts


def _numeric(bad: Any, user: str, feature: str, label: str, x: np.ndarray, y: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """A client's numeric examples and labels, checked; images channels-first in [0, 1]."""
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu" or x.ndim < 2 or y.ndim != 1:
        raise bad(f"client {user}", f"numeric {feature!r} examples and integer {label!r} "
                                    f"labels (text is read from a feature named "
                                    f"{' or '.join(TEXT)})")
    if len(x) != len(y):
        raise bad(f"client {user}", f"one label per example ({len(x)} examples, {len(y)} "
                                    f"labels)")
    if len(y) and (y.min() < 0 or y.max() >= MAX_CLASSES):
        raise bad(f"client {user}", f"labels in 0..{MAX_CLASSES - 1}")
    x = _images(x) if x.ndim >= 3 else x.astype(np.float32)
    if not np.isfinite(x).all():
        raise bad(f"client {user}", "finite inputs")
    return x, y.astype(np.int64)


def build_tff(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The TFF dataset at ``data.root`` as a population (see the module docstring)."""
    root = os.path.abspath(d.root)
    files = tff_files(root)
    vocab_file = vocab_path(d, root)
    sha = file_sha256(vocab_file) if vocab_file else None

    def read(scratch: str) -> Natural:
        held = {split: set(_clients_of(files[split])) for split in SPLITS}
        users = sorted(held["train"] | held["test"])
        first = min(held["train"]) if held["train"] else (users[0] if users else None)
        feature = _feature_of(d, files["train" if held["train"] else "test"], first) \
            if first is not None else "pixels"
        units = [_Unit(d, files, part, [(u in held["train"], u in held["test"]) for u in part],
                       feature) for part in _chunks(users)]
        names: list[str] | None = None
        if feature == "tokens":
            vocab = read_word_counts(vocab_file, d.vocab_size) if vocab_file else \
                _counted_vocab(units, d.vocab_size)
            for unit in units:
                unit.vocab = vocab
            names = ["<pad>", *vocab, "<oov>", "<bos>", "<eos>"]
        elif feature == "snippets":
            names = ["<pad>", *CHAR_VOCAB, "<oov>", "<bos>", "<eos>"]
        shape: list[Any] = [(d.seq_len or SEQ_LEN[feature],) if names else None]

        def blocks() -> Generator[Block, None, None]:
            for block in ordered_map(_unit_rows, units):
                if names is None and len(block.y):
                    got = tuple(int(s) for s in block.x.shape[1:])
                    shape[0] = shape[0] or got
                    if got != shape[0]:
                        first = block.users[int(np.flatnonzero(block.n_train + block.n_test)[0])]
                        raise bad_file(root, f"client {first}",
                                       f"examples of the dataset's one shape {shape[0]} "
                                       f"(got {got})")
                yield block

        return Natural(blocks(), lambda: shape[0] or (1,), lambda: names)

    pop = natural_split_population(
        d, num_clients, seed, "tff", [files[s] for s in SPLITS] + ([vocab_file] if vocab_file
                                                                   else []), read,
        "TFF's own train and test files per client",
        key_extra=[d.feature_columns, d.label_column, d.seq_len, d.vocab_size],
        extra_info={"vocab_file": os.path.basename(vocab_file), "vocab_sha256": sha}
        if vocab_file else None)
    return pop


def _chunks(users: list[str]) -> list[list[str]]:
    """Work units of :data:`UNIT_CLIENTS` clients (a fixed size, so the entry's record
    batches are the same on every machine)."""
    return [users[i:i + UNIT_CLIENTS] for i in range(0, len(users), UNIT_CLIENTS)]


def _counted_vocab(units: list[_Unit], size: int) -> list[str]:
    """The first ``size`` words of TFF's count over the train split (ties in sorted-client,
    first-seen order)."""
    counts: Counter[str] = Counter()
    for part in ordered_map(_unit_counts, units):
        counts.update(part)
    return [w for w, _ in counts.most_common(size)]


def read_word_counts(path: str, size: int) -> list[str]:
    """The first ``size`` words of a word-count file (one ``word count`` a line, as TFF's
    ``load_word_counts`` reads ``stackoverflow.word_count``); a malformed line is one error
    naming the file and the line."""
    words: list[str] = []
    seen: set[str] = set()
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise ConfigError(f"data.vocab ({path})", f"line {n}", "'word count': a word, "
                                                                       "a space, an integer")
            word = parts[0].decode("utf-8", "replace")
            if word in seen:
                raise ConfigError(f"data.vocab ({path})", f"line {n}",
                                  f"each word once ({word!r} repeats)")
            seen.add(word)
            words.append(word)
            if len(words) == size:
                break
    if not words:
        raise ConfigError(f"data.vocab ({path})", "the file", "at least one 'word count' line")
    return words


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def char_rows(snippets: Any, table: np.ndarray, steps: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """TFF's Shakespeare rows of a client's snippets: each snippet's bytes looked up in
    ``table`` (byte → id), framed by BOS and EOS, zero-padded to a multiple of ``steps``
    + 1 and cut into rows; (inputs as floats, targets with padding ``IGNORE``)."""
    bos, eos = len(CHAR_VOCAB) + 2, len(CHAR_VOCAB) + 3
    width = steps + 1
    chunks = []
    for snippet in snippets:
        b = snippet if isinstance(snippet, bytes) else str(snippet).encode()
        ids = np.concatenate(([bos], table[np.frombuffer(b, np.uint8)], [eos]))
        chunks.append(np.pad(ids, (0, -len(ids) % width)).reshape(-1, width))
    return _shifted(np.concatenate(chunks) if chunks else np.zeros((0, width), np.int64))


def word_rows(sentences: list[str], index: dict[str, int], steps: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """TFF's StackOverflow rows of ``sentences``, one a sentence (its words split on
    whitespace; see the module docstring); (inputs as floats, targets with padding
    ``IGNORE``)."""
    oov = len(index) + 1
    bos, eos = oov + 1, oov + 2
    words = [t.split()[:steps] for t in sentences]
    lens = np.fromiter(map(len, words), np.int64, len(words))
    get = index.get
    ids = np.fromiter((get(w, oov) for ws in words for w in ws), np.int64, int(lens.sum()))
    out = np.zeros((len(words), steps + 1), np.int64)
    out[:, 0] = bos
    out[:, 1:][np.arange(steps)[None, :] < lens[:, None]] = ids
    short = np.flatnonzero(lens < steps)
    out[short, lens[short] + 1] = eos
    return _shifted(out)


def _shifted(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = rows[:, :-1].astype(np.float32)
    y = rows[:, 1:].copy()
    y[y == 0] = IGNORE
    return x, y
