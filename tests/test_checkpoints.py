"""Durable checkpoints: a damaged newest checkpoint falls back to the older intact one (with
a warning naming it) and the resumed run ends bitwise where an uninterrupted one does;
temp files of killed writers are cleaned; a truncated cache marker is a cache miss."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.core.storage import (
    StateFileError,
    Storage,
    read_marker,
    write_marker,
)


def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, capsys):
    s = Storage(str(tmp_path / "run"))
    for i in (1, 2, 3):
        s.write_checkpoint(i, {"round": i})
    assert s.listdir("checkpoints") == ["000002.npz", "000003.npz", "LATEST"]
    assert len(s.read_bytes("checkpoints/LATEST").decode().splitlines()) == 2
    assert s.read_checkpoint()["round"] == 3
    (tmp_path / "run/checkpoints/000003.npz").write_bytes(b"PK\x03\x04 torn write")
    assert s.read_checkpoint()["round"] == 2
    err = capsys.readouterr().err
    assert "000003.npz: its SHA-256 differs" in err and "using the older checkpoint" in err
    (tmp_path / "run/checkpoints/000002.npz").unlink()
    with pytest.raises(StateFileError, match="000003.npz: its SHA-256 differs"):
        s.read_checkpoint()  # none intact: the error names the newest


def test_temp_files_are_cleaned(tmp_path):
    s = Storage(str(tmp_path / "run"))
    s.write_checkpoint(1, {"round": 1})
    (tmp_path / "run/checkpoints/000002.npz.tmp-4242").write_bytes(b"half")  # killed writer
    s.write_checkpoint(2, {"round": 2})
    assert s.listdir("checkpoints") == ["000001.npz", "000002.npz", "LATEST"]
    with pytest.raises(TypeError):
        s.write_bytes("x.bin", object())  # a failing write leaves no temp file behind
    assert s.listdir("") == ["checkpoints"]


def test_truncated_cache_marker_is_a_miss_not_an_error(tmp_path):
    path = tmp_path / "cache" / "prepared.json"
    write_marker(path, {"key": "k"})
    assert read_marker(path) == {"key": "k"}
    path.write_text('{"key": "k"')  # torn write from an older version
    assert read_marker(path) is None
    assert read_marker(tmp_path / "missing.json") is None
    assert [p.name for p in path.parent.iterdir()] == ["prepared.json"]


@pytest.mark.ray
def test_resume_after_the_newest_checkpoint_is_damaged(ray_session, tiny_cfg, tmp_path):
    """Client states named by the older kept checkpoint survive pruning, so the fallback
    resume re-runs the lost round and ends bitwise where the uninterrupted run ends."""
    cfg = tiny_cfg(**{"rounds": 4, "local.momentum": 0.9, "local.keep_optimizer_state": "true",
                      "clients.fraction": 0.5})
    from fedray.runtime import Experiment, run_experiment

    run_experiment(cfg, str(tmp_path / "full"), progress=False)
    exp = Experiment(cfg, str(tmp_path / "cut"))
    exp.start()
    for _ in range(3):
        exp.step()
    exp.release()
    (tmp_path / "cut/checkpoints/000003.npz").write_bytes(b"damaged")
    summary = run_experiment(cfg, str(tmp_path / "cut"), resume=True, progress=False)
    assert summary["rounds"] == 4 and summary["rounds_this_session"] == 2  # from round 2
    from fedray.core import checkpoint

    a = checkpoint.read(Storage(str(tmp_path / "full")))
    b = checkpoint.read(Storage(str(tmp_path / "cut")))
    assert all(np.array_equal(a["server"]["params"][k], b["server"]["params"][k])
               for k in a["server"]["params"])
    assert a["clients"]["versions"] == b["clients"]["versions"]
