"""FedAvg (McMahan et al., 2017): the client half (:mod:`.method`) and the sample-weighted
server mean (:mod:`.policy`) that FedProx, ORDERS' client, the compressed baselines, FLITE
and FAVoR reuse."""

from fedray.methods.fedavg.method import FedAvg, FedAvgParams, apply_base, check_base
from fedray.methods.fedavg.policy import FedAvgPolicy, weighted_mean

__all__ = ["FedAvg", "FedAvgParams", "FedAvgPolicy", "apply_base", "check_base",
           "weighted_mean"]
