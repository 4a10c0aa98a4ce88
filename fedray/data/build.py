"""The one entry point from a config to its client data, whatever the kind."""

from __future__ import annotations

from typing import Any

from fedray.core import registry
from fedray.core.config import ExperimentConfig
from fedray.data.datasets import Dataset


def build_data(cfg: ExperimentConfig, dataset: Dataset | None = None) -> Any:
    """The experiment's client data, as its method builds it
    (:meth:`fedray.methods.base.Algorithm.build_data`: by default the dataset split among
    the clients; a task stream for the continual sub-model methods, per-author text for
    FAVoR)."""
    return registry.method(cfg.algorithm["name"]).build_data(cfg, dataset)
