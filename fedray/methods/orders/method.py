"""ORDERS, client side: FedAvg's local SGD; the upload is the update Δθ_i plus its norm
(``orders.norm``, one float — the text's only extra communication). The norm is computed in
float64 and sent without loss as its raw float64 bits viewed as one int64
(:func:`~fedray.methods.orders.policy.encode_norm`; integers travel exactly under every
payload codec, where the fp32 codec would round it to float32): 8 bytes plus its header
entry, in the upload's byte count. With ``payload.transforms`` no norm is sent: the server
ranks the decoded (sparsified / quantized) update it averages by its own norm. The server
side is :mod:`fedray.methods.orders.policy`."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.methods.base import ClientContext, ClientOutput, ReportSection
from fedray.methods.fedavg.method import FedAvg
from fedray.methods.orders.policy import (
    OrdersParams,
    OrdersPolicy,
    encode_norm,
    key_layer_mask,
    update_norms,
)


@register_method
class Orders(FedAvg):
    """Norm-rank difference aggregation (ORDERS) with smoothing and participation rules."""

    name = "orders"
    Params = OrdersParams
    renamed_keys = {"alpha": "offset"}
    # every upload is ranked: not linear
    capabilities = frozenset(FedAvg.capabilities - {"linear", "robust"})

    @classmethod
    def sweep_preset(cls, cfg: Any) -> dict[str, dict]:
        """β over the text's recommended 0.3–0.7 and γ over N/3–N/2 (N = clients per
        round)."""
        n = cfg.clients.sampled_count()
        return {"algorithm.beta": {"uniform": [0.3, 0.7]},
                "algorithm.gamma": {"uniform": [max(1.0, n / 3), max(1.0, n / 2)]}}

    @classmethod
    def report_sections(cls, run: dict[str, Any], out_dir: str) -> list[ReportSection]:
        """§5.2's diagnostics: norm histograms and skewness, norm vs accuracy gain, rank
        stability, weights and coefficients by rank."""
        import fedray.methods.orders.diagnostics as diagnostics

        if not diagnostics.applies(run["clients"]):
            return []
        data = diagnostics.summarize(run["clients"])
        text = "\n".join(f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}"
                         for k, v in data.items())
        return [ReportSection("orders", "ORDERS diagnostics", text,
                              diagnostics.plots(run["clients"], out_dir, run["label"]), data)]

    def finish(self, ctx: ClientContext, out: ClientOutput, broadcast, trained) -> ClientOutput:
        """FedAvg's output with the update's float64 norm: a metric, and (without
        transforms) the ``orders.norm`` entry of the upload."""
        p = self.params
        names = list(broadcast)
        delta = np.concatenate([out.upload[k].reshape(-1) for k in names])[None, :]
        prev = np.concatenate([np.asarray(broadcast[k]).reshape(-1) for k in names])
        mask = key_layer_mask(broadcast, p.key_layers) if p.norm == "key_layer" else None
        norm = update_norms(delta, p, prev, mask)[0]
        out.metrics["update_norm"] = float(norm)
        if p.client_norms and not self.cfg.payload.transforms:
            # with transforms the server ranks the decoded update it averages (its own norm)
            upload = dict(out.upload)
            upload["orders.norm"] = encode_norm(norm)  # float64 bits as int64: exact
            out.upload = upload
        return out

    def make_policy(self) -> OrdersPolicy:
        return OrdersPolicy(self.params, self.cfg.seed, self.cfg.tier_of,
                            self.make_optimizer())
