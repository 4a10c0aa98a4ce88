"""LEAF's CelebA (issue #31): the metadata JSON LEAF's ``metadata_to_json.py`` writes (``x``
the image file names of one celebrity, ``y`` 0.0 / 1.0 for "Smiling") and the images in
``raw/img_align_celeba`` beside ``train/`` and ``test/``, read as LEAF's model reads them
(opened with Pillow, resized to 84×84, RGB; here scaled to [0, 1], channels first); names
that leave the folder, missing or broken images one error naming the file and the user."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image
from test_leaf import assert_cache_empty

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data

CELEBS = {"5": (["000001.jpg", "000002.jpg", "000003.jpg"], ["000004.jpg"]),
          "17": (["000005.jpg", "000006.jpg"], ["000007.jpg"])}


def write_celeba(root, celebs=CELEBS, seed: int = 0) -> dict[str, np.ndarray]:
    """LEAF's CelebA layout: train/ and test/ JSON, JPEGs of CelebA's 178×218 in
    raw/img_align_celeba. Returns {name: the image as LEAF's model loads it}."""
    g = np.random.default_rng(seed)
    folder = root / "raw" / "img_align_celeba"
    os.makedirs(folder)
    loaded = {}
    for i, split in enumerate(("train", "test")):
        os.makedirs(root / split)
        doc = {"users": list(celebs), "num_samples": [], "user_data": {}}
        for celeb, parts in celebs.items():
            names = parts[i]
            for name in names:
                Image.fromarray(g.integers(0, 256, (218, 178, 3), dtype=np.uint8)).save(
                    folder / name, quality=90)
                with Image.open(folder / name) as im:
                    loaded[name] = np.asarray(im.resize((84, 84)).convert("RGB"))
            doc["num_samples"].append(len(names))
            doc["user_data"][celeb] = {"x": names,
                                       "y": [float(k % 2) for k in range(len(names))]}
        with open(root / split / f"all_data_niid_1_keep_5_{split}_9.json", "w") as f:
            json.dump(doc, f)
    return loaded


def cfg_of(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=leaf", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=2",
                              "data.min_samples=2", *extra])


def test_images_are_leafs_84x84_rgb_by_celebrity(tmp_path):
    loaded = write_celeba(tmp_path / "celeba")
    pop = build_client_data(cfg_of(tmp_path / "celeba", tmp_path))
    assert pop.natural_ids.tolist() == ["17", "5"]  # sorted ids
    assert pop.input_shape == (3, 84, 84) and pop.num_classes == 2
    x, y = pop.client_arrays(1, 1, "train")  # celebrity 5
    assert y.tolist() == [0, 1, 0]
    for row, name in zip(x, CELEBS["5"][0], strict=True):
        assert np.array_equal(row, loaded[name].transpose(2, 0, 1) / np.float32(255))
    xt, _ = pop.client_arrays(0, 1, "test")
    assert np.array_equal(xt[0], loaded["000007.jpg"].transpose(2, 0, 1) / np.float32(255))


@pytest.mark.parametrize("change, rule", [
    (lambda r, d: d["user_data"]["5"]["x"].__setitem__(0, "../secret.jpg"),
     "image names of regular files"),
    (lambda r, d: d["user_data"]["5"]["x"].__setitem__(0, "missing.jpg"),
     "image names of regular files"),
    (lambda r, d: (r / "raw" / "img_align_celeba" / "000002.jpg").write_bytes(b"not a jpeg"),
     "images that decode (000002.jpg"),
    (lambda r, d: os.rename(r / "raw", r / "elsewhere"), "CelebA's images in a folder"),
])
def test_bad_images_are_one_error_naming_file_and_user(tmp_path, change, rule):
    root = tmp_path / "celeba"
    write_celeba(root)
    (tmp_path / "secret.jpg").write_bytes((root / "raw" / "img_align_celeba" /
                                           "000001.jpg").read_bytes())
    path = root / "train" / "all_data_niid_1_keep_5_train_9.json"
    doc = json.loads(path.read_text())
    change(root, doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        build_client_data(cfg_of(root, tmp_path))
    msg = str(e.value)
    assert rule in msg and "user 5" in msg and str(path) in msg and "\n" not in msg
    assert_cache_empty(tmp_path)


def test_an_image_linked_out_of_the_folder_is_refused(tmp_path):
    root = tmp_path / "celeba"
    write_celeba(root)
    target = root / "raw" / "img_align_celeba" / "000001.jpg"
    os.replace(target, tmp_path / "outside.jpg")
    os.symlink(tmp_path / "outside.jpg", target)
    with pytest.raises(ConfigError, match="image names of regular files"):
        build_client_data(cfg_of(root, tmp_path))
    assert_cache_empty(tmp_path)


@pytest.mark.parametrize("linked", ["raw", "raw/img_align_celeba"])
def test_an_image_folder_linked_out_of_the_root_is_refused(tmp_path, linked):
    root = tmp_path / "celeba"
    write_celeba(root)
    os.replace(root / linked, tmp_path / "outside")
    os.symlink(tmp_path / "outside", root / linked)
    with pytest.raises(ConfigError, match="a folder inside data.root .* links out of it"):
        build_client_data(cfg_of(root, tmp_path))
    assert_cache_empty(tmp_path)


@pytest.mark.ray
def test_fedavg_runs_on_celeba(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    write_celeba(tmp_path / "celeba")
    cfg = cfg_of(tmp_path / "celeba", tmp_path, "model.name=cnn", "model.channels=[4, 8]",
                 "model.hidden=8", "rounds=2", "local.batch_size=2",
                 "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2 and summary["dataset"] == "leaf"
    assert 0 <= summary["final_global_accuracy"] <= 1
