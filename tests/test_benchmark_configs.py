"""The published setups of configs/benchmarks/ (issue #31, deliverable 4): each full-size
config is valid, names its source, and its `--smoke` size runs through Ray on a CPU on
files written here in the dataset's own format (TFF .h5, LEAF JSON, CIFAR's batches,
FLAIR's HDF5)."""

from __future__ import annotations

import glob
import os

import pytest
from cifar_fixture import patch_cifar_md5, write_fake_cifar
from test_flair import write_flair
from test_leaf import USERS, write_leaf, write_shakespeare
from test_sent140 import write_sent140
from test_tff_h5 import write_tff
from test_tff_text import SO, write_text

from fedray.core.config import load_config
from fedray.core.spec import ConfigError

HERE = os.path.join(os.path.dirname(__file__), os.pardir, "fedray", "configs", "benchmarks")
CONFIGS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(HERE, "*.yaml")))


def data_for(name: str, root, monkeypatch) -> None:
    """Files in ``name``'s own format under ``root``."""
    if name == "pfl_cifar10":
        write_fake_cifar(root, "cifar10", train_per_file=20, num_test=20)
        patch_cifar_md5(monkeypatch, root, "cifar10")
    elif name == "pfl_femnist":
        write_tff(root, {f"f{i:04d}_00": (6, 2) for i in range(5)})
    elif name == "tff_stackoverflow":
        write_text(root, "tokens", {**SO, "u3": SO["u1"], "u4": SO["u2"]}, "stackoverflow")
    elif name == "leaf_femnist":
        write_leaf(root, USERS)
    elif name == "leaf_shakespeare":
        write_shakespeare(root, {"A_B": (9, 3), "C_D": (6, 2), "E_F": (7, 2)})
    elif name == "leaf_sent140":
        write_sent140(root)
    elif name == "pfl_flair":
        write_flair(str(root / "flair_federated.hdf5"), size=40)
    else:
        raise AssertionError(f"no test data for {name}")


def test_every_published_setup_is_here():
    assert CONFIGS == ["leaf_femnist", "leaf_sent140", "leaf_shakespeare", "pfl_cifar10",
                       "pfl_femnist", "pfl_flair", "tff_stackoverflow"]


@pytest.mark.parametrize("name", CONFIGS)
def test_full_size_is_valid_and_cites_its_source(name, tmp_path, monkeypatch):
    path = os.path.join(HERE, f"{name}.yaml")
    text = open(path).read()
    assert "Published accuracy" in text and ("arXiv" in text or "github" in text.lower())
    data_for(name, tmp_path / "data", monkeypatch)
    full = load_config(path, [f"data.root={tmp_path / 'data'}"])
    smoke = load_config(path, [f"data.root={tmp_path / 'data'}"], smoke=True)
    assert full.rounds > smoke.rounds == 2
    assert smoke.clients.num_clients < full.clients.num_clients
    assert smoke.runtime.tiers[0].num_gpus == 0  # the smoke size needs no GPU


def test_a_config_without_a_smoke_size_says_so(tmp_path):
    with pytest.raises(ConfigError, match="smoke"):
        load_config(os.path.join(HERE, os.pardir, "fedavg_digits.yaml"), smoke=True)


@pytest.mark.ray
@pytest.mark.parametrize("name", CONFIGS)
def test_the_smoke_size_runs(name, ray_session, tmp_path, monkeypatch):
    from fedray.runtime import run_experiment

    data_for(name, tmp_path / "data", monkeypatch)
    cfg = load_config(os.path.join(HERE, f"{name}.yaml"),
                      [f"data.root={tmp_path / 'data'}",
                       f"data.cache_dir={tmp_path / 'cache'}"], smoke=True)
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2
    assert 0 <= summary["final_global_accuracy"] <= 1


def test_smoke_with_resume_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fedray.front.cli", "run", "--resume",
                          str(tmp_path / "run"), "--smoke"], capture_output=True, text=True)
    assert out.returncode != 0 and "--smoke sets the size of a new run" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
