"""Registry of federated methods. Each is an :class:`Algorithm` with typed ``Params``."""

from __future__ import annotations

from fedray.algorithms.base import (
    AggregationPolicy,
    Algorithm,
    ClientContext,
    ClientOutput,
    ClientResult,
)
from fedray.algorithms.compressed import PowerSGD, TopK
from fedray.algorithms.favor import Favor
from fedray.algorithms.fedavg import FedAvg
from fedray.algorithms.fedprox import FedProx
from fedray.algorithms.flite import Flite
from fedray.algorithms.hetero import METHODS as HETERO_METHODS
from fedray.algorithms.orders import Orders

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    ALGORITHMS[cls.name] = cls
    return cls


for _cls in (FedAvg, FedProx, Orders, TopK, PowerSGD, Flite, Favor, *HETERO_METHODS):
    register_algorithm(_cls)


def get_algorithm(name: str | None, path: str = "algorithm.name") -> type[Algorithm]:
    from fedray.config import ConfigError

    if name not in ALGORITHMS:
        raise ConfigError(path, name, "one of " + ", ".join(sorted(ALGORITHMS)))
    return ALGORITHMS[name]


def make_algorithm_from_class(cls: type[Algorithm], cfg) -> Algorithm:
    """Instantiate ``cls`` with the validated parameters of ``cfg.algorithm``."""
    from fedray.config import build_dataclass

    params = {k: v for k, v in cfg.algorithm.items() if k != "name"}
    return cls(cfg, build_dataclass(cls.Params, params, "algorithm"))


def make_algorithm(cfg) -> Algorithm:
    """Instantiate the configured algorithm."""
    return make_algorithm_from_class(get_algorithm(cfg.algorithm["name"]), cfg)


__all__ = ["ALGORITHMS", "AggregationPolicy", "Algorithm", "ClientContext", "ClientOutput",
           "ClientResult", "FedAvg", "FedProx", "Flite", "Orders", "PowerSGD", "TopK",
           "get_algorithm", "make_algorithm", "make_algorithm_from_class", "register_algorithm"]
