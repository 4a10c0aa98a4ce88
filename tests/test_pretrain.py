"""Central pretraining (the shared base for fine-tuning) and fine-tuning from it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.models.heads import head_parameter_names
from fedray.models.pretrain import build_base_model, load_base, lr_at, pretrain

BASE = ["model.name=cnn", "model.channels=[8,16]", "model.hidden=32", "pretrain.epochs=4",
        "pretrain.batch_size=64", "pretrain.warmup_epochs=1", "pretrain.classes=[0,1,2,3,4]"]


def test_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 10, 5, 1, 0.05) for s in range(50)]
    assert lrs[0] == pytest.approx(0.005) and lrs[9] == pytest.approx(0.05)
    assert lrs[10] == pytest.approx(0.05) and lrs[-1] < 0.001
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lr_at(30, 10, 5, 1, 0.05) == pytest.approx(0.5 * 0.05 * (1 + math.cos(math.pi / 2)))


def test_pretrain_writes_base_and_resumes_exactly(tmp_path):
    cfg = load_config(None, BASE)
    meta = pretrain(cfg, str(tmp_path / "full"), progress=False)
    assert meta["test_accuracy"] > 0.5 and meta["classes"] == [0, 1, 2, 3, 4]
    assert json.loads((tmp_path / "full" / "base.json").read_text())["head"] == "orthogonal"

    class Stop(Exception):
        pass

    def stop_at_two(row):
        if row["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        pretrain(cfg, str(tmp_path / "cut"), progress=False, on_epoch=stop_at_two)
    pretrain(cfg, str(tmp_path / "cut"), resume=True, progress=False)
    a, _ = load_base(str(tmp_path / "full"))
    b, _ = load_base(str(tmp_path / "cut"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    head = [k for k in a if a[k].ndim == 2][-1]
    w = a[head]
    assert np.allclose(w @ w.T, np.eye(w.shape[0]), atol=1e-5)  # still the orthogonal init


def test_bad_pretrain_inputs(tmp_path):
    with pytest.raises(ConfigError, match="pretrain.classes"):
        pretrain(load_config(None, BASE + ["pretrain.classes=[3, 12]"]), str(tmp_path / "x"),
                 progress=False)
    with pytest.raises(ConfigError, match="algorithm.base"):
        load_config(None, ["algorithm.base=" + str(tmp_path / "nothing")])


@pytest.mark.ray
def test_finetune_from_base_counts_base_once_and_skips_frozen_head(ray_session, tiny_cfg,
                                                                  tmp_path):
    import pyarrow.parquet as pq

    from fedray.runtime import run_experiment
    from fedray.wire.payload import Payload

    pcfg = load_config(None, BASE + ["pretrain.epochs=2"])
    pretrain(pcfg, str(tmp_path / "base"), progress=False)
    cfg = tiny_cfg(**{"model.name": "cnn", "model.channels": "[8,16]", "model.hidden": 32,
                      "algorithm.base": str(tmp_path / "base"), "rounds": 2,
                      "data.split_seed": 0})
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    clients = pq.read_table(tmp_path / "run" / "clients.parquet").to_pandas()
    base, _ = load_base(str(tmp_path / "base"))
    model = build_base_model(pcfg, (1, 8, 8), 10)
    head = set(head_parameter_names(model))
    r1 = clients[clients["round"] == 1].sort_values("client_id")
    r2 = clients[clients["round"] == 2].sort_values("client_id")
    assert (r1["download_bytes"].values - r2["download_bytes"].values
            == Payload.encode(base).nbytes).all()
    uploaded = {k: v for k, v in base.items() if k not in head}
    assert len(head) == 2 and (r1["upload_bytes"] == Payload.encode(uploaded).nbytes).all()


def test_cli_pretrain_before_the_base_exists(tmp_path):
    """The README flow: the config names `algorithm.base` = the directory pretrain writes."""
    from typer.testing import CliRunner

    from fedray.front.cli import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: cnn, channels: [8, 16], hidden: 32}}\n"
                   f"pretrain: {{epochs: 1, batch_size: 64, warmup_epochs: 0}}\n"
                   f"algorithm: {{name: flite, base: {tmp_path / 'base'}, d: 8, r: 4}}\n")
    res = CliRunner().invoke(app, ["pretrain", str(cfg), "-o", str(tmp_path / "base"),
                                   "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epochs"] == 1
    assert load_config(cfg).algorithm["d"] == 8  # now the federated config validates


def test_pretrain_threads_are_recorded_and_restored(tmp_path):
    """pretrain.threads pins torch's intra-op threads for the pretraining (a base's bits
    depend on the order of float sums); base.json records the count; the process gets its
    own count back."""
    import torch

    before = torch.get_num_threads()
    cfg = load_config(None, ["model.name=mlp", "model.hidden=[8]", "pretrain.epochs=1",
                             "pretrain.warmup_epochs=0", "pretrain.threads=1"])
    a = pretrain(cfg, str(tmp_path / "a"), progress=False)
    pretrain(cfg, str(tmp_path / "b"), progress=False)
    assert a["threads"] == 1 and torch.get_num_threads() == before
    sa, sb = load_base(str(tmp_path / "a"))[0], load_base(str(tmp_path / "b"))[0]
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    default = pretrain(load_config(None, ["model.name=mlp", "model.hidden=[8]",
                                          "pretrain.epochs=1", "pretrain.warmup_epochs=0"]),
                       str(tmp_path / "c"), progress=False)
    assert default["threads"] == before


@pytest.mark.parametrize("damage,needle", [
    (lambda d: _edit_json(d, lambda m: m.pop("model")), "base.json: the JSON"),
    (lambda d: _edit_json(d, lambda m: m.pop("head")), "base.json: the JSON"),
    (lambda d: (d / "base.json").write_text("[1, 2]"), "base.json: the JSON"),
    (lambda d: _edit_npz(d, lambda s: s.update({k: np.zeros((3, 3), np.float32)
                                                 for k in list(s)[:1]})), "is (3, 3), the"),
    (lambda d: _edit_npz(d, lambda s: s.pop(sorted(s)[-1])), "it lacks"),
    (lambda d: _edit_npz(d, lambda s: s.update({k: s[k].astype(np.int64)
                                                 for k in list(s)[:1]})), "float arrays"),
])
def test_a_damaged_base_is_one_error_before_ray(tmp_path, damage, needle):
    """algorithm.base's files are data read back: a base.json without the model or head,
    or arrays that are not the run's model on this data, are refused before Ray starts
    (they once failed inside every executor, or as a KeyError)."""
    from fedray.core.storage import StateFileError
    from fedray.runtime import Experiment

    base = tmp_path / "base"
    pretrain(load_config(None, BASE + ["pretrain.epochs=1"]), str(base), progress=False)
    damage(base)
    with pytest.raises((ConfigError, StateFileError)) as err:
        cfg = load_config(None, [*BASE[:3], "clients.num_clients=4", "rounds=1",
                                 f"algorithm.base={base}", "data.split_seed=0",
                                 "eval.clients=none"])
        Experiment(cfg, str(tmp_path / "run"))
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run").exists()


def _edit_json(d, change) -> None:
    meta = json.loads((d / "base.json").read_text())
    change(meta)
    (d / "base.json").write_text(json.dumps(meta))


def _edit_npz(d, change) -> None:
    with np.load(d / "base.npz") as f:
        state = {k: f[k] for k in f.files}
    change(state)
    with open(d / "base.npz", "wb") as fh:
        np.savez(fh, **state)
