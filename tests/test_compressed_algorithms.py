"""Top-k and PowerSGD FedAvg, and ``payload.transforms`` chains on FedAvg, FedProx and
ORDERS, through the real runtime: exact upload bytes, error feedback kept in the client
state store, the runtime's decode-then-aggregate, resume."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.wire.compression import powersgd_compress, topk_compress, topk_decompress
from fedray.wire.transforms import PowerSGD, TopK, TransformChain


def test_chain_decode_then_average_equals_decompress_then_average():
    g = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    chain = TransformChain([TopK(0.25)])
    shapes = {k: v.shape for k, v in g.items()}
    d1 = {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
    d2 = {"w": -np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
    ups = [(c, 1, chain.client(d, shapes, None, seed=0, round=1, client=c)[0])
           for c, d in enumerate([d1, d2])]
    new, _ = FedAvgPolicy().aggregate(g, [(c, n, chain.server(u, shapes)) for c, n, u in ups],
                                      1)
    expect = (topk_decompress(ups[0][2], shapes)["w"]
              + topk_decompress(ups[1][2], shapes)["w"]) / 2
    assert np.array_equal(new["w"], expect)


@pytest.mark.ray
@pytest.mark.parametrize("algo,extra", [("topk", {"algorithm.density": 0.1}),
                                        ("powersgd", {"algorithm.rank": 2})])
def test_compressed_runs_with_error_feedback(ray_session, tiny_cfg, tmp_path, algo, extra):
    from fedray.core import checkpoint
    from fedray.core.storage import Storage
    from fedray.runtime import run_experiment
    from fedray.wire.payload import Payload

    cfg = tiny_cfg(**{"algorithm.name": algo, "rounds": 3, **extra})
    summary = run_experiment(cfg, str(tmp_path / algo), progress=False)
    storage = Storage(str(tmp_path / algo))
    ck = checkpoint.read(storage)
    assert set(ck["clients"]["versions"]) == set(range(6))
    version = ck["clients"]["versions"][0]
    state = storage.read_state(f"client_state/00000/00000000/{version:06d}.npz")
    error = state["transforms"]["error"]
    assert set(error) == set(ck["server"]["params"])
    assert any(np.abs(e).sum() > 0 for e in error.values())
    shapes = {k: v.shape for k, v in ck["server"]["params"].items()}
    ones = {k: np.ones(s, np.float32) for k, s in shapes.items()}
    upload = topk_compress(ones, None, extra["algorithm.density"]).upload if algo == "topk" \
        else powersgd_compress(ones, None, extra["algorithm.rank"], None, seed=0, round=1,
                               client=0).upload
    expected = Payload.encode(upload).nbytes
    clients = pq.read_table(tmp_path / algo / "clients.parquet").to_pandas()
    trained = clients[clients["sampled"]]
    assert (trained["upload_bytes"] == expected).all()
    assert expected < Payload.encode(ck["server"]["params"]).nbytes / 2
    assert summary["final_global_accuracy"] > 0.2


def test_transform_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"payload.transforms.*transforms\[1\]"):
        load_config(None, ["payload.transforms=[topk, int3]"])
    with pytest.raises(ConfigError, match="payload.upload"):
        load_config(None, ["payload.transforms=[topk]", "payload.upload=int8"])
    with pytest.raises(ConfigError,
                       match="lacks the 'transforms' capability.*methods with it: .*fedavg"):
        load_config(None, ["payload.transforms=[topk]", "algorithm.name=drod",
                           "model.name=sliceable_resnet18"])


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "orders"])
def test_transform_chain_on_any_method(ray_session, tiny_cfg, tmp_path, algo):
    """``payload.transforms=[topk, int8]`` on FedAvg, FedProx and ORDERS: every upload is
    exactly the chain's encoding (bytes counted from it), the error memory is kept, the
    model learns, and a resumed run ends bitwise where an uninterrupted one does. ORDERS
    then ranks by the norm of the decoded update the server averages (no client norm)."""
    from conftest import full_and_resumed

    from fedray.core import checkpoint
    from fedray.core.storage import Storage
    from fedray.observe.metrics import read_metrics
    from fedray.wire.payload import Payload
    from fedray.wire.transforms import Quantize

    extra = {"algorithm.combine": "rank_mean"} if algo == "orders" else {}  # the usable one
    cfg = tiny_cfg(**{"algorithm.name": algo, "rounds": 4,
                      "payload.transforms": "[{name: topk, density: 0.2}, int8]", **extra})
    full, resumed = full_and_resumed(cfg, tmp_path)
    storage = Storage(str(tmp_path / "full"))
    ck = checkpoint.read(storage)
    shapes = {k: v.shape for k, v in ck["server"]["params"].items()}
    chain = TransformChain([TopK(0.2), Quantize(8)])
    dummy = {k: np.ones(s, np.float32) for k, s in shapes.items()}  # ORDERS: no norm sent,
    upload = chain.client(dummy, shapes, None, seed=0, round=1, client=0)[0]
    clients = read_metrics(str(tmp_path / "full"), "clients").to_pandas()
    trained = clients[clients["sampled"]]
    assert (trained["upload_bytes"] == Payload.encode(upload).nbytes).all()
    dense = Payload.encode(ck["server"]["params"]).nbytes
    assert trained["upload_bytes"].max() < dense / 3
    assert (trained["sent_quantized"] > 0).all() and (trained["sent_indices"] > 0).all()
    version = ck["clients"]["versions"][0]
    state = storage.read_state(f"client_state/00000/00000000/{version:06d}.npz")
    assert set(state["transforms"]["error"]) == set(shapes)
    assert full["final_global_accuracy"] > 0.2
    a = checkpoint.read(Storage(str(tmp_path / "full")))["server"]["params"]
    b = checkpoint.read(Storage(str(tmp_path / "cut")))["server"]["params"]
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_state_written_before_the_chain_keeps_its_memory():
    """topk/powersgd client states of the previous layout ({error, q, optimizer}) are read
    in the chain's layout: error feedback and PowerSGD's warm start survive a resume."""
    from fedray.core.registry import build_method

    err, q = {"w": np.ones((4, 3), np.float32)}, {"w": np.zeros((3, 2), np.float32)}
    alg = build_method(load_config(None, ["algorithm.name=powersgd", "algorithm.rank=2"]))
    new = alg.upgrade_state({"error": err, "q": q, "optimizer": None})
    assert new == {"transforms": {"error": err, "stages": {"0.powersgd": q}}}
    assert alg.upgrade_state(new) is new
    shapes = {"w": (4, 3)}
    a = alg.update_chain().client({"w": np.full((4, 3), 0.5, np.float32)}, shapes,
                                  new["transforms"], seed=0, round=2, client=1)
    b = TransformChain([PowerSGD(2)]).client(
        {"w": np.full((4, 3), 0.5, np.float32)}, shapes,
        {"error": err, "stages": {"0.powersgd": q}}, seed=0, round=2, client=1)
    assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
    topk = build_method(load_config(None, ["algorithm.name=topk"]))
    assert topk.upgrade_state({"error": err, "q": {}, "optimizer": None}) == {
        "transforms": {"error": err, "stages": {}}}
