"""In-memory datasets: scikit-learn digits, a seeded synthetic mixture, and torchvision CIFAR.

Every loader returns a :class:`Dataset` of plain numpy arrays (float32 inputs, int64 labels),
already normalised, so the federated layer only ever indexes arrays. Nothing is downloaded
unless ``download=True`` is passed to :func:`load_cifar`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedray.core.config import DataConfig
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError


@dataclass
class Dataset:
    """Train and test arrays of one dataset; ``input_shape`` is the shape of one sample.

    ``train_ids`` / ``test_ids`` name each row by its sample, so that a base pretrained on
    some samples can be checked against a run's test split (:func:`fedray.models.pretrain.
    check_base_split`): digits number a sample by its index in scikit-learn's array (the
    same sample whatever the split seed); synthetic by (seed, index) as ``seed·2³² + index``
    (another seed draws other samples); CIFAR its train rows 0…N−1 and test rows after them
    (a split fixed by the files). None: the loader does not say (nothing can be checked)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    train_ids: np.ndarray | None = None
    test_ids: np.ndarray | None = None


def stratified_split(labels: np.ndarray, test_fraction: float,
                     gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays with each class split in ``test_fraction``.

    Each class contributes ``round(test_fraction * class_size)`` samples to the test side, so
    both sides keep the class proportions of ``labels``.
    """
    labels = np.asarray(labels)
    perm = gen.permutation(len(labels))
    grouped = perm[np.argsort(labels[perm], kind="stable")]
    _, starts, counts = np.unique(labels[grouped], return_index=True, return_counts=True)
    rank = np.arange(len(labels)) - np.repeat(starts, counts)
    n_test = np.rint(test_fraction * counts).astype(np.int64)
    is_test = rank < np.repeat(n_test, counts)
    return np.sort(grouped[~is_test]), np.sort(grouped[is_test])


def load_digits(image_size: int | None = None, channels: int = 1, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 samples, 10 classes), split 80/20 stratified.

    Pixels are scaled to [0, 1] and standardised with the train set's mean and std (one
    scalar each, so upsampled and replicated channels stay consistent). With ``image_size``
    the images are bilinearly upsampled to ``image_size`` x ``image_size``; ``channels`` (1-3)
    replicates the grey image, e.g. to feed CIFAR-shaped models.
    """
    from sklearn.datasets import load_digits as sk_load_digits

    if not 1 <= channels <= 3:
        raise ValueError(f"channels must be 1, 2 or 3, got {channels}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be positive, got {image_size}")
    bunch = sk_load_digits()
    x = (bunch.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    train, test = stratified_split(y, 0.2, rng(seed, -1, -1, "digits-split"))
    mean, std = float(x[train].mean()), float(x[train].std())
    x = (x - mean) / std
    if image_size is not None and image_size != 8:
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            x = F.interpolate(torch.from_numpy(x), size=(image_size, image_size),
                              mode="bilinear", align_corners=False).numpy()
    if channels > 1:
        x = np.repeat(x, channels, axis=1)
    x = np.ascontiguousarray(x, dtype=np.float32)
    return Dataset("digits", x[train], y[train], x[test], y[test], 10, tuple(x.shape[1:]),
                   train.astype(np.int64), test.astype(np.int64))


def make_synthetic(num_samples: int = 6000, num_features: int = 784, num_classes: int = 10,
                   test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """A seeded Gaussian-mixture classification set with flat samples of ``num_features``.

    Each class is a mixture of two clusters whose centres lie on a random low-dimensional
    subspace; isotropic noise fills all features. The classes overlap, so a linear model
    scores well above chance but clearly below 100% and an MLP has something to learn.
    Features are standardised with the train mean/std.
    """
    if num_samples < 2 * num_classes or num_classes < 2 or num_features < 1:
        raise ValueError(f"need num_classes >= 2, num_features >= 1 and num_samples >= "
                         f"2 * num_classes; got {(num_samples, num_features, num_classes)}")
    gen = rng(seed, -1, -1, "synthetic")
    latent = min(num_features, max(2, num_classes))
    basis, _ = np.linalg.qr(gen.standard_normal((num_features, latent)))
    centres = gen.standard_normal((num_classes, 2, latent)) * 1.0
    y = np.arange(num_samples) % num_classes
    y = y[gen.permutation(num_samples)].astype(np.int64)
    cluster = gen.integers(0, 2, num_samples)
    z = centres[y, cluster] + 0.6 * gen.standard_normal((num_samples, latent))
    noise_scale = np.float32(0.5 / np.sqrt(max(1.0, num_features / latent)))
    x = gen.standard_normal((num_samples, num_features), dtype=np.float32)
    x *= noise_scale
    x += z.astype(np.float32) @ basis.T.astype(np.float32)
    train, test = stratified_split(y, test_fraction, gen)
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0) + np.float32(1e-6)
    x -= mean
    x /= std
    ids = (np.int64(seed) << np.int64(32)) + np.arange(num_samples, dtype=np.int64)
    return Dataset("synthetic", x[train], y[train], x[test], y[test], num_classes,
                   (num_features,), ids[train], ids[test])


_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def load_cifar(root: str, name: Literal["cifar10", "cifar100"],
               download: bool = False) -> Dataset:
    """CIFAR-10/100 through torchvision's own loaders, as NCHW float32 arrays.

    Inputs are scaled to [0, 1] and normalised with the train set's per-channel mean/std.
    A missing or incomplete ``root`` raises :class:`FileNotFoundError` unless ``download``.
    """
    from torchvision import datasets as tvd

    if name not in _CIFAR_FOLDERS:
        raise ValueError(f"name must be 'cifar10' or 'cifar100', got {name!r}")
    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    missing = FileNotFoundError(
        f"{name} not found under root {root!r} (expected torchvision's "
        f"'{_CIFAR_FOLDERS[name]}' folder there); copy the dataset into that directory or "
        f"set data.download=true to let torchvision fetch it")
    if not download and not os.path.isdir(root):
        raise missing
    try:
        train = cls(root, train=True, download=download)
        test = cls(root, train=False, download=download)
    except RuntimeError as e:
        if download:
            raise
        raise missing from e

    def to_array(ds) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(ds.data, dtype=np.float32).transpose(0, 3, 1, 2) / np.float32(255.0)
        return np.ascontiguousarray(x), np.asarray(ds.targets, dtype=np.int64)

    x_train, y_train = to_array(train)
    x_test, y_test = to_array(test)
    mean = x_train.mean(axis=(0, 2, 3), dtype=np.float64).astype(np.float32)[None, :, None, None]
    std = x_train.std(axis=(0, 2, 3), dtype=np.float64).astype(np.float32)[None, :, None, None]
    std = np.maximum(std, np.float32(1e-6))
    x_train -= mean
    x_train /= std
    x_test -= mean
    x_test /= std
    num_classes = 10 if name == "cifar10" else 100
    n = len(y_train)
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes, tuple(x_train.shape[1:]),
                   np.arange(n, dtype=np.int64), np.arange(n, n + len(y_test), dtype=np.int64))


def load_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """The dataset named by ``cfg.dataset`` (its registry entry,
    :mod:`fedray.data.catalog`), built with the config's knobs and ``seed``, or
    ``data.split_seed`` where it is set (the seed of the train/test split)."""
    from fedray.core import registry

    entry = registry.dataset(cfg.dataset)
    if entry.load is None:
        arrays = [n for n, e in registry.datasets().items() if e.load is not None]
        raise ConfigError("data.dataset", cfg.dataset,
                          "one of " + ", ".join(repr(n) for n in arrays))
    return entry.load(cfg, seed if cfg.split_seed is None else int(cfg.split_seed))
