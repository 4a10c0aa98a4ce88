"""The built-in datasets, registered as plugins are (:func:`fedray.core.registry.
register_dataset`): each entry says how its data is built, what input shape and classes it
has (known before loading, so configs are checked without reading a file), and what its
config must hold. A new dataset is one :class:`DatasetEntry` registered from a package;
``data.dataset`` then takes its name and ``fedray config --keys`` lists it.

Kinds: ``arrays`` (``load`` returns a :class:`fedray.data.datasets.Dataset` that the
configured partition splits among the clients), ``table`` (a table with a natural-id
column, one client per id: :class:`fedray.data.population.TablePopulation`), ``method``
(read by the method that uses it: BlogText by FAVoR's ``build_data``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fedray.core import registry
from fedray.core.spec import ConfigError
from fedray.data import memory


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    kind: Literal["arrays", "table", "method"]
    load: Callable[[Any, int], Any] | None = None  # (DataConfig, seed) -> Dataset
    shape: Callable[[Any], tuple[tuple[int, ...], int]] | None = None  # None: read at run time
    check: Callable[[Any], None] | None = None  # (ExperimentConfig) -> None, raises ConfigError
    # (DataConfig, num_clients, seed) -> a population, for a format with its own reader
    population: Callable[[Any, int, int], Any] | None = None

    @property
    def natural_ids(self) -> bool:
        """Split by a natural id, not by a label partition."""
        return self.kind != "arrays"


def _digits(d: Any, seed: int) -> Any:
    from fedray.data.datasets import load_digits

    return load_digits(d.image_size, d.channels, seed)


def _synthetic(d: Any, seed: int) -> Any:
    from fedray.data.datasets import make_synthetic

    return make_synthetic(d.synthetic_samples, d.synthetic_features, d.synthetic_classes,
                          d.synthetic_test_fraction, seed)


def _cifar(name: str) -> Callable[[Any, int], Any]:
    def load(d: Any, seed: int) -> Any:
        from fedray.data.datasets import load_cifar

        if d.root is None:
            raise ConfigError("data.root", None, f"a local directory for {name}")
        return load_cifar(d.root, name, d.download)
    return load


def _check_cifar(cfg: Any) -> None:
    root = cfg.data.root
    if root is None:
        raise ConfigError("data.root", root, "a local directory for " + cfg.data.dataset)
    if not cfg.data.download and not Path(root).is_dir():
        raise ConfigError("data.root", root, "an existing directory (or set data.download=true)")
    memory.require("data.dataset", cfg.data.dataset, memory.pooled(
        60_000, 3 * 32 * 32, cfg.clients.num_clients, "a machine with more memory (CIFAR "
        "is held whole)", temporaries=1.5), cfg.runtime.ray_address)


def _check_digits(cfg: Any) -> None:
    """The digits arrays fit in memory (``data.image_size`` grows them quadratically)."""
    d = cfg.data
    side = d.image_size or 8
    memory.require("data.image_size", d.image_size, memory.pooled(
        1797, d.channels * side * side, cfg.clients.num_clients,
        "a smaller data.image_size or data.channels", temporaries=3),
        cfg.runtime.ray_address)


def _check_synthetic(cfg: Any) -> None:
    """The synthetic arrays fit in memory: the pooled set (``synthetic_samples x
    synthetic_features`` float32, split among the clients), or with
    ``data.synthetic_per_client`` only the global test set (clients drawn on demand)."""
    d = cfg.data
    if d.synthetic_per_client is None:
        est = memory.pooled(d.synthetic_samples, d.synthetic_features,
                            cfg.clients.num_clients,
                            "set data.synthetic_per_client (each client's samples drawn on "
                            "demand: memory independent of clients.num_clients), or fewer "
                            "data.synthetic_samples or data.synthetic_features", temporaries=2)
    else:
        n_test = max(d.synthetic_classes, int(d.synthetic_samples * d.synthetic_test_fraction))
        est = memory.pooled(n_test, d.synthetic_features, 0,
                            "fewer data.synthetic_samples (with data.synthetic_per_client "
                            "they size only the global test set: synthetic_samples x "
                            "synthetic_test_fraction)", temporaries=1.2)
    memory.require("data.synthetic_samples", d.synthetic_samples, est,
                   cfg.runtime.ray_address)


def _check_table(cfg: Any) -> None:
    d = cfg.data
    if getattr(d, "hf_id", None) is not None:
        if d.dataset != "hf":
            raise ConfigError("data.hf_id", d.hf_id, "unset unless data.dataset=hf")
        if d.root is not None:
            raise ConfigError("data.root", d.root, "unset when data.hf_id is set (one or the "
                                                   "other)")
    elif not d.root or not Path(d.root).exists():
        raise ConfigError("data.root", d.root, f"an existing local path for {d.dataset}")
    if not d.client_column:
        raise ConfigError("data.client_column", d.client_column,
                          f"the column naming each row's client ({d.dataset} data is split "
                          f"by natural id)")
    from fedray.data.population import GLOBAL_TEST_MAX, check_table_source

    src = check_table_source(d)  # files, schemas and column types, from footers/headers
    # the conversion holds the table read (memory-mapped for hf), its reordered copy and the
    # float32 feature matrix (at most the table's size), plus per-row index arrays
    read = 0 if d.dataset == "hf" and d.hf_id is None else src.table_bytes  # Arrow: mapped
    est = memory.Estimate(GLOBAL_TEST_MAX * 4 * max(1, len(src.features)),
                          read + 2 * src.table_bytes + max(src.rows, 0) * memory.PER_ROW_BYTES,
                          "a smaller table (fewer rows, or fewer columns with "
                          "data.feature_columns), or a machine with more memory")
    memory.require("data.hf_id" if d.hf_id else "data.root", d.hf_id or d.root, est,
                   cfg.runtime.ray_address)


def _leaf(d: Any, num_clients: int, seed: int) -> Any:
    from fedray.data.leaf import build_leaf

    return build_leaf(d, num_clients, seed)


def _check_leaf(cfg: Any) -> None:
    """The LEAF folders and shards exist inside ``data.root`` (their content is checked when
    they are read, still before Ray starts)."""
    from fedray.data.leaf import leaf_files

    if not cfg.data.root:
        raise ConfigError("data.root", cfg.data.root, "a LEAF dataset directory (train/ and "
                                                      "test/ folders of JSON shards)")
    leaf_files(cfg.data.root)


def _tff(d: Any, num_clients: int, seed: int) -> Any:
    from fedray.data.tff import build_tff

    return build_tff(d, num_clients, seed)


def _check_tff(cfg: Any) -> None:
    """The train and test .h5 files exist inside ``data.root`` (their groups are checked
    when they are read, still before Ray starts)."""
    from fedray.data.tff import tff_files

    if not cfg.data.root:
        raise ConfigError("data.root", cfg.data.root, "a directory holding TFF's *train*.h5 "
                                                      "and *test*.h5 files")
    tff_files(cfg.data.root)


def _flair(d: Any, num_clients: int, seed: int) -> Any:
    from fedray.data.flair import build_flair

    return build_flair(d, num_clients, seed)


def _check_flair(cfg: Any) -> None:
    """The FLAIR file exists inside ``data.root``, the label set is FLAIR's, and the method
    trains on multi-hot targets (capability ``multilabel``); the file's groups are checked
    when it is read, still before Ray starts."""
    from fedray.data.flair import flair_file, label_set

    if not cfg.data.root:
        raise ConfigError("data.root", cfg.data.root, "FLAIR's HDF5 file (pfl-research's "
                                                      "flair_federated.hdf5) or its directory")
    flair_file(cfg.data.root)
    label_set(cfg.data)
    registry.require(registry.method_of(cfg), "multilabel",
                     "data.dataset", "flair")
    section = getattr(cfg, "adversary", None)
    attack = section.attack if section is not None and section.active else None
    if attack in ("label_flip", "backdoor"):
        raise ConfigError("adversary.attack", attack, "a model-poisoning attack with "
                                                      "data.dataset=flair (its data poisoning "
                                                      "rewrites single class labels)")


def _check_blogtext(cfg: Any) -> None:
    if cfg.data.root is None or not Path(cfg.data.root).is_file():
        raise ConfigError("data.root", cfg.data.root, "an existing BlogText-schema CSV file")


for _entry in (
        DatasetEntry("digits", "arrays", _digits,
                     lambda d: ((d.channels, d.image_size or 8, d.image_size or 8), 10),
                     _check_digits),
        DatasetEntry("synthetic", "arrays", _synthetic,
                     lambda d: ((d.synthetic_features,), d.synthetic_classes), _check_synthetic),
        DatasetEntry("cifar10", "arrays", _cifar("cifar10"), lambda d: ((3, 32, 32), 10),
                     _check_cifar),
        DatasetEntry("cifar100", "arrays", _cifar("cifar100"), lambda d: ((3, 32, 32), 100),
                     _check_cifar),
        DatasetEntry("blogtext", "method", check=_check_blogtext),
        DatasetEntry("parquet", "table", check=_check_table),
        DatasetEntry("hf", "table", check=_check_table),
        DatasetEntry("leaf", "table", check=_check_leaf, population=_leaf),
        DatasetEntry("tff", "table", check=_check_tff, population=_tff),
        DatasetEntry("flair", "table", check=_check_flair, population=_flair)):
    registry.register_dataset(_entry)

__all__ = ["DatasetEntry"]
