"""FedAvg's server step over compressed uploads (top-k, PowerSGD): each client's upload is
decompressed to dense tensors of the global state's shapes, then averaged as FedAvg."""

from __future__ import annotations

from fedray.compression import Compressor
from fedray.policies.fedavg import FedAvgPolicy

SUFFIXES = (".values", ".indices", ".P", ".Q")


def uploaded_names(global_state, upload) -> list[str]:
    """Global-state names a compressed upload carries (dense or as suffixed parts)."""
    return [n for n in global_state
            if n in upload or any(n + s in upload for s in SUFFIXES)]


class CompressedFedAvgPolicy(FedAvgPolicy):
    def __init__(self, compressor: Compressor, server_lr: float = 1.0, weighted: bool = True):
        super().__init__(server_lr, weighted)
        self.compressor = compressor

    def aggregate(self, global_state, updates, round):
        dense = []
        for cid, n, upload in updates:
            shapes = {k: global_state[k].shape for k in uploaded_names(global_state, upload)}
            dense.append((cid, n, self.compressor.decompress(upload, shapes)))
        return super().aggregate(global_state, dense, round)
