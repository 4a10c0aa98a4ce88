"""A dataset split among clients, with optional feature skew and concept drift.

:class:`FederatedData` holds the train arrays once plus index arrays per client, so it is
cheap to ship to every executor (e.g. one ``ray.put``); :meth:`FederatedData.client_arrays`
materialises a client's view on demand, applying that client's fixed input transform and,
from the drift round on, its permuted labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError
from fedray.data.datasets import Dataset, load_dataset
from fedray.data.partition import PartitionError, partition

_PARAM_TO_FIELD = {
    "num_clients": "clients.num_clients",
    "min_size": "data.min_samples",
    "alpha": "data.alpha",
    "classes_per_client": "data.classes_per_client",
    "quantity_alpha": "data.quantity_alpha",
    "shards_per_client": "data.shards_per_client",
    "scheme": "data.partition",
}


@dataclass
class FederatedData:
    """Train arrays once, per-client local train/test indices, and per-client skew parameters.

    ``train_idx[c]`` and ``test_idx[c]`` index ``x``/``y`` (client ``c``'s shard split into
    local train and test). ``x_test``/``y_test`` is the global test set. Feature skew maps a
    client's inputs to ``x * feature_scale[c] + feature_shift[c] + feature_noise[c] * P_c``
    with ``P_c`` a fixed standard-normal pattern per client. Clients in ``drift_clients`` see
    labels ``drift_perm[y]`` from round ``drift_round`` on.
    """

    x: np.ndarray
    y: np.ndarray
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    feature_scale: np.ndarray
    feature_shift: np.ndarray
    feature_noise: np.ndarray
    drift_round: int | None
    drift_clients: np.ndarray
    drift_perm: np.ndarray
    seed: int = 0
    train_ids: np.ndarray | None = None  # the dataset's sample id of each row of x
    test_ids: np.ndarray | None = None   # ... and of each row of x_test

    @property
    def num_clients(self) -> int:
        return len(self.train_idx)

    def _indices(self, cid: int, split: Literal["train", "test"]) -> np.ndarray:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        if split == "train":
            return self.train_idx[cid]
        if split == "test":
            return self.test_idx[cid]
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")

    def num_samples(self, cid: int, split: Literal["train", "test"] = "train") -> int:
        """Size of client ``cid``'s local ``split``."""
        return len(self._indices(cid, split))

    def is_drifted(self, cid: int, round: int) -> bool:
        """Whether client ``cid`` sees permuted labels in ``round``."""
        return (self.drift_round is not None and round >= self.drift_round
                and bool(np.isin(cid, self.drift_clients)))

    def noise_pattern(self, cid: int) -> np.ndarray:
        """Client ``cid``'s fixed unit-variance noise pattern (same on every call and host)."""
        gen = rng(self.seed, -1, cid, "feature-noise")
        return gen.standard_normal(self.input_shape).astype(np.float32)

    def transform(self, cid: int, x: np.ndarray) -> np.ndarray:
        """Client ``cid``'s input transform applied to ``x`` (a new array unless identity)."""
        scale = self.feature_scale[cid]
        shift = self.feature_shift[cid]
        noise = self.feature_noise[cid]
        if scale == 1 and shift == 0 and noise == 0:
            return x
        out = x * scale + shift
        if noise != 0:
            out += noise * self.noise_pattern(cid)
        return out.astype(np.float32, copy=False)

    def client_arrays(self, cid: int, round: int, split: Literal["train", "test"] = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s (x, y) for ``split`` as seen in ``round``."""
        idx = self._indices(cid, split)
        x = self.transform(cid, self.x[idx])
        y = self.y[idx]
        if self.is_drifted(cid, round):
            y = self.drift_perm[y]
        return x, y

    def client_extra(self, cid: int, round: int) -> dict[str, Any] | None:
        """No per-client side data (see :class:`fedray.methods.base.ClientData`)."""
        return None

    def partition_table(self) -> Any:
        """The partition as one Parquet-ready table (``partition.parquet``): per client its
        train and local-test sample indices, as list columns over one offsets array each."""
        import pyarrow as pa

        def csr(idx: list[np.ndarray]) -> Any:
            offsets = np.r_[0, np.cumsum([len(i) for i in idx])].astype(np.int32)
            values = np.concatenate(idx) if idx else np.zeros(0, np.int64)
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

        return pa.table({"client_id": np.arange(self.num_clients),
                         "train_idx": csr(self.train_idx), "test_idx": csr(self.test_idx)})

    def summary(self) -> dict[str, Any]:
        """Per-client sizes, class counts and skew parameters as plain JSON types."""

        def counts(idx: list[np.ndarray]) -> list[list[int]]:
            return [np.bincount(self.y[i], minlength=self.num_classes).tolist() for i in idx]

        return {
            "num_clients": self.num_clients,
            "num_classes": int(self.num_classes),
            "input_shape": [int(s) for s in self.input_shape],
            "train_sizes": [int(len(i)) for i in self.train_idx],
            "test_sizes": [int(len(i)) for i in self.test_idx],
            "global_test_size": int(len(self.y_test)),
            "class_counts_train": counts(self.train_idx),
            "class_counts_test": counts(self.test_idx),
            "feature_scale": [float(v) for v in self.feature_scale],
            "feature_shift": [float(v) for v in self.feature_shift],
            "feature_noise": [float(v) for v in self.feature_noise],
            "drift_round": self.drift_round,
            "drift_clients": [int(c) for c in self.drift_clients],
            "drift_perm": [int(c) for c in self.drift_perm],
        }


def local_test_count(n: int, test_fraction: float) -> int:
    """How many of a client's ``n`` samples are its local test split: ``round(f n)``
    clipped to ``1..n - 1`` (both splits non-empty)."""
    return int(min(max(round(test_fraction * n), 1), n - 1))


def local_split(shard: np.ndarray, labels: np.ndarray, test_fraction: float,
                gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's shard into sorted (train, test) indices, stratified by label.

    The test side gets ``round(test_fraction * len(shard))`` samples clipped to
    ``1..len(shard) - 1``; classes get their proportional share by largest remainder.
    """
    n = len(shard)
    if n < 2:
        raise ValueError(f"a shard needs at least 2 samples to split, got {n}")
    n_test = local_test_count(n, test_fraction)
    perm = shard[gen.permutation(n)]
    perm = perm[np.argsort(labels[perm], kind="stable")]
    _, starts, class_n = np.unique(labels[perm], return_index=True, return_counts=True)
    share = class_n * (n_test / n)
    quota = np.floor(share).astype(np.int64)
    left = n_test - int(quota.sum())
    if left > 0:
        tie = gen.random(len(share))
        order = np.lexsort((tie, -(share - quota)))
        quota[order[:left]] += 1
    rank = np.arange(n) - np.repeat(starts, class_n)
    is_test = rank < np.repeat(quota, class_n)
    return np.sort(perm[~is_test]), np.sort(perm[is_test])


def _derangement(num: int, gen: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation of ``range(num)`` without fixed points (num >= 2)."""
    if num < 2:
        raise ValueError(f"a derangement needs at least 2 elements, got {num}")
    while True:
        perm = gen.permutation(num)
        if not np.any(perm == np.arange(num)):
            return perm.astype(np.int64)


def _size_error(n: int, num_clients: int, min_samples: int) -> ConfigError:
    if num_clients * 2 > n:
        return ConfigError("clients.num_clients", num_clients,
                           f"at most {n // 2} clients for {n} train samples (each client needs "
                           f">= 2 samples for a local train/test split)")
    return ConfigError("data.min_samples", min_samples,
                       f"at most {n // num_clients} for {num_clients} clients and {n} train "
                       f"samples (or fewer clients)")


def build_federated(cfg: DataConfig, num_clients: int, seed: int,
                    dataset: Dataset | None = None) -> FederatedData:
    """Load (or take) the dataset, partition it, split shards locally, draw skew and drift.

    Partition problems become :class:`ConfigError` on the config field most responsible.
    """
    ds = dataset if dataset is not None else load_dataset(cfg, seed)
    n = len(ds.y_train)
    min_size = max(int(cfg.min_samples), 2)
    if num_clients < 1:
        raise ConfigError("clients.num_clients", num_clients, "at least 1")
    if num_clients * min_size > n:
        raise _size_error(n, num_clients, min_size)
    try:
        shards = partition(ds.y_train, num_clients, cfg.partition, rng(seed, -1, -1, "partition"),
                           alpha=cfg.alpha, classes_per_client=cfg.classes_per_client,
                           quantity_alpha=cfg.quantity_alpha, min_size=min_size,
                           shards_per_client=cfg.shards_per_client,
                           inner_sizes=cfg.inner_sizes)
    except PartitionError as e:
        path = _PARAM_TO_FIELD.get(e.param or "", "data.partition")
        value = {"clients.num_clients": num_clients, "data.min_samples": cfg.min_samples,
                 "data.alpha": cfg.alpha, "data.classes_per_client": cfg.classes_per_client,
                 "data.quantity_alpha": cfg.quantity_alpha,
                 "data.shards_per_client": cfg.shards_per_client}.get(path, cfg.partition)
        raise ConfigError(path, value, f"{e.allowed or 'a feasible value'} ({e})") from e
    if min(len(s) for s in shards) < 2:
        raise _size_error(n, num_clients, min_size)

    train_idx, test_idx = [], []
    for cid, shard in enumerate(shards):
        tr, te = local_split(shard, ds.y_train, cfg.local_test_fraction,
                             rng(seed, -1, cid, "local-split"))
        train_idx.append(tr)
        test_idx.append(te)

    s = float(cfg.feature_skew)
    if s > 0:
        gen = rng(seed, -1, -1, "feature-skew")
        scale = np.maximum(gen.uniform(1 - s / 2, 1 + s / 2, num_clients), 0.1)
        shift = gen.normal(0.0, s / 2, num_clients)
        noise = gen.uniform(0.0, s / 2, num_clients)
    else:
        scale, shift, noise = np.ones(num_clients), np.zeros(num_clients), np.zeros(num_clients)

    gen = rng(seed, -1, -1, "drift")
    drift_perm = _derangement(ds.num_classes, gen)
    if cfg.drift_round is not None:
        k = round(cfg.drift_fraction * num_clients)
        drift_clients = np.sort(gen.choice(num_clients, size=k, replace=False)).astype(np.int64)
    else:
        drift_clients = np.zeros(0, dtype=np.int64)

    return FederatedData(
        x=ds.x_train, y=ds.y_train, train_idx=train_idx, test_idx=test_idx,
        x_test=ds.x_test, y_test=ds.y_test, num_classes=ds.num_classes,
        input_shape=tuple(ds.input_shape),
        feature_scale=scale.astype(np.float32), feature_shift=shift.astype(np.float32),
        feature_noise=noise.astype(np.float32), drift_round=cfg.drift_round,
        drift_clients=drift_clients, drift_perm=drift_perm, seed=seed,
        train_ids=ds.train_ids, test_ids=ds.test_ids)
