"""Flower Datasets / Hugging Face ids from the local hub cache (issue #31): a
``flwrlabs/femnist``-shaped dataset written as the hub stores it — Parquet files (by Hugging
Face ``datasets``) in ``blobs/``, linked from ``snapshots/{commit}/data/``, ``refs/main``
naming the commit — read by ``data.dataset=hf data.hf_id=flwrlabs/femnist`` exactly as its
``save_to_disk`` copy; splits by file name; never a download unless ``data.download=true``;
a link out of the dataset's folder, a bad id and a missing split refused in one line."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from test_hf_images import FEATURES, hf_cfg, save_femnist

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_dataset(hub, repo: str = "flwrlabs/femnist", splits=("train",), n: int = 40,
                seed: int = 0):
    """The hub cache layout huggingface_hub writes, with Parquet files of ``splits``."""
    from datasets import Dataset

    folder = hub / ("datasets--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    blobs, snap = folder / "blobs", folder / "snapshots" / COMMIT / "data"
    blobs.mkdir()
    snap.mkdir(parents=True)
    src = hub.parent / "femnist_src"
    save_femnist(src, n=n, seed=seed)
    ds = Dataset.load_from_disk(str(src)).cast(FEATURES)
    for split in splits:
        tmp = hub.parent / f"{split}.parquet"
        ds.to_parquet(str(tmp))
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        os.replace(tmp, blobs / digest)
        os.symlink(os.path.join("..", "..", "..", "blobs", digest),
                   snap / f"{split}-00000-of-00001.parquet")
    return folder, src


def hub_cfg(tmp_path, *extra):
    return load_config(None, ["data.dataset=hf", "data.hf_id=flwrlabs/femnist",
                              "data.client_column=writer_id", "data.label_column=character",
                              "data.feature_columns=[image]", "clients.num_clients=4",
                              f"data.cache_dir={tmp_path / 'cache'}", *extra])


@pytest.fixture
def hub(tmp_path, monkeypatch):
    path = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    return path


def test_a_cached_hub_dataset_reads_as_its_save_to_disk_copy(tmp_path, hub):
    _, src = hub_dataset(hub, splits=("train", "test"))
    pop = build_client_data(hub_cfg(tmp_path))
    ref = build_client_data(hf_cfg(src, tmp_path))
    assert pop.natural_ids.tolist() == ref.natural_ids.tolist() == [
        "f0000", "f0001", "f0002", "f0003"]
    for c in range(4):
        for s in ("train", "test"):
            a, b = pop.client_arrays(c, 1, s), ref.client_arrays(c, 1, s)
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert build_client_data(hub_cfg(tmp_path, "data.hf_split=test")).num_clients == 4


def test_no_download_unless_asked_and_one_line_for_what_is_missing(tmp_path, hub):
    hub_dataset(hub)
    with pytest.raises(ConfigError) as e:
        hub_cfg(tmp_path, "data.hf_split=validation")
    assert e.value.path == "data.hf_id" and "split 'validation'" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.dataset=hf", "data.hf_id=flwrlabs/shakespeare",
                           "data.client_column=character_id"])
    msg = str(e.value)
    assert e.value.path == "data.hf_id" and str(hub) in msg and "data.download=true" in msg
    with pytest.raises(ConfigError) as e:
        hub_cfg(tmp_path, "data.hf_revision=v2")  # no such ref or snapshot
    assert e.value.path == "data.hf_id"


def test_download_goes_through_huggingface_hub_and_fails_in_one_line(tmp_path, hub,
                                                                     monkeypatch):
    """Offline (this machine reaches no hub), data.download=true asks huggingface_hub,
    which cannot fetch: one line at data.download, nothing half-written in fedray's cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.dataset=hf", "data.hf_id=flwrlabs/shakespeare",
                           "data.client_column=character_id", "data.download=true",
                           f"data.cache_dir={tmp_path / 'cache'}"])
    assert e.value.path == "data.download" and "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists()


