"""FLITE end to end: payload figures, latents through the runtime, the identity check every
round, quantized uploads, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_job
from typer.testing import CliRunner

from fedray.core.config import ConfigError, load_config
from fedray.front.cli import app
from fedray.models.pretrain import pretrain
from fedray.wire.payload import Payload

# data.split_seed: runs of any seed test on the split the base was pretrained on; half the
# train split pretrains it, so the clients' local test splits keep unseen samples to score
# (a base never scores on its training samples: checked before Ray starts)
PRE = ["model.name=cnn", "model.channels=[8,16]", "model.hidden=32", "pretrain.epochs=2",
       "pretrain.batch_size=64", "pretrain.warmup_epochs=1", "data.split_seed=0",
       "pretrain.fraction=0.5"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    pretrain(load_config(None, PRE), str(out), progress=False)
    return str(out)


def test_info_reproduces_the_papers_resnet18_figures():
    res = CliRunner().invoke(app, ["flite", "info", "--model", "resnet18", "--num-classes",
                                   "100", "--d", "64", "--r", "32", "--json"])
    info = json.loads(res.stdout)
    assert info["num_mapped_layers"] == 20 and info["D"] == 1280
    assert round(info["compression_ratio_mapped"]) == 8718
    assert info["payload_fp32_bytes"] == 5120 and info["payload_int4_bytes"] == 648
    assert info["payload_int8_bytes"] == 1288
    assert info["payload_int4_per_layer_scale_bytes"] == 20 * (32 + 8)


def test_server_and_client_agree_on_mapped_layers():
    from fedray.methods.flite.factors import mapped_layers
    from fedray.methods.flite.identity import mapped_names
    from fedray.models import build_model
    from fedray.models.training import get_state

    for name, shape in [("resnet18", (3, 32, 32)), ("cnn", (1, 8, 8))]:
        m = build_model(name, shape, 10)
        assert mapped_names(get_state(m), None) == mapped_layers(m)
        assert mapped_names(get_state(m), ["*.conv2.weight"] if name == "resnet18"
                            else ["0.weight"]) == mapped_layers(
            m, ["*.conv2.weight"] if name == "resnet18" else ["0.weight"])


def test_dp_delta_follows_the_layer_layout_not_the_arrival_order(base):
    """Per-layer uploads (``quant_scope: layer``) clip as one latent laid out in the
    mapping's layer order, whatever order the decoded dict has."""
    import numpy as np

    from fedray.core.registry import build_method

    cfg = load_config(None, PRE + ["algorithm.name=flite", f"algorithm.base={base}",
                                   "algorithm.d=4", "algorithm.r=2"])
    alg = build_method(cfg)
    layout = alg.make_policy().layout
    parts = {f"z/{n}": np.full(d, i, np.float32) for i, (n, d) in enumerate(layout)}
    backwards = dict(reversed(list(parts.items())))
    zero = {"z": np.zeros(sum(d for _, d in layout), np.float32)}
    want = np.concatenate([parts[f"z/{n}"] for n, _ in layout])
    assert len(layout) > 1
    np.testing.assert_array_equal(alg.to_delta(zero, backwards)["z"], want)
    np.testing.assert_array_equal(alg.from_delta(zero, alg.to_delta(zero, parts))["z"], want)


def test_bad_inputs(base):
    common = PRE + ["algorithm.name=flite", f"algorithm.base={base}"]
    cases = [(["algorithm.d=8", "algorithm.r=16"], "algorithm.r"),
             (["algorithm.d=0"], "algorithm.d"),
             (["algorithm.layers=[nothing.*]"], "algorithm.layers"),
             (["algorithm.d=4096", "algorithm.r=300"], "algorithm.r"),
             (["local.momentum=0.9"], "local.momentum")]
    for extra, field in cases:
        with pytest.raises(ConfigError) as e:
            load_config(None, common + extra)
        assert e.value.path == field, (extra, e.value)
    with pytest.raises(ConfigError, match="identity_check"):
        load_config(None, PRE + ["algorithm.name=flite"])


@pytest.mark.ray
@pytest.mark.parametrize("codec,scope", [("fp32", "vector"), ("int4", "vector"),
                                         ("int8", "layer")])
def test_flite_runs_with_identity_check(ray_session, tiny_cfg, base, tmp_path, codec, scope):
    from fedray.core import checkpoint
    from fedray.core.storage import Storage
    from fedray.runtime import run_experiment

    cfg = tiny_cfg(**{"model.name": "cnn", "model.channels": "[8,16]", "model.hidden": 32,
                      "algorithm.name": "flite", "algorithm.base": base, "algorithm.d": 16,
                      "algorithm.r": 8, "algorithm.quant_scope": scope, "data.split_seed": 0,
                      "payload.upload": codec, "rounds": 3})
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pandas()
    clients = pq.read_table(tmp_path / "run" / "clients.parquet").to_pandas()
    assert (rounds["policy/identity_error"] <= 1e-6).all()
    z = checkpoint.read(Storage(str(tmp_path / "run")))["server"]["params"]
    assert set(z) == {"z"} and z["z"].shape == (32,) and np.abs(z["z"]).sum() > 0
    upload = {"z": z["z"]} if scope == "vector" else {
        f"z/{n}": z["z"][i * 16:(i + 1) * 16] for i, n in enumerate(["0.weight", "3.weight"])}
    expected = Payload.encode(upload, codec).nbytes
    trained = clients[clients["sampled"]]
    assert (trained["upload_bytes"] == expected).all()
    if codec == "int4" and scope == "vector":
        assert expected - len(Payload.encode(upload, codec).header) == 32 // 2 + 8
    assert rounds["global_accuracy"].notna().all()


@pytest.mark.ray
def test_flite_cifar100_job_smoke(ray_session, tmp_path):
    summary = run_job(ray_session, "flite_cifar100.py", "--smoke", "--run-dir",
                      str(tmp_path / "job"))
    assert summary["algorithm"] == "flite" and summary["parameters"] == 1280
    assert (tmp_path / "job" / "base" / "base.npz").exists()
