"""Update-compression baselines (FLITE §4): FedAvg whose clients upload a top-k sparsified or
PowerSGD low-rank version of their update, with error feedback.

Each is FedAvg with its compressor as the first stage of the upload's transform chain
(:mod:`fedray.wire.transforms`): the error memory (and PowerSGD's warm-start Q) is the client's
chain memory, kept in the client state store between its rounds; the runtime decodes every
upload to dense tensors before FedAvg's policy averages them. Further stages configured in
``payload.transforms`` (e.g. ``int8``) follow the compressor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, spec
from fedray.methods.fedavg.method import FedAvg, FedAvgParams
from fedray.wire.transforms import PowerSGD as PowerSGDStage
from fedray.wire.transforms import TopK as TopKStage
from fedray.wire.transforms import Transform, TransformChain, parse_transforms


@dataclass
class _CompressedParams(FedAvgParams):
    def validate(self, cfg: Any) -> None:
        """The compressor is the chain's first stage, so no configured stage may need to be
        first (``weights``)."""
        super().validate(cfg)
        if cfg is None or not cfg.payload.transforms:
            return
        try:
            stages = parse_transforms(cfg.payload.transforms)
        except ValueError:
            return  # reported with its field by the config's own transform check
        if any(t.needs_reference for t in stages):
            raise ConfigError("payload.transforms", cfg.payload.transforms,
                              "no 'weights' stage with a compressing method (its compressor "
                              "is the first stage; use algorithm.name=fedavg)")


class _Compressed(FedAvg):
    def stage(self) -> Transform:
        raise NotImplementedError

    @classmethod
    def transforms_of(cls, cfg: Any) -> list:
        """Its compressor is the first stage of every upload's chain."""
        return [cls.name, *super().transforms_of(cfg)]

    def update_chain(self) -> TransformChain:
        chain = super().update_chain()
        return TransformChain([self.stage(), *chain.transforms], chain.error_feedback)

    def upgrade_state(self, state: Any) -> Any:
        """A state written before the transform chain (``{error, q, optimizer}``) in the
        chain's layout, so a resumed run keeps its error feedback and warm-start Q."""
        if not isinstance(state, dict) or "transforms" in state or "error" not in state:
            return state
        stages = {f"0.{self.stage().name}": state["q"]} if state.get("q") else {}
        out: dict[str, Any] = {"transforms": {"error": state["error"], "stages": stages}}
        if self.uses_client_state and state.get("optimizer") is not None:
            out["method"] = {"optimizer": state["optimizer"]}
        return out


@register_method
class TopK(_Compressed):
    """FedAvg with top-k sparsified updates (values + indices sent) and error feedback."""

    name = "topk"

    @dataclass
    class Params(_CompressedParams):
        density: float = spec(0.01, gt=0, le=1, help="share of each tensor's entries sent")

    def stage(self) -> Transform:
        return TopKStage(self.params.density)


@register_method
class PowerSGD(_Compressed):
    """FedAvg with PowerSGD rank-r updates (P and Q sent), warm start and error feedback."""

    name = "powersgd"

    @dataclass
    class Params(_CompressedParams):
        rank: int = spec(2, ge=1, help="rank of the P Qᵀ approximation")

    def stage(self) -> Transform:
        return PowerSGDStage(self.params.rank)
