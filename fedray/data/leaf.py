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
CelebA's ``x`` names images (LEAF's ``metadata_to_json.py``: one client per celebrity, ``y``
1.0 when "Smiling"), read from ``data.root/raw/img_align_celeba`` as LEAF's model reads them
(:func:`celeba_rows`: resized to 84×84, RGB; here channels-first in [0, 1]).
Sent140's records (``x`` a list of tweet records [id, date, query, user, text, split tag],
``y`` 1 for a positive tweet, as LEAF's ``data_to_json.py`` writes them) are read as LEAF's
stacked-LSTM model reads them: the text (field 4) split by ``split_line`` (runs of word
characters and apostrophes, and each of . , ! ? ;; no lowercasing), its first
``data.seq_len`` (25) tokens looked up in the vocabulary (ids 0..V-1), any other word and
the right padding the one id V (LEAF has no pad id), one float per step (input shape (25,),
for ``model.name=sent140_lstm``). The vocabulary is the first ``data.vocab_size`` words of
``data.vocab`` — LEAF's ``embs.json`` (GloVe's words; LEAF's exact ids with
``data.vocab_size=400000``), GloVe's ``.txt`` or a word-count file — or, without one, of
the train split's token counts (ties in shard, then first-seen order), since GloVe cannot
be shipped; it is stored in the cache entry's info (``vocabulary``, ``unknown_id``) with
the file's SHA-256.

A user's rows are its rows of every train shard then of every test shard (shards in sorted
file-name order); the users kept are the first ``clients.num_clients`` in sorted user-id
order among those with at least ``data.min_samples`` rows (train + test), so client ``c``
is the same user in both splits (the failure mode of Flower Datasets #5243). Labels are
LEAF's integers as they are (classes 0..the largest label of any user). The global test
set is up to 10,000 rows drawn from the kept users' test rows (seeded). The shards are
parsed in a pool of processes, one shard a task, their rows spooled to disk and written to
the memory-mapped population cache in sorted user order
(:func:`fedray.data.natural.natural_split_population`), keyed by the files (path, size,
modification time), ``clients.num_clients``, ``data.min_samples``, the seed and the
vocabulary settings; a second run maps the cache without reading JSON. FEMNIST's pixel
arrays are parsed by Arrow's CSV reader, not into Python floats (:func:`_parsed`).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.spec import ConfigError, short_repr
from fedray.data.natural import (
    SPLITS,
    Block,
    Natural,
    bad_file,
    file_sha256,
    natural_split_population,
    ordered_map,
    vocab_path,
)
from fedray.data.population import TablePopulation

MAX_CLASSES = 1 << 20  # a label beyond this is not a class id (and would size the classes)
CELEBA_IMAGES = ("raw", "img_align_celeba")  # LEAF's image folder, beside train/ and test/
CELEBA_SIZE = 84  # LEAF's IMAGE_SIZE
SENT140_TEXT = 4  # the text's place in a Sent140 record (LEAF's models read e[4])
SENT140_WORDS = 25  # LEAF's max_words
_WORD = re.compile(r"[\w']+|[.,!?;]")
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


def _shard(path: str, index: dict[str, int] | None = None, steps: int = SENT140_WORDS,
           images: str | None = None) -> dict[str, tuple[Any, np.ndarray, str]]:
    """One shard's users (:func:`_users`) as a dict."""
    return {user: rows for user, rows in _users(path, index, steps, images)}


def _users(path: str, index: dict[str, int] | None, steps: int, images: str | None
           ) -> Iterator[tuple[str, tuple[Any, np.ndarray, str]]]:
    """One shard's users, one at a time, as (user, (x, y int64 (n,), kind)), checked: every
    rule broken is a :class:`ConfigError` naming the file and the user. ``kind`` is
    ``numeric`` (x float32 (n, d)), ``letters`` (Shakespeare: x its letter ids, float32
    (n, 80)), ``words`` (Sent140: x the tweets' texts as a list of strings, or with a
    vocabulary ``index`` its rows of ``steps`` word ids, :func:`sent140_rows`) or
    ``images`` (CelebA: x the named images of the folder ``images``, :func:`celeba_rows`)."""
    try:
        with open(path, "rb") as fh:
            doc, nonce, arrays = _parsed(fh.read())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise bad_file(path, "the file", f"a LEAF JSON shard (it does not parse: "
                                         f"{type(e).__name__})") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples",
                                                               "user_data")):
        raise bad_file(path, "the file", "a LEAF JSON object with users, num_samples and "
                                         "user_data")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or \
            not isinstance(data, dict) or len(users) != len(counts):
        raise bad_file(path, "the file", "users and num_samples lists of one length and a "
                                         "user_data object")
    seen: set[str] = set()
    for user, n in zip(users, counts, strict=True):
        where = f"user {user}"
        if not isinstance(user, str) or user not in data or not isinstance(data[user], dict):
            raise bad_file(path, where, "a user listed in users with its entry in user_data")
        if user in seen:
            raise bad_file(path, where, "each user once per shard")
        seen.add(user)
        x, y = data[user].get("x"), data[user].get("y")
        if isinstance(x, dict) and nonce is not None:  # numeric rows read by _parsed
            i = x.get(nonce)
            x = arrays[i] if type(i) is int and 0 <= i < len(arrays) else None
        if not isinstance(x, list | np.ndarray) or not isinstance(y, list) or len(x) != len(y):
            raise bad_file(path, where, f"x and y lists of one length (x: {_len(x)}, y: "
                                        f"{_len(y)})")
        if len(x) != n:
            raise bad_file(path, where, f"num_samples = the length of its x and y (num_samples "
                                        f"{short_repr(n)}, x {len(x)})")
        yield user, _rows(path, where, x, y, index, steps, images)


