"""Byzantine-robust aggregation for the FedAvg family (issue #30): the rules as free
functions (:mod:`fedray.methods.robust.rules`), the ``robust`` config section and
:class:`RobustRule`, which :class:`fedray.methods.fedavg.policy.FedAvgPolicy` applies in
place of the weighted mean; and the malicious clients they defend against: the attacks as
free functions (:mod:`fedray.methods.robust.attacks`) and the ``adversary`` section with
:class:`Adversary`, which the runtime asks who is malicious and what they do."""

from __future__ import annotations

from typing import Any

from fedray.methods.robust import rules
from fedray.methods.robust.adversary import Adversary, AdversaryConfig, adversary_of
from fedray.methods.robust.section import RobustConfig, RobustRule, root_dataset

__all__ = ["Adversary", "AdversaryConfig", "RobustConfig", "RobustRule", "adversary_of",
           "robust_rule", "root_dataset", "rules"]


def robust_rule(cfg: Any) -> RobustRule | None:
    """The run's robust rule (None: the plain weighted mean)."""
    section = getattr(cfg, "robust", None)
    if section is None or section.rule == "none":
        return None
    return RobustRule(section)
