"""LEAF's JSON format (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018):
``data.dataset=leaf`` reads a LEAF dataset directory as LEAF's own scripts write it, one
client per LEAF user, with LEAF's own per-user train/test split.

Layout read (``data.root``): ``train/*.json`` and ``test/*.json`` (LEAF's ``data/train`` and
``data/test`` after ``preprocess.sh``; any number of shards), each file one object::

    {"users": ["f0000_14", ...], "num_samples": [153, ...],
     "user_data": {"f0000_14": {"x": [[0.0, 1.0, ...], ...], "y": [7, ...]}, ...}}

Every user's ``x`` is a list of equal-length numeric vectors and ``y`` a list of integer
labels (FEMNIST: 784 floats in [0, 1] per 28×28 image, 62 classes). A vector length that is
a perfect square d = s² is read as one s×s grey image (input shape (1, s, s), for the CNNs);
any other length as a flat vector. Shakespeare's text — ``x`` an 80-character string, ``y``
the next character — is read as LEAF's own ``language_utils`` reads it: each character its
index in LEAF's 80 letters (``LETTERS``), stored as one float per step (input shape (80,),
for ``model.name=char_lstm``), the label the next character's index; a character outside
the 80 gets the one extra class 80 (LEAF's ``letter_to_index`` gives it −1, a zero one-hot).
Sent140's records (lists of tweet fields) are refused with a clear error: its tokenizer and
embeddings are not here yet.

A user's rows are its rows of every train shard then of every test shard (shards in sorted
file-name order); the users kept are the first ``clients.num_clients`` in sorted user-id
order among those with at least ``data.min_samples`` rows (train + test), so client ``c``
is the same user in both splits (the failure mode of Flower Datasets #5243). Labels are
LEAF's integers as they are (classes 0..the largest label of any user). The global test
set is up to 10,000 rows drawn from the kept users' test rows (seeded). The converted rows go to the
memory-mapped population cache of :class:`fedray.data.population.TablePopulation`, keyed by
the files (path, size, modification time), ``clients.num_clients``, ``data.min_samples`` and
the seed; a second run maps the cache without reading JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, redact, short_repr
from fedray.data.population import (
    GLOBAL_TEST_MAX,
    TablePopulation,
    _cache_root,
    _remove_stale_temps,
    write_cache_entry,
)

SPLITS = ("train", "test")
MAX_CLASSES = 1 << 20  # a label beyond this is not a class id (and would size the classes)
LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
_INDEX = {ch: i for i, ch in enumerate(LETTERS)}


def letter_ids(text: str) -> list[int]:
    """LEAF's letter indices of ``text`` (a character outside LETTERS: len(LETTERS))."""
    return [_INDEX.get(ch, len(LETTERS)) for ch in text]


def leaf_files(root: str) -> dict[str, list[str]]:
    """The JSON shards of ``root``'s ``train/`` and ``test/`` folders, each inside
    ``root`` once links are resolved (a planted link out of it is refused)."""
    if not os.path.isdir(root):
        raise ConfigError("data.root", root, "a LEAF dataset directory holding train/ and "
                                             "test/ folders of JSON shards")
    out = {}
    for split in SPLITS:
        folder = os.path.join(root, split)
        if not os.path.isdir(folder):
            raise ConfigError("data.root", root, f"a LEAF dataset directory with a {split}/ "
                                                 f"folder of JSON shards")
        files = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                       if f.endswith(".json"))
        if not files:
            raise ConfigError("data.root", folder, "a folder holding LEAF .json shards")
        for path in files:
            if not resolves_inside(path, root) or not os.path.isfile(path):
                raise ConfigError("data.root", path, f"a regular file inside {root} (this "
                                                     f"one resolves to "
                                                     f"{os.path.realpath(path)})")
        out[split] = files
    return out