def _rows(path: str, where: str, x: Any, y: list, index: dict[str, int] | None, steps: int,
          images: str | None) -> tuple[Any, np.ndarray, str]:
    """One user's (x, y, kind) of :func:`_users` from its JSON ``x`` and ``y``."""
    if isinstance(x, np.ndarray):  # numeric rows read by _parsed: checked below
        kind = "numeric"
    elif not x:  # a user without rows in this split
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64), "numeric"
    elif isinstance(x[0], str):  # Shakespeare's strings, or CelebA's image names
        kind = "letters" if all(isinstance(c, str) and len(c) == 1 for c in y) else "images"
    else:
        kind = "words" if isinstance(x[0], list) and x[0] and isinstance(x[0][0], str) \
            else "numeric"
    texts = None
    if kind == "letters":  # Shakespeare: a string and its next character
        if not all(isinstance(s, str) and len(s) == len(x[0]) for s in x):
            raise bad_file(path, where, "Shakespeare's text: x strings of one length, y single "
                                        "characters")
        x, y = [letter_ids(s) for s in x], [letter_ids(c)[0] for c in y]
    elif kind == "images":  # CelebA: image file names and their labels
        x = celeba_rows(path, where, x, images)
    elif kind == "words":  # Sent140: tweet records [id, date, query, user, text, ...]
        if not all(isinstance(r, list) and len(r) > SENT140_TEXT and
                   isinstance(r[SENT140_TEXT], str) for r in x):
            raise bad_file(path, where, "Sent140's tweet records: lists [id, date, query, user, "
                                        "text, ...] with the text a string")
        texts = [r[SENT140_TEXT] for r in x]
        x = sent140_rows(texts, index, steps) if index is not None else \
            np.zeros((len(texts), 1), np.float32)
    try:
        xa = np.asarray(x, dtype=np.float32)
        ya = np.asarray(y, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        raise bad_file(path, where, "x: equal-length lists of numbers; y: integer labels"
                       ) from None
    if xa.ndim != 2 or ya.ndim != 1 or xa.shape[1] == 0 or not np.isfinite(xa).all() or \
            not (ya == np.round(ya)).all() or ((ya < 0) | (ya >= MAX_CLASSES)).any():
        raise bad_file(path, where, f"x: equal-length, non-empty lists of finite numbers; y: "
                                    f"integer labels in 0..{MAX_CLASSES - 1}")
    return (texts if texts is not None and index is None else xa), ya.astype(np.int64), kind


def celeba_rows(path: str, where: str, names: list, images: str | None) -> np.ndarray:
    """LEAF's CelebA images (``models/celeba/cnn.py``: ``Image.open``, resized to 84×84,
    RGB) of one user, by file name in ``images`` (LEAF's ``data/raw/img_align_celeba``,
    here ``data.root/raw/img_align_celeba``); float32 rows of (3, 84, 84) scaled to [0, 1]
    (LEAF feeds 0..255 to a network that starts with batch norm). A name must be a plain
    file name of a regular file inside the folder (no link out of it), and the folder lies
    inside data.root (no link out of that either); a file that does not decode, or a
    decompression bomb, is one error."""
    from PIL import Image, UnidentifiedImageError

    if images is None or not os.path.isdir(images):
        raise bad_file(path, where, f"CelebA's images in a folder {os.path.join(*CELEBA_IMAGES)}"
                                    f" of data.root (image names in x)")
    root = images
    for _ in CELEBA_IMAGES:  # images is data.root/raw/img_align_celeba
        root = os.path.dirname(root)
    if not resolves_inside(images, root):
        raise bad_file(path, where, f"CelebA's images in a folder inside data.root ({images} "
                                    f"links out of it)")
    out = np.empty((len(names), 3 * CELEBA_SIZE * CELEBA_SIZE), np.float32)
    for i, name in enumerate(names):
        full = os.path.join(images, name) if isinstance(name, str) else ""
        if not isinstance(name, str) or os.path.basename(name) != name or \
                name in ("", ".", "..") or not resolves_inside(full, images) or \
                not os.path.isfile(full):
            raise bad_file(path, where, f"image names of regular files in {images} (got "
                                        f"{short_repr(name)})")
        try:
            with Image.open(full) as im:
                im = im.resize((CELEBA_SIZE, CELEBA_SIZE), Image.Resampling.BICUBIC)
                arr = np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            raise bad_file(path, where, f"images that decode ({name} does not)") from None
        out[i] = arr.transpose(2, 0, 1).reshape(-1) / np.float32(255)
    return out


CSV_GROUP_BYTES = 16 << 20  # number text parsed by one call of Arrow's CSV reader
_NUMERIC_X = re.compile(rb'"x"\s*:\s*(\[\s*\[[-0-9eE+.,\s\[\]]*\]\s*\])')


def _parsed(raw: bytes) -> tuple[Any, str | None, list[np.ndarray]]:
    """A LEAF shard's JSON. Every ``"x"`` that is an array of arrays of numbers (FEMNIST's
    pixels: most of a shard's bytes) is parsed by Arrow's CSV reader into one float32 array
    per user instead of Python floats — about 4x faster and a tenth of the memory — and
    left in the document as ``{nonce: i}`` (a random nonce: no file can forge one);
    returns (document, nonce, arrays). Anything that does not parse that way (rows of
    unequal length, another number syntax) is parsed as plain JSON, whose checks then name
    the user."""
    spans = [m.span(1) for m in _NUMERIC_X.finditer(raw)]
    arrays = _csv_rows(raw, spans) if spans else None
    if arrays is None:
        return json.loads(raw), None, []
    nonce = secrets.token_hex(16)
    pieces, at = [], 0
    for i, (a, b) in enumerate(spans):
        pieces += [raw[at:a], b'{"%s": %d}' % (nonce.encode(), i)]
        at = b
    return json.loads(b"".join([*pieces, raw[at:]])), nonce, arrays


def _csv_rows(raw: bytes, spans: list[tuple[int, int]]) -> list[np.ndarray] | None:
    """Each span's rows of comma-separated numbers (``[[1,2],[3,4]]``) as one float32
    array, or None when they are not one table of numbers. Arrow's CSV reader parses about
    :data:`CSV_GROUP_BYTES` of text at a time (a shard at once would hold its whole table
    in float64 beside the text); numbers are read as float64 and rounded to float32, the
    same two steps as ``json`` then NumPy. Only ``json.dump``'s layouts take this path
    (rows separated by ", " or ","; an indented file keeps brackets Arrow refuses, and a
    space inside a number or ``--1`` is refused too: the shard goes to ``json`` and its
    errors). Arrow is more lenient than JSON in one way, kept for speed: it reads ``+1``,
    ``.5``, ``1.`` and ``01`` (JSON refuses them) as the numbers they spell."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    out: list[np.ndarray] = []
    width, group, size = None, [], 0
    for k, (a, b) in enumerate(spans):
        # the rows inside the outer brackets, one a line, without json.dump's ", " spaces
        # (any other layout leaves a bracket or a space Arrow refuses: json's path)
        part = raw[a + 1:b - 1].strip()[1:-1].replace(b", ", b",").replace(b"],[", b"\n")
        if not part.strip():
            return None
        group.append(part)
        size += len(part)
        if size < CSV_GROUP_BYTES and k + 1 < len(spans):
            continue
        width = width or group[0].split(b"\n", 1)[0].count(b",") + 1
        names = [str(i) for i in range(width)]
        try:
            table = pcsv.read_csv(
                pa.py_buffer(b"\n".join(group)),
                read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                              block_size=1 << 26),
                convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(
                    names, pa.float64())))
        except (pa.ArrowInvalid, ValueError):
            return None
        rows = [p.count(b"\n") + 1 for p in group]
        if table.num_rows != sum(rows) or any(c.null_count for c in table.columns):
            return None
        x = np.empty((table.num_rows, width), np.float32)
        for i, col in enumerate(table.columns):
            x[:, i] = col.to_numpy()
        out += np.split(x, np.cumsum(rows)[:-1])
        group, size = [], 0
    return out


def split_line(line: str) -> list[str]:
    """LEAF's tokenizer (``language_utils.split_line``): runs of word characters and
    apostrophes, and each of . , ! ? ; — no lowercasing."""
    return _WORD.findall(line)


def sent140_rows(texts: list[str], index: dict[str, int], steps: int) -> np.ndarray:
    """LEAF's ``line_to_indices`` for each text: the ids of its first ``steps`` tokens
    (:func:`split_line`), a word outside the vocabulary the unknown id ``len(index)``, and
    right-padded with that same id (LEAF has no pad id and no mask); float32 (n, steps)."""
    unk = len(index)
    out = np.full((len(texts), steps), unk, np.float32)
    for i, text in enumerate(texts):
        ids = [index.get(w, unk) for w in split_line(text)[:steps]]
        out[i, :len(ids)] = ids
    return out


def read_vocab(path: str, size: int) -> list[str]:
    """The first ``size`` words of a vocabulary file: LEAF's ``embs.json`` (its ``vocab``
    list, GloVe's order), else the first token of each line (GloVe's ``.txt`` or a
    word-count file, most frequent first); a word listed twice keeps its first place."""
    if path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as fh:
                words = json.load(fh).get("vocab")
        except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
            words = None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ConfigError(f"data.vocab ({path})", "the file", "LEAF's embs.json: an "
                                                              "object with a vocab list of "
                                                              "words")
    else:  # the first token of each line, until `size` distinct words
        words, seen = [], set()
        with open(path, "rb") as fh:
            for line in fh:
                word = line.split(maxsplit=1)[0].decode("utf-8", "replace") if line.strip() \
                    else None
                if word is not None and word not in seen:
                    seen.add(word)
                    words.append(word)
                    if len(words) == size:
                        break
    vocab = list(dict.fromkeys(words))[:size]
    if not vocab:
        raise ConfigError(f"data.vocab ({path})", "the file", "at least one word")
    return vocab


def _len(v: Any) -> str:
    return str(len(v)) if isinstance(v, list) else type(v).__name__


def input_shape_of(d: int) -> tuple[int, ...]:
    """A vector of length s² is one s×s grey image; any other length stays flat."""
    s = math.isqrt(d)
    return (1, s, s) if s * s == d and s > 1 else (d,)


def build_leaf(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The LEAF dataset at ``data.root`` as a population (see the module docstring)."""
    root = os.path.abspath(d.root)
    files = leaf_files(root)
    shards = [f for s in SPLITS for f in files[s]]
    vocab_file = vocab_path(d, root)
    steps = d.seq_len or SENT140_WORDS
    found: dict[str, Any] = {}

    def read(scratch: str) -> Natural:
        os.makedirs(scratch)
        vocab = read_vocab(vocab_file, d.vocab_size) if vocab_file else None
        images = os.path.join(root, *CELEBA_IMAGES)
        units = [_Shard(f, os.path.join(scratch, f"{k}.bin"), k < len(files["train"]), steps,
                        vocab, images) for k, f in enumerate(shards)]
        results = list(ordered_map(_spool_shard, units))
        if any(kind == "counts" for kind, _ in results):  # Sent140 without a vocabulary file
            counts: Counter[str] = Counter()
            for _, part in results:
                counts.update(part or {})
            vocab = [w for w, _ in counts.most_common(d.vocab_size)]
            for unit in units:
                unit.vocab = vocab
            results = list(ordered_map(_spool_shard, units))
        index: dict[str, dict[str, list[tuple[int, int, int]]]] = {}
        width, kinds, top = None, set(), 0
        for k, (_, users) in enumerate(results):
            for user, n, w, kind, at, most in users:
                kinds.add(kind)
                top = max(top, most)
                if n and width is None:
                    width = w
                if n and w != width:
                    raise bad_file(shards[k], f"user {user}", f"x vectors of the dataset's one "
                                                              f"length {width} (got {w})")
                split = "train" if units[k].train else "test"
                index.setdefault(user, {"train": [], "test": []})[split].append((k, at, n))
        if "words" in kinds:
            found.update(vocabulary=vocab, unknown_id=len(vocab or []), tokens=steps)

        def blocks() -> Generator[Block, None, None]:
            for user in sorted(index):
                parts = [[_unspool(units[k].out, at, n, width or 1) for k, at, n in
                          index[user][split]] for split in SPLITS]
                yield Block.of(user, parts[0], parts[1], (int(width or 1),))

        def shape() -> tuple[int, ...]:
            if "images" in kinds:
                return 3, CELEBA_SIZE, CELEBA_SIZE
            return (int(width or 1),) if kinds - {"numeric"} else input_shape_of(
                int(width or 1))

        # the letters' classes (and the extra one when a letter fell outside)
        return Natural(blocks(), shape, lambda: len(LETTERS) + (top >= len(LETTERS))
                       if "letters" in kinds else None, lambda: found)

    sha = file_sha256(vocab_file) if vocab_file else None
    return natural_split_population(
        d, num_clients, seed, "leaf", shards + ([vocab_file] if vocab_file else []), read,
        "LEAF's own train/ and test/ per user", key_extra=[d.vocab_size, d.seq_len],
        extra_info={"vocab_file": os.path.basename(vocab_file), "vocab_sha256": sha}
        if vocab_file else None)


