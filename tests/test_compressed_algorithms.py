"""Top-k and PowerSGD FedAvg through the real runtime: exact upload bytes, error feedback
kept in the client state store, and the server's decompress-then-average."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedray.compression import Compressor
from fedray.policies.compressed import CompressedFedAvgPolicy


def test_policy_decompresses_then_averages():
    g = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    comp = Compressor("topk", density=0.25)
    d1 = {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
    d2 = {"w": -np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
    ups = [(c, 1, comp.compress(d, None, seed=0, round=1, client=c).upload)
           for c, d in enumerate([d1, d2])]
    new, _ = CompressedFedAvgPolicy(comp).aggregate(g, ups, 1)
    expect = (comp.decompress(ups[0][2], {"w": (4, 3), "b": (3,)})["w"]
              + comp.decompress(ups[1][2], {"w": (4, 3), "b": (3,)})["w"]) / 2
    assert np.allclose(new["w"], expect)


@pytest.mark.ray
@pytest.mark.parametrize("algo,extra", [("topk", {"algorithm.density": 0.1}),
                                        ("powersgd", {"algorithm.rank": 2})])
def test_compressed_runs_with_error_feedback(ray_session, tiny_cfg, tmp_path, algo, extra):
    from fedray.payload import Payload
    from fedray.runtime import run_experiment
    from fedray.runtime.storage import Storage

    cfg = tiny_cfg(**{"algorithm.name": algo, "rounds": 3, **extra})
    summary = run_experiment(cfg, str(tmp_path / algo), progress=False)
    storage = Storage(str(tmp_path / algo))
    ck = storage.read_checkpoint()
    assert set(ck["versions"]) == set(range(6))
    state = storage.read_state(f"client_state/000000/{ck['versions'][0]:06d}.npz")
    assert set(state["error"]) == set(ck["global_state"])
    assert any(np.abs(e).sum() > 0 for e in state["error"].values())
    comp = Compressor(algo, density=extra.get("algorithm.density", 0.1),
                      rank=extra.get("algorithm.rank", 2))
    shapes = {k: v.shape for k, v in ck["global_state"].items()}
    upload, *_ = comp.compress({k: np.ones(s, np.float32) for k, s in shapes.items()}, None,
                               seed=0, round=1, client=0)
    expected = Payload.encode(upload).nbytes
    clients = pq.read_table(tmp_path / algo / "clients.parquet").to_pandas()
    trained = clients[clients["sampled"]]
    assert (trained["upload_bytes"] == expected).all()
    assert expected < Payload.encode(ck["global_state"]).nbytes / 2
    assert summary["final_global_accuracy"] > 0.2
