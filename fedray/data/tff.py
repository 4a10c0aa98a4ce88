"""TensorFlow Federated's HDF5 client data (issue #31): ``data.dataset=tff`` reads the
``.h5`` files TFF's ``tff.simulation.datasets`` download (federated EMNIST's
``fed_emnist_train.h5`` / ``fed_emnist_test.h5``, CIFAR-100's ``fed_cifar100_*.h5``) with
``h5py`` — no TensorFlow — one client per TFF client id, with TFF's own train/test files.

Layout read (``data.root``): a directory holding exactly one ``*train*.h5`` and one
``*test*.h5``, each ``examples/<client id>/<feature>`` datasets with a leading example
axis. The label is ``data.label_column`` (default ``label``); the input is the one dataset
named in ``data.feature_columns`` (default: ``pixels``, else ``image``). Images are read as
(C, H, W): (N, H, W) gains a channel, (N, H, W, C) with C ≤ 4 is moved channels-first;
``uint8`` pixels are scaled to [0, 1] (EMNIST's float pixels stay as TFF stores them). Text
features (Shakespeare's ``snippets``, StackOverflow's ``tokens``) are refused with a clear
error: their vocabularies are not here yet. The users, the split and the cache are those of
:func:`fedray.data.leaf.natural_split_population`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.outputs import resolves_inside
from fedray.core.spec import ConfigError
from fedray.data.leaf import MAX_CLASSES, SPLITS, Rows, natural_split_population
from fedray.data.population import TablePopulation

FEATURES = ("pixels", "image")


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
                (f for f in FEATURES if f in names), None)
            if feature not in names or d.label_column not in names:
                raise bad(f"client {user}", f"datasets {feature or ' or '.join(FEATURES)!r} "
                                            f"and {d.label_column!r} (it has {names})")
            for name in (feature, d.label_column):
                ds = g[name] if isinstance(g.get(name, getlink=True), h5py.HardLink) else None
                if not isinstance(ds, h5py.Dataset) or ds.is_virtual or ds.external:
                    raise bad(f"client {user}", f"{name!r} a dataset stored in the file (not "
                                                f"a link, a virtual or an external dataset: "
                                                f"they read other files)")
            try:
                x, y = g[feature][()], g[d.label_column][()]
            except OSError as e:
                raise bad(f"client {user}", f"readable datasets ({str(e)[:80]})") from None
            if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu" or x.ndim < 2 \
                    or y.ndim != 1:
                raise bad(f"client {user}", f"numeric {feature!r} examples and integer "
                                            f"{d.label_column!r} labels (text features, as "
                                            f"Shakespeare and StackOverflow have, are not "
                                            f"read yet)")
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
    files = tff_files(os.path.abspath(d.root))

    def read() -> tuple[Rows, tuple[int, ...], None]:
        rows: Rows = {}
        shape: Any = None
        for split in SPLITS:
            for user, (x, y) in _split_file(d, files[split]).items():
                if shape is None and len(x):
                    shape = tuple(int(s) for s in x.shape[1:])
                if len(x) and tuple(x.shape[1:]) != shape:
                    raise ConfigError(f"data.root ({files[split]})", f"client {user}",
                                      f"examples of the dataset's one shape {shape} (got "
                                      f"{tuple(x.shape[1:])})")
                rows.setdefault(user, {"train": [], "test": []})[split].append((x, y))
        return rows, shape or (1,), None

    return natural_split_population(
        d, num_clients, seed, "tff", [files[s] for s in SPLITS], read,
        "TFF's own train and test files per client",
        key_extra=[d.feature_columns, d.label_column])
