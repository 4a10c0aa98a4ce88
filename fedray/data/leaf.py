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

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.spec import ConfigError, short_repr
from fedray.data.natural import SPLITS, Block, Natural, natural_split_population, ordered_map
from fedray.data.population import TablePopulation

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


def build_leaf(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The LEAF dataset at ``data.root`` as a population (see the module docstring)."""
    files = leaf_files(os.path.abspath(d.root))
    shards = [f for s in SPLITS for f in files[s]]

    def read(scratch: str) -> Natural:
        os.makedirs(scratch)
        index: dict[str, dict[str, list[tuple[int, int, int]]]] = {}
        width, text, top = None, False, 0
        units = [(k, f, os.path.join(scratch, f"{k}.bin")) for k, f in enumerate(shards)]
        for k, users in enumerate(ordered_map(_spool_shard, units)):
            for user, n, w, is_text, at, most in users:
                text, top = text or is_text, max(top, most)
                if n and width is None:
                    width = w
                if n and w != width:
                    raise _bad(shards[k], f"user {user}", f"x vectors of the dataset's one "
                                                          f"length {width} (got {w})")
                split = "train" if k < len(files["train"]) else "test"
                index.setdefault(user, {"train": [], "test": []})[split].append((k, at, n))

        def blocks() -> Iterator[Block]:
            for user in sorted(index):
                parts = [[_unspool(units[k][2], at, n, width or 1) for k, at, n in
                          index[user][split]] for split in SPLITS]
                yield Block.of(user, parts[0], parts[1], (int(width or 1),))

        def shape() -> tuple[int, ...]:
            return (int(width or 1),) if text else input_shape_of(int(width or 1))

        # the letters' classes (and the extra one when a letter fell outside)
        return Natural(blocks(), shape, lambda: len(LETTERS) + (top >= len(LETTERS))
                       if text else None)

    return natural_split_population(d, num_clients, seed, "leaf", shards, read,
                                    "LEAF's own train/ and test/ per user")


def _spool_shard(unit: tuple[int, str, str]) -> list[tuple[str, int, int, bool, int, int]]:
    """One shard parsed and checked (:func:`_shard`), its users' rows appended to the file
    ``unit[2]`` (x float32, then y int64); per user (id, rows, width, text, byte offset,
    the largest id for text)."""
    _, path, out = unit
    found = []
    with open(out, "wb") as fh:
        for user, (x, y, is_text) in _shard(path).items():
            at = fh.tell()
            fh.write(x.tobytes())
            fh.write(y.tobytes())
            most = int(max(x.max(initial=0), y.max(initial=0))) if is_text else 0
            found.append((user, len(y), int(x.shape[1]) if x.ndim == 2 else 0, is_text,
                          at, most))
    return found


def _unspool(path: str, at: int, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.fromfile(path, np.float32, n * width, offset=at).reshape(n, width)
    y = np.fromfile(path, np.int64, n, offset=at + x.nbytes)
    return x, y
