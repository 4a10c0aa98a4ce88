"""Update-compression baselines (FLITE §4): FedAvg whose clients upload a top-k sparsified or
PowerSGD low-rank version of their update, with error feedback. The error memory (and
PowerSGD's warm-start Q) is each client's state, kept in the client state store between
rounds; the server decompresses and averages (:mod:`fedray.policies.compressed`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.compression import Compressor
from fedray.config import spec
from fedray.policies.compressed import CompressedFedAvgPolicy


class _Compressed(FedAvg):
    uses_client_state = True  # type: ignore[assignment]

    def compressor(self) -> Compressor:
        raise NotImplementedError

    def client_update(self, ctx, broadcast):
        out = super().client_update(ctx, broadcast)
        state = ctx.state or {}
        res = self.compressor().compress(out.upload, state.get("error"), state.get("q"),
                                         seed=ctx.seed, round=ctx.round, client=ctx.client_id)
        count = self.compressor().payload_values(res.shapes)
        out.metrics.update(sent_values=float(count.values), sent_indices=float(count.indices))
        out.upload = res.upload
        out.state = {**(out.state or {}), "error": res.error, "q": res.q_memory}
        return out

    def make_policy(self):
        return CompressedFedAvgPolicy(self.compressor(), self.params.server_lr,
                                      self.params.weighted)


class TopK(_Compressed):
    """FedAvg with top-k sparsified updates (values + indices sent) and error feedback."""

    name = "topk"

    @dataclass
    class Params(FedAvgParams):
        density: float = spec(0.01, gt=0, le=1, help="share of each tensor's entries sent")

    def compressor(self) -> Compressor:
        return Compressor("topk", density=self.params.density)


class PowerSGD(_Compressed):
    """FedAvg with PowerSGD rank-r updates (P and Q sent), warm start and error feedback."""

    name = "powersgd"

    @dataclass
    class Params(FedAvgParams):
        rank: int = spec(2, ge=1, help="rank of the P Qᵀ approximation")

    def compressor(self) -> Compressor:
        return Compressor("powersgd", rank=self.params.rank)
