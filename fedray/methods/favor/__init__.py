"""FAVoR (federated shared/private LoRA with author-style alignment), the LoRA baselines it is
compared with (:mod:`.method`), and its tooling: the causal LM and LoRA (:mod:`.lm`,
:mod:`.adapter`), the client procedures (:mod:`.train`), the ASCE style encoder
(:mod:`.asce`), the BlogText pipeline (:mod:`.data`, :mod:`.prepare`), evaluation
(:mod:`.evaluate`, :mod:`.style_metrics`), cold start and pooled training."""

from fedray.methods.favor.method import Favor, FavorParams, lora_spec

__all__ = ["Favor", "FavorParams", "lora_spec"]

from fedray.methods.favor import cli as _cli  # noqa: E402,F401  (fedray favor ...)
