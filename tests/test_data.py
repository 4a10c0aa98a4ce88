"""Datasets (digits, synthetic, CIFAR through torchvision) and the federated client view."""

import json

import numpy as np
import pytest
from cifar_fixture import patch_cifar_md5, write_fake_cifar

from fedray.core.config import ConfigError, DataConfig
from fedray.data import (
    Dataset,
    build_federated,
    load_cifar,
    load_dataset,
    load_digits,
    make_synthetic,
)


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits(seed=0)


@pytest.fixture(scope="module")
def small_synthetic() -> Dataset:
    return make_synthetic(num_samples=600, num_features=20, num_classes=4, seed=1)


def test_digits_shapes_dtypes_and_stratification(digits):
    assert digits.x_train.shape[1:] == digits.input_shape == (1, 8, 8)
    assert len(digits.x_train) + len(digits.x_test) == 1797
    assert abs(len(digits.x_test) / 1797 - 0.2) < 0.01
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert digits.num_classes == 10
    assert abs(float(digits.x_train.mean())) < 1e-4
    assert abs(float(digits.x_train.std()) - 1) < 1e-4
    train_share = np.bincount(digits.y_train, minlength=10) / len(digits.y_train)
    test_share = np.bincount(digits.y_test, minlength=10) / len(digits.y_test)
    assert np.abs(train_share - test_share).max() < 0.01
    again = load_digits(seed=0)
    assert np.array_equal(again.y_test, digits.y_test)
    other = load_digits(seed=1)
    assert not np.array_equal(other.y_train, digits.y_train)


def test_digits_upsampled_to_32x32x3(digits):
    big = load_digits(image_size=32, channels=3, seed=0)
    assert big.input_shape == (3, 32, 32)
    assert big.x_train.shape == (len(digits.x_train), 3, 32, 32)
    assert big.x_train.dtype == np.float32
    assert np.array_equal(big.x_train[:, 0], big.x_train[:, 2])
    assert np.array_equal(big.y_train, digits.y_train)
    # Bilinear upsampling keeps the image: block means track the 8x8 original.
    pooled = big.x_train[:, 0].reshape(-1, 8, 4, 8, 4).mean(axis=(2, 4))
    assert np.corrcoef(pooled.ravel(), digits.x_train[:, 0].ravel())[0, 1] > 0.95
    cfg = DataConfig(dataset="digits", image_size=16, channels=1)
    assert load_dataset(cfg, seed=0).input_shape == (1, 16, 16)


def test_synthetic_is_deterministic_and_learnable():
    from sklearn.linear_model import LogisticRegression

    a = make_synthetic(num_samples=2000, num_features=64, num_classes=10, seed=4)
    b = make_synthetic(num_samples=2000, num_features=64, num_classes=10, seed=4)
    c = make_synthetic(num_samples=2000, num_features=64, num_classes=10, seed=5)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.shape == (1600, 64) and a.input_shape == (64,)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert np.bincount(a.y_test).min() == 40  # stratified
    model = LogisticRegression(C=0.1, max_iter=200).fit(a.x_train, a.y_train)
    acc = model.score(a.x_test, a.y_test)
    assert 0.35 < acc < 0.99  # chance is 0.1


def test_federated_local_splits_disjoint_and_cover_shard(digits):
    cfg = DataConfig(partition="dirichlet", alpha=0.5, local_test_fraction=0.25)
    fd = build_federated(cfg, num_clients=10, seed=0, dataset=digits)
    assert fd.num_clients == 10
    everything = []
    for cid in range(10):
        tr, te = fd.train_idx[cid], fd.test_idx[cid]
        assert len(tr) >= 1 and len(te) >= 1
        assert not set(tr.tolist()) & set(te.tolist())
        everything += [tr, te]
        n = len(tr) + len(te)
        assert abs(len(te) - 0.25 * n) <= 1
        assert fd.num_samples(cid, "train") == len(tr)
        assert fd.num_samples(cid, "test") == len(te)
    all_idx = np.concatenate(everything)
    assert len(all_idx) == len(np.unique(all_idx)) == len(digits.y_train)
    summary = fd.summary()
    json.dumps(summary)
    counts = np.array(summary["class_counts_train"]) + np.array(summary["class_counts_test"])
    assert counts.sum() == len(digits.y_train)
    assert np.array_equal(counts.sum(axis=0), np.bincount(digits.y_train))
    again = build_federated(cfg, num_clients=10, seed=0, dataset=digits)
    assert all(np.array_equal(a, b) for a, b in zip(fd.test_idx, again.test_idx, strict=True))


