"""TensorFlow Federated's HDF5 client data (issue #31): federated-EMNIST- and
CIFAR-100-shaped ``.h5`` files written here with h5py in TFF's layout
(``examples/<client>/<feature>``, one train and one test file), read back one client per
TFF client id with TFF's own split, images channels-first; malformed files one error naming
the file and the client, before Ray."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from test_leaf import assert_cache_empty

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data


def write_tff(root, clients: dict[str, tuple[int, int]], name: str = "fed_emnist",
              feature: str = "pixels", shape=(28, 28), dtype=np.float32, seed: int = 0):
    """TFF-layout train and test files: each client's (train, test) example counts."""
    g = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    data = {}
    for i, split in enumerate(("train", "test")):
        with h5py.File(os.path.join(root, f"{name}_{split}.h5"), "w") as f:
            for c, sizes in clients.items():
                n = sizes[i]
                x = (g.random((n, *shape)) * (255 if dtype == np.uint8 else 1)).astype(dtype)
                y = g.integers(0, 10, n).astype(np.int32)
                f.create_dataset(f"examples/{c}/{feature}", data=x)
                f.create_dataset(f"examples/{c}/label", data=y)
                data.setdefault(c, {})[split] = (x, y)
    return data


CLIENTS = {"f0102_31": (5, 2), "f0007_02": (6, 3), "f0511_48": (1, 1), "f0033_11": (4, 2)}


def tff_cfg(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=tff", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=3",
                              *extra])


def test_each_client_is_one_tff_client_with_tffs_own_split(tmp_path):
    data = write_tff(tmp_path / "emnist", CLIENTS)
    pop = build_client_data(tff_cfg(tmp_path / "emnist", tmp_path))
    assert pop.natural_ids.tolist() == ["f0007_02", "f0033_11", "f0102_31"]  # f0511_48: 2 < 4
    assert pop.input_shape == (1, 28, 28)
    for c, user in enumerate(pop.natural_ids):
        for split in ("train", "test"):
            x, y = pop.client_arrays(c, 1, split)
            assert np.array_equal(x[:, 0], data[user][split][0]) and np.array_equal(
                y, data[user][split][1])


def test_cifar100_images_are_channels_first_and_scaled(tmp_path):
    data = write_tff(tmp_path / "cifar", CLIENTS, "fed_cifar100", "image", (32, 32, 3),
                     np.uint8)
    pop = build_client_data(tff_cfg(tmp_path / "cifar", tmp_path))
    assert pop.input_shape == (3, 32, 32)
    x, _ = pop.client_arrays(0, 1)
    want = np.transpose(data["f0007_02"]["train"][0], (0, 3, 1, 2)).astype(np.float32) / 255
    assert np.allclose(x, want) and x.max() <= 1.0


def test_malformed_tff_files_are_one_error_before_ray(tmp_path):
    root = tmp_path / "bad"
    write_tff(root, CLIENTS)
    with h5py.File(root / "fed_emnist_test.h5", "a") as f:
        del f["examples/f0033_11/label"]
    with pytest.raises(ConfigError) as e:
        build_client_data(tff_cfg(root, tmp_path))
    assert "fed_emnist_test.h5" in str(e.value) and "client f0033_11" in str(e.value)
    assert "'label'" in str(e.value) and "\n" not in str(e.value)
    (root / "fed_emnist_test.h5").write_bytes((root / "fed_emnist_train.h5").read_bytes()[:900])
    with pytest.raises(ConfigError, match="a readable HDF5 file"):
        build_client_data(tff_cfg(root, tmp_path))
    with h5py.File(root / "fed_emnist_test.h5", "w") as f:
        f.create_dataset("other/x", data=np.zeros(3))
    with pytest.raises(ConfigError, match="an examples group"):
        build_client_data(tff_cfg(root, tmp_path))
    os.remove(root / "fed_emnist_test.h5")
    with pytest.raises(ConfigError, match=r"exactly one \*test\*.h5"):
        tff_cfg(root, tmp_path)
    assert_cache_empty(tmp_path)