def _shard(path: str) -> dict[str, tuple[np.ndarray, np.ndarray, bool]]:
    """One shard's users as (x float32 (n, d), y int64 (n,), whether x was text), checked:
    every rule broken is a :class:`ConfigError` naming the file and the user."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(path, "the file", f"a LEAF JSON shard (it does not parse: "
                                             f"{type(e).__name__})") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples",
                                                               "user_data")):
        raise _bad(path, "the file", "a LEAF JSON object with users, num_samples "
                                             "and user_data")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or \
            not isinstance(data, dict) or len(users) != len(counts):
        raise _bad(path, "the file", "users and num_samples lists of one length and "
                                             "a user_data object")
    out = {}
    for user, n in zip(users, counts, strict=True):
        where = f"user {user}"
        if not isinstance(user, str) or user not in data or not isinstance(data[user], dict):
            raise _bad(path, where, "a user listed in users with its entry in "
                                                  "user_data")
        x, y = data[user].get("x"), data[user].get("y")
        if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
            raise _bad(path, where, f"x and y lists of one length (x: "
                                                  f"{_len(x)}, y: {_len(y)})")
        if len(x) != n:
            raise _bad(path, where, f"num_samples = the length of its x and y "
                                                  f"(num_samples {short_repr(n)}, x {len(x)})")
        text = bool(x) and isinstance(x[0], str)
        if text:  # Shakespeare: a string and its next character
            if not all(isinstance(s, str) and len(s) == len(x[0]) for s in x) or not all(
                    isinstance(c, str) and len(c) == 1 for c in y):
                raise _bad(path, where, "Shakespeare's text: x strings of one length, y "
                                        "single characters")
            x, y = [letter_ids(s) for s in x], [letter_ids(c)[0] for c in y]
        elif x and isinstance(x[0], list) and x[0] and isinstance(x[0][0], str):
            raise _bad(path, where, "numeric x vectors or Shakespeare's strings (Sent140's "
                                    "tweet records are not read yet)")
        try:
            xa = np.asarray(x, dtype=np.float32)
            ya = np.asarray(y, dtype=np.float64)
        except (ValueError, TypeError):
            raise _bad(path, where, "x: equal-length lists of numbers; y: "
                                                  "integer labels") from None
        if xa.ndim != 2 or ya.ndim != 1 or not np.isfinite(xa).all() or \
                not (ya == np.round(ya)).all() or ((ya < 0) | (ya >= MAX_CLASSES)).any():
            raise _bad(path, where, f"x: equal-length lists of finite numbers; y: integer "
                                    f"labels in 0..{MAX_CLASSES - 1}")
        if user in out:
            raise _bad(path, where, "each user once per shard")
        out[user] = (xa, ya.astype(np.int64), text)
    return out


def _bad(path: str, what: str, rule: str) -> ConfigError:
    """An error naming the shard (in full), what in it breaks the rule, and the rule."""
    return ConfigError(f"data.root ({path})", what, rule)


def _len(v: Any) -> str:
    return str(len(v)) if isinstance(v, list) else type(v).__name__


def input_shape_of(d: int) -> tuple[int, ...]:
    """A vector of length s² is one s×s grey image; any other length stays flat."""
    s = math.isqrt(d)
    return (1, s, s) if s * s == d and s > 1 else (d,)


Rows = dict[str, dict[str, list[tuple[np.ndarray, np.ndarray]]]]


def build_leaf(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The LEAF dataset at ``data.root`` as a population (see the module docstring)."""
    files = leaf_files(os.path.abspath(d.root))

    def read() -> tuple[Rows, tuple[int, ...], int | None]:
        rows: Rows = {}
        width, text = None, False
        for split in SPLITS:
            for f in files[split]:
                for user, (x, y, is_text) in _shard(f).items():
                    text |= is_text
                    if len(x) and width is None:
                        width = x.shape[1]
                    if len(x) and x.shape[1] != width:
                        raise _bad(f, f"user {user}", f"x vectors of the dataset's one length "
                                                      f"{width} (got {x.shape[1]})")
                    rows.setdefault(user, {"train": [], "test": []})[split].append((x, y))
        if text:  # the letters' classes (and the extra one when a letter fell outside)
            top = max(int(max(x.max(initial=0), y.max(initial=0))) for r in rows.values()
                      for s in SPLITS for x, y in r[s])
            return rows, (int(width or 1),), len(LETTERS) + (top >= len(LETTERS))
        return rows, input_shape_of(int(width or 1)), None

    return natural_split_population(d, num_clients, seed, "leaf",
                                    [f for s in SPLITS for f in files[s]], read,
                                    "LEAF's own train/ and test/ per user")


