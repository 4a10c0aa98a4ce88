"""Secure aggregation in the round (issue #32, the wiring): the ``secagg`` section's checks
before Ray, :class:`SecureAggregator` on real uploads (the unmasked sum equals the plain sum
of the included clients' quantized updates, with dropouts at every phase; central DP's
release from it), and runs through Ray: SecAgg+ bitwise equal to the same quantized sum in
the clear, bitwise across executor counts and ``--resume``, bytes on the ledger per phase,
failed protocol rounds leaving the model unchanged, the report's cost plot."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import full_and_resumed
from test_robust import refused
from test_runtime import final_state, run_outputs, runs_across_executors

from fedray.core.config import load_config
from fedray.core.seeding import rng
from fedray.methods.base import ClientResult, Status
from fedray.runtime.sync_loop import secure_begin
from fedray.services.privacy import CentralDP
from fedray.services.secagg import PHASES, dequantize, quantize
from fedray.services.secure_round import SecAggConfig, SecureAggregator

ON = "secagg.enabled=true"


@pytest.mark.parametrize("extra, path, rule", [
    ([ON, "secagg.protocol=secagg", "secagg.threshold=5"], "secagg.threshold", "at most 4"),
    ([ON, "secagg.bits=8", "secagg.clip=1.0", "secagg.scale=100"], "secagg.bits",
     "at least 10: the sum of 5 clients' coordinates, each clipped to secagg.clip = ±1 and "
     "scaled by secagg.scale = 100.0, reaches ±500"),
    ([ON, "secagg.bits=3"], "secagg.bits", "at least 4"),
    ([ON, "robust.rule=median"], "robust.rule", "only their sum"),
    ([ON, "algorithm.name=orders"], "secagg.enabled", "'linear' capability"),
    ([ON, "algorithm.name=fedbuff", "algorithm.concurrency=3", "algorithm.buffer_size=2"],
     "secagg.enabled", "synchronous round"),
    ([ON, "runtime.reduce=executors"], "runtime.reduce", "in the clear"),
    ([ON, "secagg.degree=3", "clients.num_clients=20", "clients.per_round=12"],
     "secagg.degree", "even"),
    ([ON, "clients.per_round=1"], "clients.per_round", "at least 2"),
    ([ON, "secagg.dropout=1.0"], "secagg.dropout", "< 1"),
    ([ON, "secagg.protocol=none", "secagg.dropout=0.1"], "secagg.dropout", "protocol=none"),
    ([ON, "secagg.protocol=secagg", "secagg.degree=4"], "secagg.degree", "graph degree"),
    ([ON, "secagg.protocol=secagg", "secagg.threshold=5", "fleet.overcommit=1.0"],
     "secagg.threshold", "at most 4: each client's secrets are shared among its neighbours "
     "and at most 4 of them answer the unmasking (clients.per_round 5, secagg, of the 6 "
     "clients sampled only the first 5 to report"),
])
def test_bad_secagg_configs_are_one_line_before_ray(extra, path, rule):
    refused(extra, path, rule)


def test_bits_clip_and_scale_checked_together():
    s = SecAggConfig(enabled=True, bits=16, clip=0.5)
    scale = s.resolved_scale(100)  # the largest whose sum of 100 cannot wrap
    assert 100 * np.ceil(0.5 * scale) <= 2 ** 15 - 1
    assert 100 * np.ceil(0.5 * (scale + 2 / 0.5)) > 2 ** 15 - 1
    x = rng(0, purpose="t").uniform(-0.5, 0.5, (100, 7))
    words = [quantize(v, 0.5, scale, 16, rng(1, i, purpose="q")) for i, v in enumerate(x)]
    total = np.zeros(7, np.uint64)
    for w in words:
        total = (total + w) & np.uint64(0xFFFF)
    assert np.allclose(dequantize(total, scale, 16), x.sum(0), atol=100 / scale)
    assert SecAggConfig(enabled=True, bits=4).resolved_scale(8) is None  # 7 // 8 = 0


def _round(cfg, uploads: dict[int, dict], privacy=None, r: int = 1, online=None, late=(),
           nan=()):
    """One round of ``cfg``'s SecureAggregator over every sampled client's upload; the
    ``late`` ones miss the fleet's deadline, the ``nan`` ones hold NaN (rejected)."""
    agg = SecureAggregator(cfg, privacy)
    sampled = sorted(uploads)
    final = {c: ClientResult(c, r, Status.OK, 10) for c in sampled}
    m = agg.vector({}, uploads[sampled[0]])[1].size
    secure_begin(agg, r, sampled, final, m, set(nan))
    for c in late:
        final[c].status = Status.LATE
    for c in nan:
        final[c].status = Status.REJECTED
    accepted = [(c, 10, uploads[c]) for c in sampled if final[c].ok]
    until = {c: np.inf for c in sampled} | (online or {})
    res = agg.run(r, {}, sampled, accepted, lambda ids, d, u: (d + u) / 1e5 + 0.05, until, 0.0)
    return agg, final, res