@dataclass
class _Shard:
    """One shard's work: read ``path``, spool its rows to ``out``; Sent140's texts become
    ``steps`` ids of ``vocab`` (without a vocabulary their words are counted instead),
    CelebA's image names the images of the folder ``images``."""

    path: str
    out: str
    train: bool
    steps: int
    vocab: list[str] | None
    images: str


def _spool_shard(unit: _Shard) -> tuple[str, Any]:
    """One shard parsed and checked (:func:`_users`), user by user: ``("rows", per user
    (id, rows, width, kind, byte offset, the largest id for letters))`` with each user's
    rows appended to ``unit.out`` (x float32, then y int64) as it is read, or, for Sent140
    without a vocabulary, ``("counts", the train shard's word counts or None)``."""
    index = None if unit.vocab is None else {w: i for i, w in enumerate(unit.vocab)}
    found, counts = [], None
    with open(unit.out, "wb") as fh:
        for user, (x, y, kind) in _users(unit.path, index, unit.steps, unit.images):
            if kind == "words" and index is None:  # Sent140 without a vocabulary: count
                if not unit.train:
                    return "counts", None
                counts = counts if counts is not None else Counter()
                for text in x:
                    counts.update(split_line(text))
                continue
            at = fh.tell()
            fh.write(x.tobytes())
            fh.write(y.tobytes())
            most = int(max(x.max(initial=0), y.max(initial=0))) if kind == "letters" else 0
            found.append((user, len(y), int(x.shape[1]), kind, at, most))
    return ("counts", counts) if counts is not None else ("rows", found)


def _unspool(path: str, at: int, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.fromfile(path, np.float32, n * width, offset=at).reshape(n, width)
    y = np.fromfile(path, np.int64, n, offset=at + x.nbytes)
    return x, y
