"""FLAIR (Song et al., "FLAIR: Federated Learning Annotated Image Repository", NeurIPS 2022
Datasets and Benchmarks) as pfl-research prepares it (issue #31): ``data.dataset=flair``
reads the one HDF5 file that ``benchmarks/dataset/flair/prepare_dataset.py`` writes
(``flair_federated.hdf5``) with ``h5py``, one client per FLAIR user.

Layout read (``data.root``: the file, or a directory holding exactly one ``*.hdf5`` /
``*.h5`` file)::

    /train/<user>/images                   uint8 (N, H, W, 3), the user's photos
    /train/<user>/labels_row               which image each coarse label belongs to
    /train/<user>/labels_col               the label's index (17 coarse labels)
    /train/<user>/fine_grained_labels_row  the same for the 1,628 fine-grained labels
    /train/<user>/fine_grained_labels_col
    /val/<user>/..., /test/<user>/...      the other users, same datasets
    /metadata/label_mapping                JSON {label: index}
    /metadata/fine_grained_label_mapping   JSON {label: index}

The task is multi-label classification: each image's targets are a multi-hot float vector
over the labels (``data.label_column``: ``labels``, the 17 coarse ones — the default — or
``fine_grained_labels``), trained with the per-label binary cross-entropy and scored by
pfl-research's averaged precision (:func:`fedray.models.training.evaluate_multilabel`:
``macro_ap``, ``micro_ap``; and ``macro_ap_present``, the macro mean over the labels the
test set has a positive of).

FLAIR splits its *users* (each user is in exactly one of train / val / test), not each
user's images, so: the clients are the ``train`` users (the first ``clients.num_clients``
in sorted id order with at least ``data.min_samples`` images), with no local test images;
the ``test`` users' images, every one (no per-user cap), are the test partition, written
once as an entry of their own beside the clients' (the held-out entry); the global test set
is a seeded draw of :func:`fedray.data.population.global_test_size` of them, or with
``eval.global_test_set=all`` all of them streamed from that entry (pfl evaluates on every
test image centrally); ``val`` is not read. A user keeps its first ``data.max_client_samples``
images (default pfl's ``max_num_user_images``, 512). Images stay 8-bit in the cache
(channels first; scaled to [0, 1] when a client's rows are read), resized with Pillow's
bilinear filter to ``data.image_size`` when it is set (pfl trains on random 224-pixel crops
of the 256-pixel images, normalised by ImageNet's channel statistics: the model
``flair_resnet18`` normalises; the crops are not taken).

Every rule broken (a missing group or dataset, a link to another file, a virtual or
external dataset, images that are not uint8 RGB of the file's one size, label indices out
of range, a mapping that is not JSON of indices 0..L−1) is one :class:`ConfigError` naming
the file, the user and the rule, before Ray starts, with nothing written to the cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.spec import ConfigError
from fedray.data.natural import (
    Block,
    Natural,
    bad_file,
    natural_split_population,
    one_file_in,
    open_hdf5,
    ordered_map,
)
from fedray.data.population import TablePopulation

LABEL_SETS = ("labels", "fine_grained_labels")
MAX_USER_IMAGES = 512  # pfl-research's max_num_user_images default for FLAIR
UNIT_USERS = 64  # users read and converted as one work unit, at most
UNIT_BYTES = 256 << 20  # and at most this many bytes of kept images (a unit of one user may
# exceed it: a user is never split)
MAX_USER_BYTES = 1 << 30  # one user's dataset, as declared (a tiny file can declare TBs)
MAX_PAIRS = 1 << 26  # (image, label) pairs of one user (FLAIR's users hold a few thousand)
TRAIN, HELD_OUT = "train", "test"


def flair_file(root: str) -> str:
    """The FLAIR HDF5 file: ``root`` itself, or the one ``*.hdf5`` / ``*.h5`` inside it."""
    if os.path.isfile(root):
        return os.path.abspath(root)
    if not os.path.isdir(root):
        raise ConfigError("data.root", root, "FLAIR's HDF5 file, or a directory holding it")
    return os.path.abspath(one_file_in(root, lambda f: f.endswith((".hdf5", ".h5")),
                                       "*.hdf5 or *.h5"))


def label_set(d: DataConfig) -> str:
    """``data.label_column`` as FLAIR's label set (its default ``label``: the coarse one)."""
    name = "labels" if d.label_column == "label" else d.label_column
    if name not in LABEL_SETS:
        raise ConfigError("data.label_column", d.label_column, f"one of FLAIR's label sets "
                                                               f"{' or '.join(LABEL_SETS)}")
    return name


