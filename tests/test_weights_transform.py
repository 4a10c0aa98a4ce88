"""The ``weights`` transform: int4 FedAvg of *weights* (the FLITE paper's "int4 full-weight
FedAvg", §5.9), not of updates. Its defining rule — the server reconstructs
dequantize(quantize(θ_local)) − θ_global, so the quantization error is on the weights —
exact bytes, its place in the chain, config errors, and a short run on Ray."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.wire.payload import Payload, dequantize, quantize
from fedray.wire.transforms import Quantize, TransformChain, Weights, parse_transforms

SHAPES = {"conv": (8, 3, 3, 3), "fc": (40, 25), "bias": (7,)}


def dyadic(seed: int, scale: float) -> dict[str, np.ndarray]:
    """Tensors of multiples of 2^-12 below 2^4 in magnitude: sums and differences of two of
    them are exact in float32, so θ_g + (θ_l − θ_g) == θ_l bit for bit."""
    g = np.random.default_rng(seed)
    return {k: (np.rint(g.standard_normal(s) * scale * 4096) / 4096).astype(np.float32)
            for k, s in SHAPES.items()}


def test_server_gets_dequantized_weights_minus_broadcast_and_bytes_are_exact():
    w_global = dyadic(0, 1.0)
    w_local = {k: v + dyadic(1, 0.01)[k] for k, v in w_global.items()}  # a small update
    delta = {k: w_local[k] - w_global[k] for k in SHAPES}
    assert all(np.array_equal(w_global[k] + delta[k], w_local[k]) for k in SHAPES)
    chain = TransformChain(parse_transforms(["weights", "int4"]), error_feedback=False)
    assert chain.needs_reference and not chain.stateful
    upload, memory, sent = chain.client(delta, SHAPES, None, seed=0, round=1, client=3,
                                        reference=w_global)
    # the wire holds the int4 codes of the local *weights*, nothing else
    assert list(upload) == [f"{k}{s}" for k in SHAPES for s in (".q", ".scale")]
    for k in SHAPES:
        q, sz = quantize(w_local[k], 4)
        assert upload[k + ".q"].tobytes() == q.tobytes()
        assert upload[k + ".scale"].tobytes() == sz.tobytes()
    decoded = chain.server(upload, SHAPES, reference=w_global)
    for k, s in SHAPES.items():
        q, sz = quantize(w_local[k], 4)
        want = dequantize(q, sz, 4, int(np.prod(s))).reshape(s) - w_global[k]
        assert decoded[k].tobytes() == want.tobytes()
        # the error is a share of the weights' range, far larger than the update itself
        err = np.abs(decoded[k] - delta[k]).max()
        assert err <= (w_local[k].max() - w_local[k].min()) / 15 / 2 * (1 + 1e-5)
    assert max(np.abs(decoded[k] - delta[k]).max() for k in SHAPES) > \
        max(np.abs(delta[k]).max() for k in SHAPES)
    # quantizing the update instead ("int4" alone) keeps the error within the update's range
    d_chain = TransformChain([Quantize(4)], error_feedback=False)
    d_up = d_chain.client(delta, SHAPES, None, seed=0, round=1, client=3)[0]
    d_dec = d_chain.server(d_up, SHAPES)
    assert max(np.abs(d_dec[k] - delta[k]).max() for k in SHAPES) < \
        max(np.abs(delta[k]).max() for k in SHAPES)
    # bytes: the same codes + scales as int4 of the update, counted from the wire
    nbytes = Payload.encode(upload, "fp32").nbytes
    assert nbytes == Payload.encode(d_up, "fp32").nbytes
    codes = sum((int(np.prod(s)) + 1) // 2 for s in SHAPES.values())
    assert sum(a.nbytes for a in upload.values()) == codes + 8 * len(SHAPES)
    assert sent == {"sent_values": 2.0 * len(SHAPES), "sent_indices": 0.0,
                    "sent_quantized": float(sum(np.prod(s) for s in SHAPES.values()))}
    assert memory == {"stages": {}}


def test_alone_it_is_lossless_and_with_error_feedback_it_telescopes():
    w_global = dyadic(2, 1.0)
    delta = dyadic(3, 0.01)
    plain = TransformChain([Weights()], error_feedback=False)
    up = plain.client(delta, SHAPES, None, seed=0, round=1, client=0, reference=w_global)[0]
    back = plain.server(up, SHAPES, reference=w_global)
    assert all(np.array_equal(back[k], delta[k]) for k in SHAPES)
    chain = TransformChain(parse_transforms(["weights", "int4"]), error_feedback=True)
    memory, total, sent = None, {k: 0.0 for k in SHAPES}, {k: 0.0 for k in SHAPES}
    for r in range(3):
        d = dyadic(10 + r, 0.01)
        up, memory, _ = chain.client(d, SHAPES, memory, seed=0, round=r, client=0,
                                     reference=w_global)
        dec = chain.server(up, SHAPES, reference=w_global)
        for k in SHAPES:
            total[k] = total[k] + d[k]
            sent[k] = sent[k] + dec[k]
    for k in SHAPES:
        np.testing.assert_allclose(total[k] - sent[k], memory["error"][k], atol=1e-5)


def test_place_in_chain_reference_and_config_errors():
    with pytest.raises(ValueError, match="first transform"):
        parse_transforms(["int4", "weights"])
    with pytest.raises(ValueError, match="first stage"):
        TransformChain([Quantize(4), Weights()])
    chain = TransformChain([Weights(), Quantize(4)])
    with pytest.raises(ValueError, match="needs the broadcast"):
        chain.client(dyadic(0, 1.0), SHAPES, None, seed=0, round=1, client=0)
    with pytest.raises(ValueError, match="no tensor 'fc'"):
        chain.client(dyadic(0, 1.0), SHAPES, None, seed=0, round=1, client=0,
                     reference={"conv": np.zeros(SHAPES["conv"], np.float32)})
    with pytest.raises(ConfigError, match="payload.transforms.*first transform"):
        load_config(None, ["payload.transforms=[int4, weights]"])
    with pytest.raises(ConfigError, match="payload.transforms.*compressing method"):
        load_config(None, ["algorithm.name=topk", "payload.transforms=[weights, int4]"])
    cfg = load_config(None, ["algorithm.name=fedavg", "payload.transforms=[weights, int4]",
                             "payload.error_feedback=false"])
    assert cfg.payload.transforms == ["weights", "int4"]


@pytest.mark.ray
def test_int4_weight_fedavg_on_ray_averages_dequantized_weights(ray_session, tiny_cfg,
                                                                tmp_path):
    """One client, server_lr 1: the new global state is θ_0 + (dq(q(θ_1)) − θ_0), i.e. each
    tensor sits on its client's 16-level int4 grid; every upload's bytes are exactly the
    chain's encoding, and the decoded upload is not the delta the client trained."""
    from fedray.core import checkpoint
    from fedray.core.storage import Storage
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    cfg = tiny_cfg(**{"algorithm.name": "fedavg", "rounds": 2, "clients.num_clients": 1,
                      "data.partition": "iid",
                      "runtime.tiers": "[{name: default, executors: 1, num_cpus: 0.5}]",
                      "payload.transforms": "[weights, int4]",
                      "payload.error_feedback": "false"})
    run_experiment(cfg, str(tmp_path / "w4"), progress=False)
    ck = checkpoint.read(Storage(str(tmp_path / "w4")))
    state = ck["server"]["params"]
    for k, t in state.items():
        if t.size < 2 or t.max() == t.min():
            continue
        steps = (t - t.min()) / ((t.max() - t.min()) / 15)  # the grid of the last upload
        np.testing.assert_allclose(steps, np.rint(steps), atol=2e-3, err_msg=k)
        assert len(np.unique(np.rint(steps))) <= 16
    shapes = {k: v.shape for k, v in state.items()}
    chain = TransformChain(parse_transforms(["weights", "int4"]), error_feedback=False)
    zeros = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    upload = chain.client(zeros, shapes, None, seed=0, round=1, client=0, reference=state)[0]
    clients = read_metrics(str(tmp_path / "w4"), "clients").to_pandas()
    trained = clients[clients["sampled"]]
    assert len(trained) == 2
    assert (trained["upload_bytes"] == Payload.encode(upload).nbytes).all()
    assert (trained["sent_quantized"] == sum(v.size for v in state.values())).all()


@pytest.mark.ray
def test_int4_weights_under_fedbuff_uses_each_uploads_own_broadcast(ray_session, tiny_cfg,
                                                                   tmp_path):
    """Asynchronous rule (a smoke test of the driver's other decode path): stale uploads
    are decoded against the broadcast their client started from; the run completes with
    stale uploads, every upload has the same byte count, and the model still learns."""
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    cfg = tiny_cfg(**{"algorithm.name": "fedbuff", "algorithm.concurrency": 4,
                      "algorithm.buffer_size": 2, "rounds": 4,
                      "payload.transforms": "[weights, int4]",
                      "payload.error_feedback": "false"})
    summary = run_experiment(cfg, str(tmp_path / "buff"), progress=False)
    clients = read_metrics(str(tmp_path / "buff"), "clients").to_pandas()
    done = clients[clients["sampled"]]
    assert len(done) >= 8 and (done["upload_bytes"] == done["upload_bytes"].iloc[0]).all()
    assert (done["staleness"] > 0).any()
    assert summary["final_global_accuracy"] > 0.2