def test_links_out_of_the_file_and_bad_labels_are_refused(tmp_path):
    root = tmp_path / "linked"
    write_tff(root, CLIENTS)
    outside = tmp_path / "outside.h5"
    with h5py.File(outside, "w") as f:
        f.create_dataset("pixels", data=np.zeros((2, 28, 28), np.float32))
        f.create_dataset("label", data=np.zeros(2, np.int32))
    with h5py.File(root / "fed_emnist_train.h5", "a") as f:
        f["examples/zz_planted"] = h5py.ExternalLink(str(outside), "/")
    with pytest.raises(ConfigError, match="stored in the file"):
        build_client_data(tff_cfg(root, tmp_path))
    with h5py.File(root / "fed_emnist_train.h5", "a") as f:
        del f["examples/zz_planted"]
        f["examples/f0007_02/label"][0] = -3
    with pytest.raises(ConfigError, match="labels in 0.."):
        build_client_data(tff_cfg(root, tmp_path))


@pytest.mark.parametrize("kind", ["external", "virtual", "soft"])
def test_datasets_that_read_other_files_are_refused(tmp_path, kind):
    """A client's dataset stored in another file (HDF5 external storage, a virtual dataset
    mapping another file, a soft link) is refused, naming the file, the client and the
    rule, with nothing written to the cache."""
    from test_leaf import assert_cache_empty

    root = tmp_path / "tff"
    write_tff(root, CLIENTS)
    secret = tmp_path / "secret.bin"
    np.arange(4 * 28 * 28, dtype=np.float32).tofile(secret)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("pixels", data=np.ones((4, 28, 28), np.float32))
    with h5py.File(root / "fed_emnist_train.h5", "a") as f:
        del f["examples/f0033_11/pixels"]
        if kind == "external":
            f.create_dataset("examples/f0033_11/pixels", shape=(4, 28, 28), dtype="<f4",
                             external=[(str(secret), 0, 4 * 28 * 28 * 4)])
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(4, 28, 28), dtype="f4")
            layout[:] = h5py.VirtualSource(str(other), "pixels", shape=(4, 28, 28))
            f.create_virtual_dataset("examples/f0033_11/pixels", layout)
        else:
            f["examples/f0033_11/pixels"] = h5py.SoftLink("/examples/f0007_02/pixels")
    with pytest.raises(ConfigError) as e:
        build_client_data(tff_cfg(root, tmp_path))
    assert "client f0033_11" in str(e.value) and "fed_emnist_train.h5" in str(e.value)
    assert "stored in the file" in str(e.value)
    assert_cache_empty(tmp_path)


@pytest.mark.parametrize("plant, rule", [
    ("examples_link", "an examples group stored in the file"),
    ("empty_space", "an array of at most 1 GiB"),
    ("huge", "an array of at most 1 GiB"),
    ("latin1_id", "client ids in UTF-8"),
])
def test_hostile_tff_files_are_one_error(tmp_path, plant, rule):
    """An examples group that is a link into another file, a dataset with a null
    dataspace, one declaring terabytes in a tiny file, a client id that is not UTF-8: one
    ConfigError line each, nothing in the cache."""
    from test_leaf import assert_cache_empty

    root = tmp_path / "tff"
    write_tff(root, CLIENTS)
    train = root / "fed_emnist_train.h5"
    if plant == "examples_link":
        other = tmp_path / "other.h5"
        write_tff(tmp_path / "o", CLIENTS)
        os.replace(tmp_path / "o" / "fed_emnist_train.h5", other)
        with h5py.File(train, "a") as f:
            del f["examples"]
            f["examples"] = h5py.ExternalLink(str(other), "/examples")
    else:
        with h5py.File(train, "a") as f:
            if plant == "latin1_id":
                f.id.links.create_hard(b"examples/caf\xe9", f.id, b"examples/f0007_02")
            else:
                del f["examples/f0033_11/pixels"]
                if plant == "empty_space":
                    f.create_dataset("examples/f0033_11/pixels", data=h5py.Empty("f4"))
                else:
                    f.create_dataset("examples/f0033_11/pixels", shape=(10 ** 7, 28, 28),
                                     dtype="f4", chunks=(1, 28, 28))
    with pytest.raises(ConfigError) as e:
        build_client_data(tff_cfg(root, tmp_path))
    assert rule in str(e.value) and "fed_emnist_train.h5" in str(e.value)
    assert "\n" not in str(e.value)
    assert_cache_empty(tmp_path)
