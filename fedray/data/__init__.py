"""Datasets, client partitions and the per-client federated view of a dataset."""

from fedray.data import catalog  # noqa: F401 — registers the built-in datasets
from fedray.data.build import build_data
from fedray.data.datasets import (
    Dataset,
    load_cifar,
    load_dataset,
    load_digits,
    make_synthetic,
    stratified_split,
)
from fedray.data.federated import FederatedData, build_federated, local_split
from fedray.data.partition import (
    SCHEMES,
    PartitionError,
    dirichlet,
    iid,
    inner_dirichlet,
    partition,
    pathological,
    quantity,
    shard,
)

__all__ = [
    "SCHEMES",
    "build_data",
    "Dataset",
    "FederatedData",
    "PartitionError",
    "build_federated",
    "dirichlet",
    "iid",
    "inner_dirichlet",
    "load_cifar",
    "load_dataset",
    "load_digits",
    "local_split",
    "make_synthetic",
    "partition",
    "pathological",
    "quantity",
    "shard",
    "stratified_split",
]