def _member(group: Any, name: str, path: str, what: str, kind: str) -> Any:
    """``group[name]`` when it is stored in this file (a hard link, not a virtual or an
    external dataset: those read other files) and is a ``kind`` (group or dataset)."""
    import h5py

    try:
        link = group.get(name, getlink=True)
    except (KeyError, ValueError, OSError, RuntimeError):
        link = None
    if link is None:
        raise bad_file(path, what, f"a {kind} {name!r} (FLAIR's layout, as pfl-research's "
                                   f"prepare_dataset.py writes it)")
    if not isinstance(link, h5py.HardLink):
        raise bad_file(path, what, f"{name!r} stored in the file (not a link: it would read "
                                   f"elsewhere)")
    obj = group[name]
    want = h5py.Group if kind == "group" else h5py.Dataset
    if not isinstance(obj, want):
        raise bad_file(path, what, f"{name!r} a {kind}")
    if kind == "dataset":
        if obj.is_virtual or obj.external:
            raise bad_file(path, what, f"{name!r} stored in the file (not a virtual or an "
                                       f"external dataset: they read other files)")
        if obj.shape is None or obj.size * obj.dtype.itemsize > MAX_USER_BYTES:
            raise bad_file(path, what, f"{name!r} an array of at most {MAX_USER_BYTES >> 30} GiB")
    return obj


def _users(fh: Any, path: str, split: str) -> list[str]:
    """The users of a partition (sorted), or none when the file has no such group."""
    if split not in fh:
        return []
    return sorted(_member(fh, split, path, f"/{split}", "group").keys())


