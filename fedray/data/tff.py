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
  above. The vocabulary is the first ``data.vocab_size`` words of a word-count file
  (TFF's ``stackoverflow.word_count``, most frequent first) or, without one, of the train
  split's own counts; it is stored in the population cache as the class names, its file's
  SHA-256 beside it (a file changed in place is refused, not silently read differently).

The users, the split and the cache are those of
:func:`fedray.data.leaf.natural_split_population`.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.spec import ConfigError
from fedray.data.leaf import MAX_CLASSES, SPLITS, Rows, natural_split_population
from fedray.data.population import TablePopulation

FEATURES = ("pixels", "image")
TEXT = ("snippets", "tokens")  # Shakespeare's and StackOverflow's text features
CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]"
              "!%)-159\r")  # TFF's char_prediction_preprocessing.CHAR_VOCAB, in its order
SEQ_LEN = {"snippets": 80, "tokens": 20}
IGNORE = -100  # a padded target (fedray.models.training.IGNORE)


def tff_files(root: str) -> dict[str, str]:
    """The train and test ``.h5`` files of ``root`` (one each, inside it)."""
    if not os.path.isdir(root):
        raise ConfigError("data.root", root, "a directory holding TFF's *train*.h5 and "
                                             "*test*.h5 files")
    out = {}
    for split in SPLITS:
        found = sorted(f for f in os.listdir(root) if f.endswith(".h5") and split in f)
        if len(found) != 1:
            raise ConfigError("data.root", root, f"exactly one *{split}*.h5 file (found "
                                                 f"{len(found)})")
        path = os.path.join(root, found[0])
        if not resolves_inside(path, root) or not os.path.isfile(path):
            raise ConfigError("data.root", path, f"a regular file inside {root} (this one "
                                                 f"resolves to {os.path.realpath(path)})")
        out[split] = path
    return out


def _images(x: np.ndarray) -> np.ndarray:
    """(N, H, W) → (N, 1, H, W); (N, H, W, C ≤ 4) → (N, C, H, W); uint8 → [0, 1] float32."""
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] <= 4 < x.shape[1]:
        x = np.transpose(x, (0, 3, 1, 2))
    scale = 1 / 255 if x.dtype == np.uint8 else 1.0
    return (x.astype(np.float32) * np.float32(scale)).astype(np.float32)


