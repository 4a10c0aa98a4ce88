"""Class-incremental task streams for federated continual learning (DROD §3, appendix D).

The classes are cut, in a fixed order, into equal disjoint tasks; round r belongs to task
``(r − 1) // rounds_per_task`` and every client moves on at the same boundary. Within each
task the task's train samples are split among the clients with Dirichlet(α) label skew,
redrawn per task (from ``(seed, task)``), and each client's share is split again into local
train and a held-out part (``data.local_test_fraction``; BiC fits its correction there).
Every objective holds out the same part, not BiC alone: the paper names a held-out split
only for BiC, and we keep the arms on the same training samples and local steps, so that
an objective's score differs from another's by the objective only. The cost is that each
client trains on 1 − ``local_test_fraction`` of its share (the paper's ~500 images per client
and task are ~450 at the 0.1 of ``jobs/drod_split_cifar100.py``). Evaluation uses the
global test set, scored per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.config import ExperimentConfig
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError
from fedray.data.datasets import Dataset, load_dataset
from fedray.data.federated import local_split
from fedray.data.partition import PartitionError, partition


def task_classes(num_classes: int, tasks: int, class_order: list[int] | None = None
                 ) -> list[np.ndarray]:
    """The classes of each task: ``class_order`` (default 0..C−1) cut into ``tasks`` parts."""
    if tasks < 1 or num_classes % tasks:
        raise ValueError(f"{tasks} tasks do not divide {num_classes} classes")
    order = np.arange(num_classes) if class_order is None else np.asarray(class_order)
    return [np.sort(part) for part in np.split(order, tasks)]


def task_of_round(round: int, rounds_per_task: int, tasks: int) -> int:
    """The task trained in ``round`` (rounds count from 1; round 0 maps to the first)."""
    return min(max(round - 1, 0) // rounds_per_task, tasks - 1)


@dataclass
class ContinualData:
    """The train arrays once and, per task, each client's local train/held-out indices."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    classes: list[np.ndarray]
    rounds_per_task: int
    train_idx: list[list[np.ndarray]]
    test_idx: list[list[np.ndarray]]

    @property
    def num_clients(self) -> int:
        return len(self.train_idx[0])

    @property
    def tasks(self) -> int:
        return len(self.classes)

    def task_of(self, round: int) -> int:
        return task_of_round(round, self.rounds_per_task, self.tasks)

    def client_arrays(self, cid: int, round: int, split: Literal["train", "test"] = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s share of the task trained in ``round``."""
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} out of range 0..{self.num_clients - 1}")
        t = self.task_of(round)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        idx = (self.train_idx if split == "train" else self.test_idx)[t][cid]
        return self.x[idx], self.y[idx]

    def num_samples(self, cid: int, split: Literal["train", "test"] = "train", round: int = 1
                    ) -> int:
        """Size of client ``cid``'s ``split`` of the task trained in ``round``."""
        return len(self.client_arrays(cid, round, split)[1])

    def client_extra(self, cid: int, round: int) -> dict[str, Any] | None:
        """No per-client side data (see :class:`fedray.methods.base.ClientData`)."""
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "num_clients": self.num_clients, "num_classes": int(self.num_classes),
            "input_shape": [int(s) for s in self.input_shape],
            "tasks": [c.tolist() for c in self.classes],
            "rounds_per_task": self.rounds_per_task,
            "train_sizes": [[int(len(i)) for i in t] for t in self.train_idx],
            "held_out_sizes": [[int(len(i)) for i in t] for t in self.test_idx],
            "global_test_size": int(len(self.y_test)),
        }


def build_continual(cfg: ExperimentConfig, dataset: Dataset | None = None) -> ContinualData:
    """Load (or take) the dataset and draw every task's client split."""
    cl, n_clients = cfg.continual, cfg.clients.num_clients
    ds = dataset if dataset is not None else load_dataset(cfg.data, cfg.seed)
    classes = task_classes(ds.num_classes, cl.tasks, cl.class_order)
    train_idx, test_idx = [], []
    for t, cls in enumerate(classes):
        pool = np.flatnonzero(np.isin(ds.y_train, cls))
        try:
            shards = partition(ds.y_train[pool], n_clients, "dirichlet",
                               rng(cfg.seed, t, -1, "task-partition"), alpha=cfg.data.alpha,
                               min_size=max(2, cfg.data.min_samples))
        except PartitionError as e:
            raise ConfigError("clients.num_clients", n_clients,
                              f"a fleet that task {t}'s {len(pool)} samples can cover with "
                              f">= {max(2, cfg.data.min_samples)} each ({e})") from e
        tr, te = [], []
        for cid, shard in enumerate(shards):
            a, b = local_split(pool[shard], ds.y_train, cfg.data.local_test_fraction,
                               rng(cfg.seed, t, cid, "task-local-split"))
            tr.append(a)
            te.append(b)
        train_idx.append(tr)
        test_idx.append(te)
    return ContinualData(ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes,
                         tuple(ds.input_shape), classes, cl.rounds_per_task, train_idx, test_idx)