def test_local_split_is_stratified(small_synthetic):
    cfg = DataConfig(dataset="synthetic", partition="iid", local_test_fraction=0.5)
    fd = build_federated(cfg, num_clients=2, seed=0, dataset=small_synthetic)
    for cid in range(2):
        tr = np.bincount(fd.client_arrays(cid, 0, "train")[1], minlength=4)
        te = np.bincount(fd.client_arrays(cid, 0, "test")[1], minlength=4)
        assert np.abs(tr - te).max() <= 1


def test_feature_skew_deterministic_and_identity_at_zero(small_synthetic):
    plain = build_federated(DataConfig(dataset="synthetic"), 4, 0, dataset=small_synthetic)
    skewed = build_federated(DataConfig(dataset="synthetic", feature_skew=1.0), 4, 0,
                             dataset=small_synthetic)
    assert np.all(plain.feature_scale == 1) and np.all(plain.feature_shift == 0)
    assert np.all(plain.feature_noise == 0)
    for cid in range(4):
        x0, y0 = plain.client_arrays(cid, 0, "train")
        raw = small_synthetic.x_train[plain.train_idx[cid]]
        assert np.array_equal(x0, raw) and x0.dtype == np.float32
        x1, y1 = skewed.client_arrays(cid, 0, "train")
        x2, _ = skewed.client_arrays(cid, 7, "train")
        assert np.array_equal(y0, y1)
        assert x1.dtype == np.float32 and not np.allclose(x1, x0)
        assert np.array_equal(x1, x2)  # same pattern every call and round
        scale, shift = skewed.feature_scale[cid], skewed.feature_shift[cid]
        residual = x1 - (raw * scale + shift)
        assert np.allclose(residual, residual[0], atol=1e-5)  # one fixed noise pattern
    assert len(set(skewed.feature_scale.tolist())) == 4
    assert np.all(skewed.feature_scale >= 0.1)
    assert skewed.feature_noise.min() >= 0 and skewed.feature_noise.max() <= 0.5


def test_drift_only_for_drifted_clients_from_drift_round(small_synthetic):
    cfg = DataConfig(dataset="synthetic", drift_round=3, drift_fraction=0.5)
    fd = build_federated(cfg, 6, 0, dataset=small_synthetic)
    assert len(fd.drift_clients) == 3
    assert not np.any(fd.drift_perm == np.arange(fd.num_classes))
    assert sorted(fd.drift_perm.tolist()) == list(range(fd.num_classes))
    for cid in range(6):
        raw = small_synthetic.y_train[fd.test_idx[cid]]
        x_before, before = fd.client_arrays(cid, 2, "test")
        x_after, after = fd.client_arrays(cid, 3, "test")
        assert np.array_equal(before, raw)
        assert np.array_equal(x_before, x_after)
        if cid in fd.drift_clients:
            assert np.array_equal(after, fd.drift_perm[raw])
            assert np.all(after != raw)
        else:
            assert np.array_equal(after, raw)
    no_drift = build_federated(DataConfig(dataset="synthetic"), 6, 0, dataset=small_synthetic)
    assert len(no_drift.drift_clients) == 0
    for seed in range(20):
        perm = build_federated(cfg, 2, seed, dataset=small_synthetic).drift_perm
        assert not np.any(perm == np.arange(len(perm)))