def label_names(fh: Any, path: str, labels: str) -> list[str]:
    """The label names in index order, from ``/metadata/<label set>_mapping``."""
    key = "label_mapping" if labels == "labels" else "fine_grained_label_mapping"
    meta = _member(fh, "metadata", path, "/metadata", "group")
    ds = _member(meta, key, path, f"/metadata/{key}", "dataset")
    try:
        raw = ds[()]
        mapping = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
        ok = isinstance(mapping, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in mapping.values()) and \
            sorted(mapping.values()) == list(range(len(mapping))) and len(mapping) > 0
    except (ValueError, UnicodeDecodeError, RecursionError, OSError, TypeError):
        ok = False
    if not ok:
        raise bad_file(path, f"/metadata/{key}", "JSON mapping each label to its index 0..L-1")
    return [name for name, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


def _images(fh: Any, path: str, split: str, user: str) -> Any:
    """A user's ``images`` dataset, checked to be uint8 (N, H, W, 3) before anything is
    read."""
    what = f"/{split}/{user}"
    group = _member(_member(fh, split, path, f"/{split}", "group"), user, path, what, "group")
    images = _member(group, "images", path, what, "dataset")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise bad_file(path, what, f"images uint8 (N, H, W, 3) (got {images.dtype} "
                                   f"{images.shape})")
    return images


def _user_rows(fh: Any, path: str, split: str, user: str, labels: str, classes: int,
               cap: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A user's images (uint8, (N, H, W, 3)) and multi-hot targets (float32 (N, L)): its
    first ``cap`` images (all with None). Memory follows the images kept, not what the
    file declares: at most one (row, label) pair per image and label is accepted, and
    targets are built for the kept images only."""
    what = f"/{split}/{user}"
    images = _images(fh, path, split, user)
    group = fh[split][user]
    n = images.shape[0]
    sets = [_member(group, f"{labels}_{k}", path, what, "dataset") for k in ("row", "col")]
    if any(s.ndim != 1 or s.dtype.kind not in "iu" for s in sets) or \
            sets[0].shape != sets[1].shape or sets[0].shape[0] > min(n * classes, MAX_PAIRS):
        raise bad_file(path, what, f"{labels}_row and {labels}_col integer vectors of one length, "
                                   f"at most images x labels and {MAX_PAIRS:,}")
    keep = np.arange(n if cap is None else min(n, cap))
    try:
        rows, cols = (s[()].astype(np.int64) for s in sets)
        if len(rows) and (rows.min() < 0 or rows.max() >= n or cols.min() < 0 or
                          cols.max() >= classes):
            raise bad_file(path, what, f"{labels}_row in 0..{n - 1} (its images) and {labels}_col"
                                       f" in 0..{classes - 1} (the label mapping)")
        at = np.minimum(np.searchsorted(keep, rows), max(len(keep) - 1, 0))
        mine = (keep[at] == rows) if len(keep) else np.zeros(len(rows), bool)
        y = np.zeros((len(keep), classes), np.float32)
        y[at[mine], cols[mine]] = 1.0
        x = images[:len(keep)]
    except OSError as e:
        raise bad_file(path, what, f"readable images and labels ({str(e)[:80]})") from None
    return x, y


def _resized(x: np.ndarray, size: int | None) -> np.ndarray:
    """(N, H, W, 3) uint8 → (N, 3, size, size) uint8 (Pillow's bilinear resize when the
    size differs), channels first."""
    if size is not None and len(x) and x.shape[1:3] != (size, size):
        from PIL import Image

        x = np.stack([np.asarray(Image.fromarray(img).resize((size, size),
                                                              Image.Resampling.BILINEAR))
                      for img in x])
    elif size is not None and not len(x):
        x = np.zeros((0, size, size, 3), np.uint8)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


@dataclass
class _Unit:
    """Users of one work unit and how to read them."""

    path: str
    users: list[str]
    labels: str
    classes: int
    cap: int | None
    size: int | None
    split: str = TRAIN


def _unit_rows(unit: _Unit) -> Block:
    """A unit's users as one block of rows: a train user's images are train rows, a test
    user's test rows."""
    xs, ys, counts = [], [], []
    split = unit.split
    with open_hdf5(unit.path) as fh:
        for user in unit.users:
            x, y = _user_rows(fh, unit.path, split, user, unit.labels, unit.classes, unit.cap)
            xs.append(_resized(x, unit.size))
            ys.append(y)
            counts.append(len(y))
    shapes = {tuple(x.shape[1:]) for x in xs if len(x)}
    if len(shapes) > 1:
        user = next(u for u, x in zip(unit.users, xs, strict=True)
                    if len(x) and tuple(x.shape[1:]) != tuple(xs[0].shape[1:]))
        raise bad_file(unit.path, f"/{split}/{user}", f"images of the file's one size "
                                                      f"(got {sorted(shapes)})")
    kept = [(x, y) for x, y in zip(xs, ys, strict=True) if len(y)]
    x = np.concatenate([k[0] for k in kept]) if kept else np.zeros((0, 3, 1, 1), np.uint8)
    y = np.concatenate([k[1] for k in kept]) if kept else np.zeros((0, unit.classes),
                                                                   np.float32)
    counts = np.array(counts, np.int64)
    none = np.zeros(len(counts), np.int64)
    return Block(unit.users, counts, none, x, y) if split == TRAIN else \
        Block(unit.users, none, counts, x, y)


def _held_out(path: str, labels: str, classes: int, size: int | None,
              shape: tuple[int, ...] | None) -> Generator[Block, None, None]:
    """The test partition: every test user's images (no cap), in sorted-user order, as
    test rows of the train images' size ``shape`` (the held-out entry)."""
    with open_hdf5(path) as fh:
        users = _users(fh, path, HELD_OUT)
        if not users:
            raise bad_file(path, f"/{HELD_OUT}", "FLAIR's test partition: a group of users "
                                                 "(the global test set)")
        kept = [_kept_bytes(fh, path, HELD_OUT, u, None) for u in users]
    units = [_Unit(path, part, labels, classes, None, size, HELD_OUT)
             for part in _units(users, kept)]
    for block in ordered_map(_unit_rows, units):
        if shape is not None and len(block.y) and tuple(block.x.shape[1:]) != tuple(shape):
            first = block.users[int(np.flatnonzero(block.n_test)[0])]
            raise bad_file(path, f"/{HELD_OUT}/{first}", f"test images of the train images' "
                                                         f"size {shape} (got "
                                                         f"{tuple(block.x.shape[1:])})")
        yield block


def _kept_bytes(fh: Any, path: str, split: str, user: str, cap: int | None) -> int:
    """The bytes of a user's kept images, from the dataset's declared shape (read before
    any image, so that a work unit's size is known)."""
    shape = _images(fh, path, split, user).shape
    return int(min(shape[0], cap if cap is not None else shape[0]) * np.prod(shape[1:]))


def _units(users: list[str], kept: list[int]) -> list[list[str]]:
    """Consecutive users cut into work units of at most :data:`UNIT_USERS` users and
    :data:`UNIT_BYTES` of kept images (a rule on the file alone: the same units, and so the
    same cache entry, on every machine)."""
    units: list[list[str]] = []
    size = 0
    for user, b in zip(users, kept, strict=True):
        if not units or len(units[-1]) >= UNIT_USERS or size + b > UNIT_BYTES:
            units.append([])
            size = 0
        units[-1].append(user)
        size += b
    return units


def build_flair(d: DataConfig, num_clients: int, seed: int) -> TablePopulation:
    """The FLAIR file at ``data.root`` as a population (see the module docstring)."""
    path = flair_file(d.root)
    labels = label_set(d)
    cap = MAX_USER_IMAGES if d.max_client_samples is None else d.max_client_samples

    def read(scratch: str) -> Natural:
        with open_hdf5(path) as fh:
            names = label_names(fh, path, labels)
            users = _users(fh, path, TRAIN)
            kept = [_kept_bytes(fh, path, TRAIN, u, cap) for u in users]
        units = [_Unit(path, part, labels, len(names), cap, d.image_size)
                 for part in _units(users, kept)]
        shape: list[Any] = [None]

        def blocks() -> Generator[Block, None, None]:
            for block in ordered_map(_unit_rows, units):
                if len(block.y):
                    got = tuple(int(s) for s in block.x.shape[1:])
                    shape[0] = shape[0] or got
                    if got != shape[0]:
                        first = block.users[int(np.flatnonzero(block.n_train)[0])]
                        raise bad_file(path, f"/{TRAIN}/{first}", f"images of the file's one "
                                                                  f"size {shape[0]} (got {got})")
                yield block

        return Natural(blocks(), lambda: shape[0] or (3, d.image_size or 1, d.image_size or 1),
                       lambda: names,
                       lambda: {"task": "multilabel", "label_set": labels,
                                "max_client_samples": cap,
                                "global_test": f"images of FLAIR's {HELD_OUT} users"},
                       lambda: _held_out(path, labels, len(names), d.image_size, shape[0]),
                       [labels, d.image_size])

    return natural_split_population(
        d, num_clients, seed, "flair", [path], read,
        f"FLAIR's users: clients from {TRAIN}, the global test set from {HELD_OUT}",
        key_extra=[labels, cap, d.image_size, "held-out entry"])


__all__ = ["build_flair", "flair_file", "label_names", "label_set"]
