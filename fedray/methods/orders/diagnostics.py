"""ORDERS diagnostics for ``fedray report`` (§5.2 of the text): per-round norm histograms
with skewness (healthy = right-skewed), norm vs local accuracy gain ΔAcc_i (accuracy on the
client's local test split after its update minus before; needs
``eval.local_before_after=true``), rank stability (per-client std of its rank), and the
weights and coefficients by rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedray.methods.orders.policy import skewness
from fedray.observe.plots import FRACTION, UP, axis_label, pyplot, save

# the norm algorithm.norm chose (L2 by default), in the parameters' own units
NORM = axis_label("update norm ‖Δθ_i‖", "algorithm.norm, parameter units")


def applies(clients: pd.DataFrame | None) -> bool:
    return clients is not None and "orders/norm" in clients


def summarize(clients: pd.DataFrame) -> dict[str, Any]:
    c = clients.dropna(subset=["orders/norm"])
    skew = c.groupby("round")["orders/norm"].apply(lambda s: skewness(s.values))
    ranked = c.dropna(subset=["orders/rank"])
    rank_std = ranked.groupby("client_id")["orders/rank"].std().dropna()
    out = {"mean_norm_skewness": float(skew.mean()),
           "mean_rank_std": float(rank_std.mean()) if len(rank_std) else None,
           "negative_coefficient_share": float((ranked["orders/coefficient"] < 0).mean())}
    if {"acc_before", "acc_after"} <= set(c.columns):
        gain = c["acc_after"] - c["acc_before"]
        ok = gain.notna()
        if ok.sum() > 2:
            out["norm_gain_correlation"] = float(np.corrcoef(c["orders/norm"][ok], gain[ok])[0, 1])
    return out


def plots(clients: pd.DataFrame, out_dir: str, label: str) -> list[str]:
    plt = pyplot()
    c = clients.dropna(subset=["orders/norm"])
    rounds = sorted(c["round"].unique())
    pick = sorted({rounds[0], rounds[len(rounds) // 2], rounds[-1]})
    paths = []

    fig, axes = plt.subplots(1, len(pick), figsize=(4 * len(pick), 3.2), squeeze=False)
    for ax, r in zip(axes[0], pick, strict=True):
        v = c[c["round"] == r]["orders/norm"].values
        ax.hist(v, bins=min(30, max(5, v.size // 2)), color="tab:blue", alpha=0.8)
        ax.set(title=f"round {r}: skewness {skewness(v):.2f}", xlabel=NORM)
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes[0][0].set_ylabel("clients (count)")
    fig.suptitle(f"{label}: ORDERS update norms per client, first / middle / last round "
                 "(healthy = right-skewed, skewness > 0)")
    paths.append(save(fig, out_dir, "orders_norm_histograms.png", dpi=110))

    if {"acc_before", "acc_after"} <= set(c.columns):
        gain = c["acc_after"] - c["acc_before"]
        fig, ax = plt.subplots(figsize=(5, 4))
        sc = ax.scatter(c["orders/norm"], gain, c=c["round"], s=12, cmap="viridis")
        fig.colorbar(sc, label="round")
        ax.axhline(0, color="grey", lw=0.8, ls="--", label="no gain")
        ax.legend(fontsize=8)
        ax.set(title=f"{label}: does a larger update help its client?\n(update norm vs "
                     "local accuracy gain, one dot per client and round)", xlabel=NORM,
               ylabel=axis_label("local accuracy gain ΔAcc_i = after − before",
                                 FRACTION, UP))
        paths.append(save(fig, out_dir, "orders_norm_vs_gain.png", dpi=110))

    ranked = c.dropna(subset=["orders/rank"])
    if len(ranked):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        std = ranked.groupby("client_id")["orders/rank"].agg(["mean", "std"]).sort_values(
            "mean")
        axes[0].bar(range(len(std)), std["std"].fillna(0).values, color="tab:orange")
        axes[0].set(title="Rank stability: sd of each client's rank over rounds",
                    xlabel="clients, sorted by mean rank (left = largest norms)",
                    ylabel=axis_label("sd of rank", "ranks", "↓ more stable"))
        by_rank = ranked.groupby("orders/rank")[["orders/weight", "orders/coefficient"]].mean()
        axes[1].plot(by_rank.index, by_rank["orders/weight"], marker=".", label="w_k")
        axes[1].plot(by_rank.index, by_rank["orders/coefficient"], marker=".",
                     label="coefficient of Δθ_{i_k}")
        axes[1].axhline(0, color="grey", lw=0.8)
        axes[1].set(title="Weights and update coefficients by rank (mean over rounds)",
                    xlabel="rank k (1 = largest smoothed update norm)",
                    ylabel="weight / coefficient (unitless)")
        axes[1].legend(fontsize=8)
        fig.suptitle(f"{label}: ORDERS ranking")
        paths.append(save(fig, out_dir, "orders_ranks_and_weights.png", dpi=110))
    return paths