def test_configs_the_parquet_conversion_and_a_second_cache(tmp_path, hub, monkeypatch):
    """Files of two configurations (top-level folders) need data.hf_config; the hub's
    Parquet conversion (refs/convert/parquet, {config}/{split}/0000.parquet) is read with
    that revision; a split is a file's own name or its own folder, never an ancestor."""
    folder, _ = hub_dataset(hub)
    snap = folder / "snapshots" / COMMIT
    blob = os.path.join("..", "..", "..", "..", "blobs", os.listdir(folder / "blobs")[0])
    for cfg in ("letters", "digits"):
        (snap / cfg / "train").mkdir(parents=True)
        os.symlink(blob, snap / cfg / "train" / "0000.parquet")
    import shutil

    shutil.rmtree(snap / "data")  # only the two configurations hold train now
    with pytest.raises(ConfigError) as e:
        hub_cfg(tmp_path)
    assert e.value.path == "data.hf_config" and "digits, letters" in str(e.value)
    assert build_client_data(hub_cfg(tmp_path, "data.hf_config=digits")).num_clients == 4
    (snap / "digits" / "train").rename(snap / "digits" / "train_extra")
    assert build_client_data(hub_cfg(tmp_path)).num_clients == 4  # train_extra is not train
    (folder / "refs" / "refs" / "convert").mkdir(parents=True)
    (folder / "refs" / "refs" / "convert" / "parquet").write_text(COMMIT)
    assert build_client_data(hub_cfg(tmp_path, "data.hf_revision=refs/convert/parquet",
                                     "data.hf_config=letters")).num_clients == 4
    second = tmp_path / "home"  # HF_HOME's hub, searched after HF_HUB_CACHE
    monkeypatch.setenv("HF_HOME", str(second))
    hub_dataset(second / "hub", repo="flwrlabs/cifar10")
    cfg = load_config(None, ["data.dataset=hf", "data.hf_id=flwrlabs/cifar10",
                             "data.client_column=writer_id", "data.label_column=character",
                             "data.feature_columns=[image]", "clients.num_clients=4",
                             f"data.cache_dir={tmp_path / 'cache'}"])
    assert build_client_data(cfg).num_clients == 4


@pytest.mark.parametrize("extra, path", [
    (["data.hf_id=../etc/passwd"], "data.hf_id"),
    (["data.hf_id=a/b/c"], "data.hf_id"),
    (["data.hf_id=a--b/c"], "data.hf_id"),  # the cache folder joins owner and name with --
    (["data.hf_split=../train"], "data.hf_split"),
    (["data.hf_split=train/x"], "data.hf_split"),
    (["data.hf_split=tr\u00e9in"], "data.hf_split"),
    (["data.hf_revision=../../x"], "data.hf_revision"),
    (["data.root=/tmp"], "data.root"),
])
def test_bad_ids_and_mixed_sources_are_refused(tmp_path, hub, extra, path):
    hub_dataset(hub)
    with pytest.raises(ConfigError) as e:
        hub_cfg(tmp_path, *extra)
    assert e.value.path == path and "\n" not in str(e.value)


def test_a_link_out_of_the_dataset_folder_is_refused(tmp_path, hub):
    folder, _ = hub_dataset(hub)
    outside = tmp_path / "secret.parquet"
    outside.write_bytes((folder / "blobs" / os.listdir(folder / "blobs")[0]).read_bytes())
    os.symlink(outside, folder / "snapshots" / COMMIT / "data" / "train-00001-of-00001.parquet")
    with pytest.raises(ConfigError) as e:
        hub_cfg(tmp_path)
    assert e.value.path == "data.hf_id" and "is a link to" in str(e.value)


def test_names_are_whole_ascii_matches():
    from fedray.data.hub import check_names

    for split in ("train\n", "tréin", "a/b"):
        with pytest.raises(ConfigError) as e:
            check_names("flwrlabs/femnist", split, "main")
        assert e.value.path == "data.hf_split"
    check_names("sentiment140", "train", "refs/convert/parquet", "default")