def _split_file(d: DataConfig, path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One file's clients as (x, y), every rule broken a :class:`ConfigError` naming the
    file and the client."""
    import h5py

    def bad(what: str, rule: str) -> ConfigError:
        return ConfigError(f"data.root ({path})", what, rule)

    try:
        fh = h5py.File(path, "r")
    except OSError as e:
        raise bad("the file", f"a readable HDF5 file ({' '.join(str(e).split())[:100]})"
                  ) from None
    out = {}
    with fh:
        group = fh.get("examples")
        if not isinstance(group, h5py.Group):
            raise bad("the file", "TFF's layout: an examples group of examples/<client>/"
                                  "<feature> datasets")
        for user in sorted(group):
            if not isinstance(group.get(user, getlink=True), h5py.HardLink):
                raise bad(f"client {user}", "groups stored in the file (an external or "
                                            "soft link would read elsewhere)")
            g = group[user]
            names = sorted(g) if isinstance(g, h5py.Group) else []
            feature = d.feature_columns[0] if d.feature_columns else next(
                (f for f in FEATURES + TEXT if f in names), None)
            text = feature in TEXT
            need = (feature,) if text else (feature, d.label_column)
            if any(n not in names for n in need):
                want = " and ".join(repr(n) for n in need) if feature else \
                    " or ".join(FEATURES + TEXT)
                raise bad(f"client {user}", f"datasets {want} (it has {names})")
            for name in need:
                ds = g[name] if isinstance(g.get(name, getlink=True), h5py.HardLink) else None
                if not isinstance(ds, h5py.Dataset) or ds.is_virtual or ds.external:
                    raise bad(f"client {user}", f"{name!r} a dataset stored in the file (not "
                                                f"a link, a virtual or an external dataset: "
                                                f"they read other files)")
            if text:
                try:
                    raw = g[feature][()]
                except OSError as e:
                    raise bad(f"client {user}", f"readable datasets ({str(e)[:80]})") from None
                if raw.ndim != 1 or raw.dtype.kind not in "OSU":
                    raise bad(f"client {user}", f"{feature!r} one string per example")
                out[user] = (raw, feature)
                continue
            try:
                x, y = g[feature][()], g[d.label_column][()]
            except OSError as e:
                raise bad(f"client {user}", f"readable datasets ({str(e)[:80]})") from None
            if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu" or x.ndim < 2 \
                    or y.ndim != 1:
                raise bad(f"client {user}", f"numeric {feature!r} examples and integer "
                                            f"{d.label_column!r} labels (text is read from "
                                            f"a feature named {' or '.join(TEXT)})")
            if len(x) != len(y):
                raise bad(f"client {user}", f"one label per example ({len(x)} examples, "
                                            f"{len(y)} labels)")
            if len(y) and (y.min() < 0 or y.max() >= MAX_CLASSES):
                raise bad(f"client {user}", f"labels in 0..{MAX_CLASSES - 1}")
            x = _images(x) if x.ndim >= 3 else x.astype(np.float32)
            if not np.isfinite(x).all():
                raise bad(f"client {user}", "finite inputs")
            out[user] = (x, y.astype(np.int64))
    return out


def build_tff(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The TFF dataset at ``data.root`` as a population (see the module docstring)."""
    root = os.path.abspath(d.root)
    files = tff_files(root)
    vocab_file = vocab_path(d, root)
    sha = file_sha256(vocab_file) if vocab_file else None

    def read() -> tuple[Rows, tuple[int, ...], list[str] | None]:
        raw = {split: _split_file(d, files[split]) for split in SPLITS}
        kinds = {y if isinstance(y, str) else "numeric" for split in SPLITS
                 for _, y in raw[split].values()}
        if len(kinds) > 1:
            raise ConfigError(f"data.root ({root})", "the clients", f"one feature for every "
                                                                    f"client (found "
                                                                    f"{sorted(kinds)})")
        if kinds and kinds <= set(TEXT):
            return _text_rows(d, raw, kinds.pop(), vocab_file)
        rows: Rows = {}
        shape: Any = None
        for split in SPLITS:
            for user, (x, y) in raw[split].items():
                if shape is None and len(x):
                    shape = tuple(int(s) for s in x.shape[1:])
                if len(x) and tuple(x.shape[1:]) != shape:
                    raise ConfigError(f"data.root ({files[split]})", f"client {user}",
                                      f"examples of the dataset's one shape {shape} (got "
                                      f"{tuple(x.shape[1:])})")
                rows.setdefault(user, {"train": [], "test": []})[split].append((x, y))
        return rows, shape or (1,), None

    pop = natural_split_population(
        d, num_clients, seed, "tff", [files[s] for s in SPLITS] + ([vocab_file] if vocab_file
                                                                   else []), read,
        "TFF's own train and test files per client",
        key_extra=[d.feature_columns, d.label_column, d.seq_len, d.vocab_size],
        extra_info={"vocab_file": os.path.basename(vocab_file), "vocab_sha256": sha}
        if vocab_file else None)
    if sha is not None and pop.info.get("vocab_sha256") != sha:
        raise ConfigError("data.vocab", vocab_file, f"the vocabulary file the cache entry "
                                                    f"{os.path.basename(pop.path)} was built "
                                                    f"with (SHA-256 {pop.info.get('vocab_sha256')}"
                                                    f", this file's {sha}); remove the entry "
                                                    f"to rebuild it")
    return pop


def vocab_path(d: DataConfig, root: str) -> str | None:
    """The word-count file: ``data.vocab`` (inside ``data.root``), else the one
    ``*.word_count`` file of ``data.root``, else None (counts of the train split)."""
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


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def _text_rows(d: DataConfig, raw: dict[str, dict[str, tuple[Any, str]]], feature: str,
               vocab_file: str | None) -> tuple[Rows, tuple[int, ...], list[str]]:
    """Every client's strings of ``feature`` as next-token rows (the module docstring), and
    the class names: the vocabulary with its special tokens."""
    steps = d.seq_len or SEQ_LEN[feature]
    if feature == "snippets":
        table = np.full(256, len(CHAR_VOCAB) + 1, np.int64)
        table[np.frombuffer(CHAR_VOCAB.encode(), np.uint8)] = np.arange(1, len(CHAR_VOCAB) + 1)
        names = ["<pad>", *CHAR_VOCAB, "<oov>", "<bos>", "<eos>"]

        def convert(strings: Any) -> tuple[np.ndarray, np.ndarray]:
            return char_rows(strings, table, steps)
    else:
        if vocab_file is not None:
            vocab = read_word_counts(vocab_file, d.vocab_size)
        else:
            counts: Counter[str] = Counter()
            for strings, _ in raw["train"].values():
                for sentence in strings:
                    counts.update(_text(sentence).split(" "))
            counts.pop("", None)
            vocab = [w for w, _ in counts.most_common(d.vocab_size)]
        index = {w: i + 1 for i, w in enumerate(vocab)}
        names = ["<pad>", *vocab, "<oov>", "<bos>", "<eos>"]

        def convert(strings: Any) -> tuple[np.ndarray, np.ndarray]:
            return word_rows(strings, index, steps)
    rows: Rows = {}
    for split in SPLITS:
        for user, (strings, _) in raw[split].items():
            rows.setdefault(user, {"train": [], "test": []})[split].append(convert(strings))
    return rows, (steps,), names


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


def word_rows(sentences: Any, index: dict[str, int], steps: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """TFF's StackOverflow rows of a client's sentences, one a sentence (see the module
    docstring); (inputs as floats, targets with padding ``IGNORE``)."""
    oov = len(index) + 1
    bos, eos = oov + 1, oov + 2
    out = np.zeros((len(sentences), steps + 1), np.int64)
    for i, sentence in enumerate(sentences):
        words = [w for w in _text(sentence).split(" ") if w][:steps]
        ids = [bos, *(index.get(w, oov) for w in words)]
        if len(words) < steps:
            ids.append(eos)
        out[i, :len(ids)] = ids
    return _shifted(out)


def _shifted(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = rows[:, :-1].astype(np.float32)
    y = rows[:, 1:].copy()
    y[y == 0] = IGNORE
    return x, y