def natural_split_population(d: DataConfig, num_clients: int, seed: int, kind: str,
                             files: list[str], read: Any, split_note: str,
                             key_extra: list[Any] | None = None,
                             extra_info: dict[str, Any] | None = None) -> TablePopulation:
    """A dataset that comes split by natural client and by train/test (LEAF, TFF): the
    cache entry keyed by ``files`` (path, size, modification time), ``clients.num_clients``,
    ``data.min_samples``, the seed and ``key_extra`` (the reader's own settings), else
    ``read()`` → ({user: {"train": [(x, y), ...], "test": [...]}}, input shape, class count,
    class names (a vocabulary) or None) converted into it: the first
    ``clients.num_clients`` users in sorted id order with at least ``data.min_samples``
    rows, each user's train rows then its test rows,
    classes 0..the largest label (unless ``read`` says), the global test set up to 10,000
    of the kept users' test rows (seeded)."""
    stat = [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]
    key = hashlib.sha256(json.dumps([kind, stat, d.min_samples, num_clients, seed,
                                     key_extra or []]).encode()).hexdigest()[:32]
    folder = os.path.join(_cache_root(d), "populations")
    _remove_stale_temps(folder)
    path, index_path = (os.path.join(folder, key + ext) for ext in (".arrow", ".index.npz"))
    if all(os.path.isfile(p) and resolves_inside(p, folder) for p in (path, index_path)):
        try:
            return TablePopulation._from_cache(path, index_path)
        except (ValueError, KeyError, IndexError, TypeError, OSError):
            pass  # a damaged cache entry is rebuilt
    rows, shape, num_classes = read()
    sizes = {u: sum(len(x) for s in SPLITS for x, _ in r[s]) for u, r in rows.items()}
    eligible = [u for u in sorted(rows) if sizes[u] >= d.min_samples]
    if len(eligible) < num_clients:
        raise ConfigError("clients.num_clients", num_clients,
                          f"at most the {len(eligible)} users of {d.root} with >= "
                          f"{d.min_samples} samples (data.min_samples)")
    keep = eligible[:num_clients]
    xs, ys, offsets, split_at = [], [], [0], []
    for u in keep:
        for split in SPLITS:
            for x, y in rows[u][split]:
                xs.append(x.reshape(len(x), -1))
                ys.append(y)
            if split == "train":
                split_at.append(offsets[-1] + sum(len(x) for x, _ in rows[u]["train"]))
        offsets.append(offsets[-1] + sizes[u])
    x, y = np.concatenate(xs), np.concatenate(ys)
    offsets_a, split_a = np.asarray(offsets, np.int64), np.asarray(split_at, np.int64)
    test_rows = np.concatenate([np.arange(a, b) for a, b in zip(split_a, offsets_a[1:],
                                                                   strict=True)])
    pick = np.sort(rng(seed, -1, -1, "population-global-test").choice(
        test_rows, min(GLOBAL_TEST_MAX, len(test_rows)), replace=False))
    if isinstance(num_classes, list):
        names = num_classes
    else:
        names = [str(c) for c in range(num_classes or 1 + max(
            int(y.max()) for r in rows.values() for s in SPLITS for _, y in r[s] if len(y)))]
    info = {"source": redact(d.root), "dataset": kind, "rows": int(len(y)),
            "ids_total": len(rows), "ids_too_small": len(rows) - len(eligible),
            "classes": names, "input_shape": list(shape), "split": split_note,
            **(extra_info or {})}
    return write_cache_entry(path, index_path, x, y, offsets_a, split_a,
                             np.asarray(keep).astype(str), x[pick], y[pick], info)
