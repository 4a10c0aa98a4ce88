"""Flower Datasets' image datasets from a local ``save_to_disk`` directory (issue #31): a
``flwrlabs/femnist``-shaped dataset (an ``Image`` feature of embedded PNGs, ``writer_id``,
``character``) saved here with Hugging Face ``datasets`` and read by ``data.dataset=hf``,
one client per writer, the images decoded once into the population cache; a damaged image
is one error naming the column, the file and the row."""

from __future__ import annotations

import io

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, Features, Image, Value
from PIL import Image as PILImage

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data

FEATURES = Features({"image": Image(), "writer_id": Value("string"),
                     "character": ClassLabel(num_classes=62)})


def save_femnist(path, n: int = 40, writers: int = 5, seed: int = 0, bad_row: int | None = None
                 ) -> np.ndarray:
    g = np.random.default_rng(seed)
    pixels = (g.random((n, 28, 28)) * 255).astype(np.uint8)
    images = []
    for i, p in enumerate(pixels):
        buf = io.BytesIO()
        PILImage.fromarray(p, mode="L").save(buf, format="PNG")
        raw = buf.getvalue() if i != bad_row else b"not a png"
        images.append({"bytes": raw, "path": None})
    ds = Dataset.from_dict({"image": images, "writer_id": [f"f{i % writers:04d}" for i in
                                                           range(n)],
                            "character": [int(i % 11) for i in range(n)]}, features=FEATURES)
    ds.save_to_disk(str(path))
    return pixels


def hf_cfg(path, tmp_path):
    return load_config(None, ["data.dataset=hf", f"data.root={path}",
                              "data.client_column=writer_id", "data.label_column=character",
                              "data.feature_columns=[image]", "clients.num_clients=4",
                              f"data.cache_dir={tmp_path / 'cache'}"])


def test_flower_femnist_images_are_decoded_once_per_writer(tmp_path):
    pixels = save_femnist(tmp_path / "femnist")
    pop = build_client_data(hf_cfg(tmp_path / "femnist", tmp_path))
    assert pop.input_shape == (1, 28, 28) and pop.natural_ids.tolist() == [
        "f0000", "f0001", "f0002", "f0003"]
    rows = np.arange(40)
    for c in range(4):
        mine = rows[rows % 5 == c]
        x = np.concatenate([pop.client_arrays(c, 1, s)[0] for s in ("train", "test")])
        got = {tuple((v[0] * 255).round().astype(np.uint8).ravel()) for v in x}
        assert got == {tuple(pixels[i].ravel()) for i in mine}


def test_an_image_that_does_not_decode_is_one_error(tmp_path):
    save_femnist(tmp_path / "bad", bad_row=7)
    with pytest.raises(ConfigError) as e:
        build_client_data(hf_cfg(tmp_path / "bad", tmp_path))
    msg = str(e.value)
    assert "'image'" in msg and "row 7" in msg and "do not decode" in msg and "\n" not in msg
