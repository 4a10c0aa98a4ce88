"""Capacity-heterogeneous FL with nested sub-models: DROD and the baselines it is compared to
(:mod:`.method`), the sub-model ladder (:mod:`.ladder`), coordinate selection
(:mod:`.selection`), the per-coordinate server mean (:mod:`.slice_mean`) and federated
continual learning (:mod:`.continual`, which adds the ``continual`` config section)."""

from fedray.methods.drod.continual.section import ContinualConfig
from fedray.methods.drod.method import (
    METHODS,
    DepthFedAvg,
    DepthFjord,
    Drod,
    FedRolex,
    Fiarse,
    Fjord,
    Hetero,
    HeteroFL,
    HeteroParams,
    ScaleFL,
    ShortcutFedAvg,
    ShortcutFjord,
)

__all__ = ["METHODS", "ContinualConfig", "DepthFedAvg", "DepthFjord", "Drod", "FedRolex",
           "Fiarse", "Fjord", "Hetero", "HeteroFL", "HeteroParams", "ScaleFL", "ShortcutFedAvg",
           "ShortcutFjord"]

from fedray.methods.drod import cli as _cli  # noqa: E402,F401  (fedray drod ...)
