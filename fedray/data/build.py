"""The one entry point from a config to its client data, whatever the kind."""

from __future__ import annotations

from typing import Any

from fedray.config import ExperimentConfig
from fedray.data.continual import build_continual
from fedray.data.datasets import Dataset
from fedray.data.federated import build_federated


def build_data(cfg: ExperimentConfig, dataset: Dataset | None = None) -> Any:
    """The experiment's client data: per-author text for ``blogtext`` (FAVoR), a task stream
    when ``continual.tasks`` is set, else a static federated split."""
    if cfg.data.dataset == "blogtext":
        from fedray.favor.data import build_text_data

        return build_text_data(cfg)
    if cfg.continual.tasks:
        return build_continual(cfg, dataset)
    return build_federated(cfg.data, cfg.clients.num_clients, cfg.seed, dataset)
