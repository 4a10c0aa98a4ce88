"""The server-side interface every method implements (no Ray, no torch)."""

from __future__ import annotations

from typing import Any

import numpy as np

State = dict[str, np.ndarray]


class AggregationPolicy:
    """Server-side state and the aggregation rule. Pure numpy; checkpointable."""

    def broadcast(self, global_state: State, round: int, tier: str) -> State:
        """The tensors sent to the clients of ``tier`` in ``round`` (default: everything)."""
        return global_state

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        """``updates`` holds ``(client_id, num_samples, decoded upload)`` in client-id order.

        The metrics are round-level scalars; an optional ``per_client`` entry
        ``{client_id: {name: value}}`` lands in that client's row of the metrics."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