def test_too_many_clients_is_a_config_error(digits):
    with pytest.raises(ConfigError) as info:
        build_federated(DataConfig(min_samples=4), 1000, 0, dataset=digits)
    assert info.value.path == "clients.num_clients"
    assert info.value.value == 1000
    with pytest.raises(ConfigError) as info:
        build_federated(DataConfig(min_samples=4), 400, 0, dataset=digits)
    assert info.value.path == "data.min_samples"
    with pytest.raises(ConfigError) as info:
        build_federated(DataConfig(partition="dirichlet", alpha=0.001, min_samples=20), 50, 0,
                        dataset=digits)
    assert info.value.path == "data.alpha"
    with pytest.raises(ConfigError) as info:
        build_federated(DataConfig(partition="pathological", classes_per_client=2), 3, 0,
                        dataset=digits)
    assert info.value.path == "data.classes_per_client"
    assert "at least 4" in str(info.value)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_through_torchvision(tmp_path, monkeypatch, name):
    raw = write_fake_cifar(tmp_path, name, train_per_file=20, num_test=30)
    patch_cifar_md5(monkeypatch, tmp_path, name)
    ds = load_cifar(str(tmp_path), name)
    assert ds.name == name and ds.num_classes == (10 if name == "cifar10" else 100)
    assert ds.x_train.shape == (100, 3, 32, 32) and ds.x_test.shape == (30, 3, 32, 32)
    assert ds.input_shape == (3, 32, 32)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert np.array_equal(ds.y_train, raw["y_train"])
    assert np.array_equal(ds.y_test, raw["y_test"])
    assert np.allclose(ds.x_train.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    assert np.allclose(ds.x_train.std(axis=(0, 2, 3)), 1, atol=1e-3)
    # Same pixels, NHWC uint8 -> normalised NCHW: a linear map per channel.
    pixels = raw["x_train"].transpose(0, 3, 1, 2).astype(np.float64)
    for ch in range(3):
        r = np.corrcoef(pixels[:, ch].ravel(), ds.x_train[:, ch].ravel())[0, 1]
        assert r > 0.9999
    cfg = DataConfig(dataset=name, root=str(tmp_path))
    assert load_dataset(cfg, seed=0).x_test.shape == (30, 3, 32, 32)


def test_cifar_missing_root_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="data.download=true") as info:
        load_cifar(str(missing), "cifar10")
    assert str(missing) in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        load_cifar(str(empty), "cifar100")
    with pytest.raises(ConfigError, match="data.root"):
        load_dataset(DataConfig(dataset="cifar10"), seed=0)


def test_a_dataset_registers_like_a_method_and_the_config_and_loader_take_it():
    """A package registers a dataset entry; ``data.dataset`` accepts its name, the config
    is checked against its shape without loading it, and the loader builds it."""
    from fedray.core import registry
    from fedray.core.config import load_config
    from fedray.data.catalog import DatasetEntry
    from fedray.data.datasets import Dataset, load_dataset

    def ring(d, seed):
        gen = np.random.default_rng(seed)
        x = gen.normal(size=(60, 5)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        return Dataset("ring", x[:48], y[:48], x[48:], y[48:], 2, (5,))

    entry = registry.register_dataset(DatasetEntry("ring", "arrays", ring, lambda d: ((5,), 2)))
    try:
        cfg = load_config(None, ["data.dataset=ring", "clients.num_clients=3"])
        assert load_dataset(cfg.data, 0).x_train.shape == (48, 5)
        with pytest.raises(ConfigError, match="data.classes_per_client.*2 classes"):
            load_config(None, ["data.dataset=ring", "data.partition=pathological",
                               "data.classes_per_client=3"])
        with pytest.raises(TypeError, match="taken"):
            registry.register_dataset(DatasetEntry("ring", "arrays", ring))
        assert registry.register_dataset(entry) is entry
    finally:
        del registry.DATASETS["ring"]
    with pytest.raises(ConfigError, match="data.dataset.*'digits'"):
        load_config(None, ["data.dataset=ring"])
