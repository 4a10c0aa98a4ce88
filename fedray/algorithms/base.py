"""The small interfaces every method implements. Nothing here knows about Ray.

An :class:`Algorithm` bundles

- the client procedure, :meth:`Algorithm.client_update` — one virtual client's local work
  for one round, ``(broadcast, client) -> ClientOutput``;
- the server side, an :class:`AggregationPolicy` —
  ``aggregate(global_state, results, round) -> (new_state, metrics)`` plus checkpointable
  state;
- what is resident on an executor (the model, built once and reused for every client).

The runtime moves broadcasts and uploads as :class:`fedray.payload.Payload` and never looks
inside them; the algorithm never sees an actor, an object ref or a resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedray.policies.base import AggregationPolicy, State

__all__ = ["AggregationPolicy", "Algorithm", "ClientContext", "ClientOutput", "ClientResult",
           "State"]


@dataclass
class ClientContext:
    """Everything one virtual client's update may use."""

    client_id: int
    round: int
    seed: int
    tier: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    resident: Any
    device: str = "cpu"
    state: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None  # per-client side data (e.g. FAVoR's style target)


@dataclass
class ClientOutput:
    """What a client update returns: the upload, its weight and its metrics."""

    upload: Mapping[str, np.ndarray]
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] | None = None


@dataclass
class ClientResult:
    """A client's upload as the server receives it, in encoded form."""

    client_id: int
    round: int
    status: str
    num_samples: int = 0
    payload: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    upload_bytes: int = 0
    seconds: float = 0.0
    executor: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Algorithm:
    """A federated method: typed parameters, a client update and an aggregation policy."""

    name: ClassVar[str]
    Params: ClassVar[type]
    uses_client_state: ClassVar[bool] = False

    def __init__(self, cfg: Any, params: Any):
        self.cfg = cfg
        self.params = params

    def build_resident(self, input_shape: tuple[int, ...], num_classes: int, device: str) -> Any:
        """Heavy objects an executor keeps for all its clients (default: the model)."""
        raise NotImplementedError

    def init_global_state(self, resident: Any, seed: int) -> State:
        raise NotImplementedError

    def base_bytes(self) -> int:
        """Bytes every client downloads once, at its first round (a pretrained base)."""
        return 0

    def client_update(self, ctx: ClientContext, broadcast: State) -> ClientOutput:
        raise NotImplementedError

    def evaluate(self, resident: Any, broadcast: State, x: np.ndarray, y: np.ndarray,
                 device: str = "cpu") -> dict[str, float]:
        """Loss/accuracy of the broadcast model on (x, y); keys ``loss``, ``accuracy``, ``n``."""
        raise NotImplementedError

    def finetune_evaluate(self, ctx: ClientContext, broadcast: State, epochs: int
                          ) -> dict[str, float]:
        """Personalized accuracy after ``epochs`` of local fine-tuning of the broadcast model
        on the client's train split (nothing is uploaded or kept)."""
        raise NotImplementedError

    def make_policy(self) -> AggregationPolicy:
        raise NotImplementedError
