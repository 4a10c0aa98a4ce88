"""A run directory is data, never code: every loader of checkpoints, client states, pretrain
checkpoints and ASCE weights is given a planted malicious pickle; nothing executes and the
error names the file. Plus the state format's exact round trip."""

from __future__ import annotations

import hashlib
import os
import pickle

import numpy as np
import pytest

from fedray.core.storage import StateFileError, Storage, pack_state, unpack_state


class Boom:
    """Unpickling this creates the file ``path``: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def planted(tmp_path) -> bytes:
    return pickle.dumps({"global_state": Boom(str(tmp_path / "PWNED"))}, protocol=5)


def test_state_round_trip_is_exact():
    state = {
        "global_state": {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                         "b": np.zeros(0, np.float64), "i": np.array([1, 2], np.int8)},
        "versions": {0: 3, 17: 5},  # int keys
        "$weird": "a key that looks like a marker",
        "scalars": [np.float32(1.5), np.int64(7), 2.5, 3, True, None, float("nan")],
        "pair": (1, "a", np.array([True, False])),
        "nested": [{"tau": 4, "gate": -0.25}, [], {}],
    }
    back = unpack_state(pack_state(state))
    assert back.keys() == state.keys()
    for k in ("w", "b", "i"):
        a, b = state["global_state"][k], back["global_state"][k]
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert back["versions"] == {0: 3, 17: 5} and all(isinstance(k, int) for k in back["versions"])
    assert back["$weird"] == state["$weird"]
    s = back["scalars"]
    assert type(s[0]) is np.float32 and s[0] == 1.5 and type(s[1]) is np.int64
    assert s[2:6] == [2.5, 3, True, None] and np.isnan(s[6])
    assert isinstance(back["pair"], tuple) and back["pair"][:2] == (1, "a")
    assert back["nested"] == [{"tau": 4, "gate": -0.25}, [], {}]


@pytest.mark.parametrize("bad", [{1, 2}, np.array([object()], dtype=object), object()])
def test_unsupported_values_are_refused_when_written(bad):
    with pytest.raises(TypeError, match=r"state\.x"):
        pack_state({"x": bad})


def test_a_planted_pickle_never_runs_anywhere_a_state_is_read(tmp_path):
    payload = planted(tmp_path)
    with pytest.raises(StateFileError, match="pickle"):
        unpack_state(payload, "x")
    for junk in (b"", b"not a zip", b"PK\x03\x04garbage", pack_state({"a": 1})[:50]):
        with pytest.raises(StateFileError, match="x: not a"):
            unpack_state(junk, "x")
    # an .npz holding an object array (np.save would pickle it): refused, not unpickled
    import io

    buf = io.BytesIO()
    np.savez(buf, __tree__=np.frombuffer(b'{"$np": 0}', np.uint8),
             a0=np.array([Boom(str(tmp_path / "PWNED"))], dtype=object))
    with pytest.raises(StateFileError, match="holds Python objects"):
        unpack_state(buf.getvalue(), "x")
    assert not (tmp_path / "PWNED").exists()


def test_checkpoint_loaders_refuse_planted_and_damaged_files(tmp_path):
    run = Storage(str(tmp_path / "run"))
    run.write_checkpoint(1, {"round": 1, "global_state": {"w": np.ones(3, np.float32)}})
    run.write_checkpoint(2, {"round": 2, "global_state": {"w": np.zeros(3, np.float32)}})
    assert run.read_checkpoint()["round"] == 2
    assert run.listdir("checkpoints") == ["000001.npz", "000002.npz", "LATEST"]
    # 1. the checkpoint replaced by a pickle: its digest no longer matches LATEST, so the
    #    older intact checkpoint is used; with both replaced the error names the newest
    (tmp_path / "run/checkpoints/000002.npz").write_bytes(planted(tmp_path))
    assert run.read_checkpoint()["round"] == 1
    (tmp_path / "run/checkpoints/000001.npz").write_bytes(planted(tmp_path))
    with pytest.raises(StateFileError, match=r"000002.npz: its SHA-256 differs"):
        run.read_checkpoint()
    # 2. the attacker rewrites LATEST with the pickle's digest too: still only data is read
    digest = hashlib.sha256(planted(tmp_path)).hexdigest()
    (tmp_path / "run/checkpoints/LATEST").write_text(f"2 {digest}")
    with pytest.raises(StateFileError, match="pickle"):
        run.read_checkpoint()
    # 3. LATEST used as a path (the old pretrain loader): never a path now
    for text in ("../../x.pkl", "2", "2 xyz", "-1 " + "0" * 64, ""):
        (tmp_path / "run/checkpoints/LATEST").write_text(text)
        with pytest.raises(StateFileError, match="LATEST: got"):
            run.read_checkpoint()
    (tmp_path / "run/checkpoints/LATEST").write_text(f"7 {digest}")
    with pytest.raises(StateFileError, match="000007.npz: missing"):
        run.read_checkpoint()
    assert not (tmp_path / "PWNED").exists()


def test_client_state_store_refuses_a_planted_state(tmp_path):
    from fedray.core.state_store import ClientStateStore

    storage = Storage(str(tmp_path / "run"))
    store = ClientStateStore(storage)
    nbytes = store.save(3, 2, {"optimizer": {"momentum_buffers": [None, np.ones(2)]}})
    assert nbytes == len(storage.read_bytes("client_state/00000/00000003/000002.npz"))
    fresh = ClientStateStore(storage)  # no cache: reads the file
    assert fresh.load(3, 2)["optimizer"]["momentum_buffers"][0] is None
    (tmp_path / "run/client_state/00000/00000003/000002.npz").write_bytes(planted(tmp_path))
    with pytest.raises(StateFileError, match=r"000002.npz: a Python pickle"):
        ClientStateStore(storage).load(3, 2)
    assert not (tmp_path / "PWNED").exists()


def test_resume_of_a_planted_run_fails_before_any_ray_work(tmp_path, tiny_cfg):
    """`fedray run --resume` and every job resume through Experiment: the checkpoint is
    checked in its constructor; nothing in the run dir changes."""
    from fedray.runtime import Experiment

    run = Storage(str(tmp_path / "run"))
    run.write_bytes("config.yaml", b"name: experiment\n")
    run.write_checkpoint(1, {"round": 1})
    (tmp_path / "run/checkpoints/000001.npz").write_bytes(planted(tmp_path))
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(StateFileError, match="SHA-256 differs"):
        Experiment(tiny_cfg(), str(tmp_path / "run"), resume=True)
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert before == after and not (tmp_path / "PWNED").exists()


def test_pretrain_resume_refuses_a_planted_checkpoint(tmp_path):
    from fedray.core.config import load_config
    from fedray.models.pretrain import pretrain

    out = Storage(str(tmp_path / "base"))
    out.write_checkpoint(1, {"epoch": 1})
    (tmp_path / "base/checkpoints/000001.npz").write_bytes(planted(tmp_path))
    cfg = load_config(None, ["model.hidden=[8]", "pretrain.epochs=2"])
    with pytest.raises(StateFileError, match="000001.npz"):
        pretrain(cfg, str(tmp_path / "base"), resume=True, progress=False)
    assert not (tmp_path / "PWNED").exists()


def test_asce_weights_load_without_unpickling_code(tmp_path):
    import torch

    from fedray.methods.favor.asce import load_asce

    (tmp_path / "asce.json").write_text('{"dim": 8}')
    torch.save({"x": Boom(str(tmp_path / "PWNED"))}, tmp_path / "asce.pt")
    from transformers import BertConfig

    BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, vocab_size=30).save_pretrained(tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        load_asce(str(tmp_path))
    assert not (tmp_path / "PWNED").exists()
    assert os.path.exists(tmp_path / "asce.pt")


def test_a_link_planted_at_a_temp_name_is_never_written_through(tmp_path):
    """Every temp file is created by fedray (O_EXCL | O_NOFOLLOW): a symbolic link planted
    at the name a run dir, an --out folder or a cache writes its temp file to is replaced,
    and the file it points to stays as it was."""
    from fedray.core.outputs import OutputFiles
    from fedray.core.storage import open_new

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(victim, run / f"config.yaml.tmp-{os.getpid()}")
    Storage(str(run)).write_bytes("config.yaml", b"name: x\n")
    assert (run / "config.yaml").read_bytes() == b"name: x\n"
    assert not (run / "config.yaml").is_symlink() and victim.read_text() == "precious"

    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / f"index.md.tmp-{os.getpid()}")
    with OutputFiles(str(out), ["index.md", "ids.csv"]) as files:
        files.write_text("index.md", "# report\n")
        with files.open("ids.csv", "w", newline="") as f:
            f.write("a,b\r\n")
    assert (out / "index.md").read_text() == "# report\n" and victim.read_text() == "precious"
    assert (out / "ids.csv").read_bytes() == b"a,b\r\n"

    stale = tmp_path / "stale.tmp"  # a dead process's temp file is replaced, not appended
    stale.write_bytes(b"old bytes")
    with open_new(str(stale)) as f:
        f.write(b"new")
    assert stale.read_bytes() == b"new"


@pytest.mark.parametrize("bad", [b'{"$np": 1e999}', b'{"$np": Infinity}', b'{"$np": "x"}'])
def test_a_damaged_skeleton_is_a_state_file_error(bad):
    import io
    import zipfile

    good = pack_state({"w": np.arange(3.0)})
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "__tree__.npy":
                tree = np.frombuffer(bad, np.uint8)
                buf = io.BytesIO()
                np.save(buf, tree)
                data = buf.getvalue()
            dst.writestr(info, data)
    with pytest.raises(StateFileError, match="damaged.state"):
        unpack_state(out.getvalue(), "damaged.state")


def test_planted_names_in_metric_and_state_folders_do_not_stop_a_run(tmp_path):
    from fedray.core.state_store import ClientStateStore
    from fedray.observe.metrics import MetricsWriter

    storage = Storage(str(tmp_path))
    writer = MetricsWriter(storage)
    for r in (1, 2, 3):
        writer.write_round(r, {"round": r}, {})
    storage.write_bytes("metrics/rounds/abc.parquet", b"x")
    writer.truncate_after(2)
    assert storage.listdir("metrics/rounds") == ["000001.parquet", "000002.parquet",
                                                 "abc.parquet"]
    store = ClientStateStore(storage)
    store.save(5, 1, {"w": np.ones(2)})
    store.save(5, 2, {"w": np.ones(2)})
    storage.write_bytes(f"{store.folder(5)}/abc.npz", b"x")
    store.prune([5], {5: 2})
    assert storage.listdir(store.folder(5)) == ["000002.npz"]
