"""A per-client reservoir replay buffer (Vitter's algorithm R, as in ER and DER++).

Every example offered is kept with probability ``capacity / seen`` (``seen`` counts every
offer so far, repeats across epochs and rounds included, as Mammoth's buffer does), so the
buffer is a uniform sample of the stream. It is plain numpy and round-trips through a dict,
so it lives in the client state store between rounds.
"""

from __future__ import annotations

import numpy as np


class ReservoirBuffer:
    def __init__(self, capacity: int, state: dict | None = None):
        if capacity < 0:
            raise ValueError(f"buffer capacity must be >= 0, got {capacity}")
        self.capacity, self.seen, self.n = capacity, 0, 0
        self.x: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.logits: np.ndarray | None = None
        if state:
            self.seen, self.n = int(state["seen"]), int(state["n"])
            # copies: a retried or resumed client must start from the stored state
            self.x, self.y = np.array(state["x"]), np.array(state["y"])
            logits = state.get("logits")
            self.logits = None if logits is None else np.array(logits)

    def __len__(self) -> int:
        return self.n

    def add(self, x: np.ndarray, y: np.ndarray, gen: np.random.Generator,
            logits: np.ndarray | None = None) -> None:
        """Offer a batch, one example after another (algorithm R)."""
        if not self.capacity:
            return
        if self.x is None:
            self.x = np.zeros((self.capacity, *x.shape[1:]), x.dtype)
            self.y = np.zeros(self.capacity, y.dtype)
            if logits is not None:
                self.logits = np.zeros((self.capacity, *logits.shape[1:]), np.float32)
        for i in range(len(y)):
            self.seen += 1
            if self.n < self.capacity:
                slot, self.n = self.n, self.n + 1
            else:
                slot = int(gen.integers(0, self.seen))
                if slot >= self.capacity:
                    continue
            self.x[slot], self.y[slot] = x[i], y[i]
            if logits is not None:
                self.logits[slot] = logits[i]

    def sample(self, size: int, gen: np.random.Generator) -> np.ndarray:
        """Indices of ``min(size, len)`` distinct stored examples (all of them when the
        buffer holds no more than ``size``: DROD appendix D's 20-exemplar case)."""
        if size >= self.n:
            return np.arange(self.n)
        return np.sort(gen.choice(self.n, size, replace=False))

    def state(self) -> dict:
        return {"seen": self.seen, "n": self.n, "x": self.x, "y": self.y,
                "logits": self.logits}