def _uploads(n: int, seed: int = 0) -> dict[int, dict]:
    g = rng(seed, purpose="uploads")
    return {c: {"w": g.uniform(-1, 1, (3, 4)).astype(np.float32),
                "b": g.uniform(-1, 1, 4).astype(np.float32)} for c in range(n)}


def _plain_sum(agg, uploads, included, r=1):
    """The included clients' quantized vectors summed in the clear, as floats."""
    total = np.zeros(16, np.uint64)
    mod = np.uint64((1 << agg.s.bits) - 1)
    for c in included:
        flat = agg.vector({}, uploads[c])[1]
        total = (total + quantize(flat, agg.s.clip, agg.scale, agg.s.bits,
                                  rng(agg.seed, r, c, "secagg-quant"))) & mod
    return dequantize(total, agg.scale, agg.s.bits)


def _cfg(*extra):
    return load_config(None, ["clients.num_clients=20", "clients.per_round=12", ON, *extra])


def test_the_unmasked_sum_is_the_included_clients_quantized_sum_at_every_dropout():
    """No dropout: SecAgg, SecAgg+ and the clear sum agree bit for bit. With dropouts before
    sharing, the fleet's before the masked input, and before unmasking (random and by
    availability), the sum is exactly that of the clients whose masked input arrived."""
    ups = _uploads(12)
    totals = {}
    for proto in ("secagg", "secagg_plus", "none"):
        agg, final, res = _round(_cfg(f"secagg.protocol={proto}"), ups)
        assert not res.failed and res.included == list(range(12))
        totals[proto] = np.concatenate([res.total["w"].ravel(), res.total["b"]])
        assert np.array_equal(totals[proto], _plain_sum(agg, ups, range(12)))
        assert all(final[c].upload_bytes == (32 * 16 + 7) // 8 for c in range(12))
    assert np.array_equal(totals["secagg"], totals["none"])
    assert np.array_equal(totals["secagg_plus"], totals["none"])

    cfg = _cfg("secagg.protocol=secagg_plus", "secagg.dropout=0.2", "secagg.threshold=3",
               "seed=4")  # 5's session ends before unmasking; 8 misses the deadline; 9 NaN
    agg, final, res = _round(cfg, ups, online={5: -1.0}, late=(8,), nan=(9,))
    gone = [c for c in range(12) if final[c].status is Status.DROPPED]
    assert gone and 8 not in gone and all(final[c].upload_bytes == 0 for c in gone)
    assert final[9].upload_bytes == 0  # checked before masking: nothing sent
    assert res.left["share"] == len(gone) and res.left["unmask"] >= 1
    assert res.left["masked_input"] == 2  # 8 and 9: pairwise masks removed through shares
    assert 5 in res.included  # its masked input arrived; its mask seed opened by shares
    assert res.included == [c for c in range(12) if c not in gone and c not in (8, 9)]
    assert not res.failed
    flat = np.concatenate([res.total["w"].ravel(), res.total["b"]])
    assert np.array_equal(flat, _plain_sum(agg, ups, res.included))
    assert all(res.up["advertise"][c] == 64 for c in range(12))  # everyone advertised
    assert all(res.up["share"][c] == 0 for c in gone)
    assert set(res.row()) >= {f"secagg/{ph}_{x}" for ph in PHASES
                              for x in ("up_bytes", "down_bytes", "seconds")}
    assert res.seconds["unmask"] > 0 and res.seconds["advertise"] >= 0.05


def test_too_few_survivors_fail_the_round_as_the_protocol_does():
    cfg = _cfg("secagg.protocol=secagg", "secagg.threshold=11", "secagg.dropout=0.3")
    _, _, res = _round(cfg, _uploads(12))
    assert res.failed and res.total is None and "threshold is 11" in res.reason
    _, _, res = _round(_cfg("secagg.protocol=none"), _uploads(3), nan=(0, 1, 2))
    assert res.failed and "no masked input" in res.reason


@pytest.mark.parametrize("proto", ["secagg", "secagg_plus"])
def test_over_commitment_surplus_leaves_the_default_threshold_reachable(proto):
    """20 sampled, the 10 first to report send inputs: the default t counts only the
    neighbours that can answer, so the round sums (t from all 19 would fail every time)."""
    cfg = _cfg(f"secagg.protocol={proto}", "clients.per_round=10", "fleet.overcommit=1.0")
    for seed in range(3):
        late = set(np.random.default_rng(seed).choice(20, 10, replace=False).tolist())
        agg, _, res = _round(cfg, _uploads(20, seed), r=seed + 1, late=late)
        assert not res.failed, res.reason
        assert res.included == sorted(set(range(20)) - late)


def test_central_dp_adds_its_noise_after_unmasking():
    """The clients clip their updates (and send whether they were within C, for adaptive
    clipping) before quantizing; the server's release from the unmasked sum equals DP's
    own release from the clipped sum up to the quantization error, with the same noise."""
    extra = ["secagg.protocol=secagg_plus", "secagg.bits=48", "dp.enabled=true",
             "dp.noise_multiplier=0.7", "dp.clip_norm=1.5", "dp.adaptive_clip=true"]
    cfg = _cfg(*extra)
    ups = {c: {k: v * (5 if c == 3 else 0.2) for k, v in u.items()}
           for c, u in _uploads(12, seed=4).items()}  # 3 is outside C: clipped

    def dp():
        return CentralDP(cfg, lambda g, u: dict(u), lambda g, d: d)

    privacy = dp()
    agg, _, res = _round(cfg, ups, privacy)
    assert res.within == 11  # all but client 3
    slack = agg.sensitivity_slack(res.elements)
    assert res.elements == 16 and slack == 4 / agg.scale
    secure, m1 = privacy.release({}, res.total, res.within, len(res.included), 1, slack)
    plain, m2 = dp().privatize({}, list(ups.values()), 1)
    assert m1.pop("dp_noise_std") == privacy.z_update * (1.5 + slack) / 12 > m2.pop(
        "dp_noise_std")
    assert m1 == m2  # same adaptive count (within is exact), same ε
    for k in plain:
        assert np.allclose(secure[k], plain[k], atol=12 / agg.scale + 1e-6)
    assert agg.masked_bytes(16) == (48 * 17 + 7) // 8  # the count word travels too


def rounds_sum_to_totals(r) -> bool:
    return r["cum_upload_bytes"].iloc[-1] == r["upload_bytes"].sum() and \
        r["cum_download_bytes"].iloc[-1] == r["download_bytes"].sum()


@pytest.mark.ray
def test_secure_runs_equal_the_clear_quantized_sum_bitwise_across_executors_and_resume(
        ray_session, tiny_cfg, tmp_path):
    """SecAgg+ with dropouts at every phase on 1 and 2 executors, bitwise; the same run
    without dropouts equals the clear quantized sum (protocol none) bit for bit; every
    protocol byte on the ledger; a run with DP across a resume; the cost plot."""
    from fedray.runtime import run_experiment

    sec = {"secagg.enabled": "true", "clients.num_clients": 8, "clients.per_round": 7,
           "fleet.dropout": 0.15, "secagg.dropout": 0.2, "secagg.threshold": 3,
           "secagg.degree": 4}
    _, outputs = runs_across_executors(tiny_cfg, tmp_path, [1, 2, 3], **sec)
    rounds, clients = outputs[0]["rounds"], outputs[0]["clients"]
    assert rounds["secagg/left_share"].sum() > 0 and rounds["secagg/left_unmask"].sum() > 0
    assert (clients.status == "dropped").any()
    up = sum(rounds[f"secagg/{ph}_up_bytes"] for ph in PHASES)
    down = sum(rounds[f"secagg/{ph}_down_bytes"] for ph in PHASES)
    assert (rounds["upload_bytes"] == up).all()  # every byte a client sent is its upload
    assert (rounds["download_bytes"] > down).all()  # the model, plus the protocol's
    assert rounds_sum_to_totals(rounds)
    summary = outputs[0]["summary"]
    assert summary["secagg"]["protocol_bytes"] == up.sum() + down.sum() - rounds[
        "secagg/masked_input_up_bytes"].sum()
    sent = clients[clients.sampled]
    assert (sent[[f"secagg_{ph}_up_bytes" for ph in PHASES]].sum(axis=1)
            == sent["upload_bytes"]).all()

    clean = {"secagg.enabled": "true", "rounds": 2}
    for name, extra in [("plus", {}), ("clear", {"secagg.protocol": "none"})]:
        run_experiment(tiny_cfg(**clean, **extra), str(tmp_path / name), progress=False)
    a, b = final_state(tmp_path / "plus"), final_state(tmp_path / "clear")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    plus = run_outputs(tmp_path / "plus")["rounds"]
    assert (plus["sim_seconds"] > run_outputs(tmp_path / "clear")["rounds"]["sim_seconds"]
            ).all()  # the key and unmasking phases on the clock

    fleet = {"secagg.enabled": "true", "clients.per_round": 4, "fleet.overcommit": 0.5,
             "fleet.min_reports": 4, "fleet.dropout": 0.25, "rounds": 3}
    run_experiment(tiny_cfg(**fleet), str(tmp_path / "fleet"), progress=False)
    out = run_outputs(tmp_path / "fleet")
    r = out["rounds"]  # over-commitment's surplus sends no input; a fleet-failed round
    assert r["secagg/advertise_up_bytes"].gt(0).all()  # still paid for the key phases
    assert (r["secagg/included"] <= 4).all() and r["round_failed"].sum() >= 1
    assert out["summary"]["failed_rounds"] == int(r["round_failed"].sum())
    assert rounds_sum_to_totals(r)

    dp = tiny_cfg(**{"secagg.enabled": "true", "dp.enabled": "true",
                     "dp.noise_multiplier": 0.5, "dp.adaptive_clip": "true",
                     "secagg.threshold": 3, "secagg.dropout": 0.2, "rounds": 3})
    full_and_resumed(dp, tmp_path / "dp", stop_after=2)
    x, y = final_state(tmp_path / "dp" / "full"), final_state(tmp_path / "dp" / "cut")
    assert all(np.array_equal(x[k], y[k]) for k in x)
    out = run_outputs(tmp_path / "dp" / "full")
    r = out["rounds"]
    assert (r["round_failed"] == r["secagg/failed"]).all()  # the fleet failed none here
    assert r["secagg/failed"].sum() >= 1 and (r["secagg/failed"] == 0).any()
    assert out["summary"]["failed_rounds"] == int(r["secagg/failed"].sum())
    releases = out["summary"]["dp"]["releases"]
    assert releases == int((r["secagg/failed"] == 0).sum())  # a failed protocol releases nothing
    from fedray.front.report import report

    rep = report(str(tmp_path / "dp" / "full"), str(tmp_path / "rep"))
    (fig,) = [f for f in rep["figures"] if f["path"].endswith("secagg_costs.png")]
    assert len(fig["axes"]) == 2 and "bytes" in fig["axes"][0]["ylabel"]
