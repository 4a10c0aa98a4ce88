"""Partitioners: disjoint full coverage, size/skew guarantees, determinism, clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedray.core.seeding import rng
from fedray.data.partition import (
    PartitionError,
    dirichlet,
    iid,
    partition,
    pathological,
    quantity,
)

FAST = settings(max_examples=25, deadline=None)


@st.composite
def labelled(draw, max_classes: int = 10):
    """(labels, num_clients, seed) with at least 4 samples per client."""
    num_classes = draw(st.integers(2, max_classes))
    num_clients = draw(st.integers(1, 20))
    n = draw(st.integers(max(num_classes, 4 * num_clients), 400))
    seed = draw(st.integers(0, 2**16))
    gen = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(num_classes), gen.integers(0, num_classes,
                                                                  n - num_classes)])
    return gen.permutation(labels), num_clients, seed


def check_disjoint_cover(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "sorted, no duplicates"
    everything = np.concatenate(parts)
    assert len(everything) == n
    assert len(np.unique(everything)) == n
    assert everything.min() >= 0 and everything.max() < n


def label_entropy(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    ents = []
    for p in parts:
        q = np.bincount(labels[p]) / len(p)
        q = q[q > 0]
        ents.append(-(q * np.log(q)).sum())
    return float(np.mean(ents))


@FAST
@given(n=st.integers(1, 500), num_clients=st.integers(1, 50), seed=st.integers(0, 1000))
def test_iid_sizes_differ_by_at_most_one(n, num_clients, seed):
    if num_clients > n:
        with pytest.raises(PartitionError):
            iid(n, num_clients, rng(seed))
        return
    parts = iid(n, num_clients, rng(seed))
    check_disjoint_cover(parts, n, num_clients)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@FAST
@given(data=labelled(), alpha=st.floats(0.1, 100), min_size=st.integers(1, 4))
def test_dirichlet_cover_and_min_size(data, alpha, min_size):
    labels, num_clients, seed = data
    try:
        parts = dirichlet(labels, num_clients, alpha, rng(seed), min_size)
    except PartitionError as e:  # legitimately possible for tiny alpha and many clients
        assert e.param == "alpha"
        return
    check_disjoint_cover(parts, len(labels), num_clients)
    assert min(len(p) for p in parts) >= min_size


@FAST
@given(data=labelled(), cpc=st.integers(1, 10))
def test_pathological_classes_per_client(data, cpc):
    labels, num_clients, seed = data
    num_classes = len(np.unique(labels))
    if cpc > num_classes or cpc * num_clients < num_classes:
        with pytest.raises(PartitionError) as info:
            pathological(labels, num_clients, cpc, rng(seed))
        assert info.value.param == "classes_per_client"
        return
    parts = pathological(labels, num_clients, cpc, rng(seed))
    check_disjoint_cover(parts, len(labels), num_clients)
    held = [set(np.unique(labels[p]).tolist()) for p in parts]
    assert all(len(h) <= cpc for h in held)
    assert set().union(*held) == set(range(num_classes))


@FAST
@given(n=st.integers(4, 500), num_clients=st.integers(1, 40), alpha=st.floats(0.05, 50),
       min_size=st.integers(0, 5), seed=st.integers(0, 1000))
def test_quantity_cover_and_min_size(n, num_clients, alpha, min_size, seed):
    if num_clients * max(min_size, 1) > n:
        with pytest.raises(PartitionError):
            quantity(n, num_clients, alpha, rng(seed), min_size)
        return
    parts = quantity(n, num_clients, alpha, rng(seed), min_size)
    check_disjoint_cover(parts, n, num_clients)
    assert min(len(p) for p in parts) >= min_size


@FAST
@given(data=labelled(), scheme=st.sampled_from(["iid", "dirichlet", "pathological", "quantity",
                                                 "shard", "inner_dirichlet"]))
def test_same_seed_same_partition_other_seed_differs(data, scheme):
    labels, num_clients, seed = data
    kwargs = dict(alpha=5.0, classes_per_client=len(np.unique(labels)), min_size=1)
    a = partition(labels, num_clients, scheme, rng(seed, -1, -1, "partition"), **kwargs)
    b = partition(labels, num_clients, scheme, rng(seed, -1, -1, "partition"), **kwargs)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    check_disjoint_cover(a, len(labels), num_clients)
    if num_clients > 1 and len(labels) >= 20:
        c = partition(labels, num_clients, scheme, rng(seed + 1, -1, -1, "partition"), **kwargs)
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_small_alpha_is_more_skewed():
    labels = np.repeat(np.arange(10), 200)
    skewed = dirichlet(labels, 20, 0.05, rng(3, -1, -1, "partition"), min_size=1)
    uniform = dirichlet(labels, 20, 100.0, rng(3, -1, -1, "partition"), min_size=1)
    low, high = label_entropy(labels, skewed), label_entropy(labels, uniform)
    assert low < 0.6 * high
    assert high > 0.9 * np.log(10)


def test_quantity_small_alpha_varies_sizes_with_spread_labels():
    labels = np.repeat(np.arange(10), 500)
    parts = quantity(len(labels), 20, 0.2, rng(5, -1, -1, "partition"), min_size=2)
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() > 5 * sizes.min()
    big = parts[int(np.argmax(sizes))]
    assert len(np.unique(labels[big])) == 10  # labels stay IID within the biggest client
    even = quantity(len(labels), 20, 1000.0, rng(5, -1, -1, "partition"), min_size=2)
    even_sizes = np.array([len(p) for p in even])
    assert even_sizes.std() < sizes.std() / 5


def test_impossible_requests_raise():
    labels = np.repeat(np.arange(10), 10)
    with pytest.raises(PartitionError, match="only 100 samples") as info:
        partition(labels, 101, "iid", rng(0), min_size=1)
    assert info.value.param == "num_clients"
    with pytest.raises(PartitionError, match="min_size") as info:
        partition(labels, 30, "iid", rng(0), min_size=4)
    assert info.value.param == "min_size"
    with pytest.raises(PartitionError, match="cannot cover") as info:
        partition(labels, 4, "pathological", rng(0), classes_per_client=2)
    assert info.value.param == "classes_per_client"
    with pytest.raises(PartitionError, match="1..10"):
        partition(labels, 4, "pathological", rng(0), classes_per_client=11)
    with pytest.raises(PartitionError, match="alpha") as info:
        partition(labels, 25, "dirichlet", rng(0), alpha=0.001, min_size=4)
    assert info.value.param == "alpha"
    with pytest.raises(PartitionError, match="unknown partition scheme"):
        partition(labels, 2, "bogus", rng(0))
    with pytest.raises(PartitionError):
        partition(labels, 0, "iid", rng(0))
    assert issubclass(PartitionError, ValueError)


def test_large_partition_is_fast():
    import time

    labels = np.random.default_rng(0).integers(0, 10, 100_000)
    for scheme in ["iid", "dirichlet", "pathological", "quantity"]:
        start = time.perf_counter()
        parts = partition(labels, 1000, scheme, rng(0, -1, -1, "partition"), alpha=0.5)
        assert time.perf_counter() - start < 1.0, scheme
        assert sum(len(p) for p in parts) == 100_000


def test_pathological_exact_classes_when_data_suffices():
    labels = np.repeat(np.arange(10), 300)
    parts = pathological(labels, 50, 3, rng(1, -1, -1, "partition"))
    assert all(len(np.unique(labels[p])) == 3 for p in parts)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() > 0


@pytest.mark.parametrize("kind, sizes", [
    ("linear", [10, 20, 30, 40]),        # 100 * i / 10
    ("square", [3, 13, 30, 54]),         # floor(100 * i^2 / 30); the 1 left to the last
    ("exponential", [3, 8, 23, 66]),     # floor(100 * e^i / sum e^j); the 2 left to the last
])
def test_size_partitions_are_flower_datasets_sizes(kind, sizes):
    """Flower Datasets' Linear/Square/ExponentialPartitioner shares (SizePartitioner: floor,
    the remainder to the last partition); the samples a seeded permutation, all used once."""
    from fedray.data.partition import partition

    labels = np.arange(100) % 10
    parts = partition(labels, 4, kind, np.random.default_rng(1), min_size=2)
    assert [len(p) for p in parts] == sizes
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(100))
    again = partition(labels, 4, kind, np.random.default_rng(1), min_size=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_exponential_sizes_do_not_overflow_and_small_shares_are_refused():
    from fedray.data.partition import PartitionError, partition

    parts = partition(np.zeros(10_000, int), 800, "exponential", np.random.default_rng(0),
                      min_size=0)
    assert sum(len(p) for p in parts) == 10_000 and len(parts[-1]) > 6_000
    with pytest.raises(PartitionError) as e:
        partition(np.zeros(100, int), 20, "square", np.random.default_rng(0), min_size=2)
    assert e.value.param == "num_clients" and "square" in str(e.value)


def test_shards_are_mcmahans_label_sorted_split():
    """MNIST's shape (60,000 samples sorted by label, 100 clients x 2 shards of 300): every
    client holds two runs of one label each (at most 4 labels with boundary shards), all
    samples once; an uneven count spreads the remainder one per shard."""
    from fedray.data.partition import shard

    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 6000))
    parts = shard(labels, 100, 2, rng(3, -1, -1, "partition"))
    check_disjoint_cover(parts, 60_000, 100)
    assert {len(p) for p in parts} == {600}
    assert max(len(np.unique(labels[p])) for p in parts) <= 2  # 300 | 6000: shards never straddle
    odd = shard(labels[:1003], 10, 3, rng(1))
    check_disjoint_cover(odd, 1003, 10)
    assert {len(p) for p in odd} <= {99, 100, 101, 102}  # 3 of 30 shards of 33 or 34 (13 of 34)
    assert sum(len(np.unique(labels[:1003][p])) for p in odd) <= 10 * 3 * 2
    with pytest.raises(PartitionError) as e:
        shard(labels[:50], 10, 6, rng(1))
    assert e.value.param == "shards_per_client"


def test_inner_dirichlet_has_exact_sizes_and_its_own_class_prior():
    """Flower's InnerDirichletPartitioner: sizes exactly as given, every sample once, small
    alpha concentrates each client on few classes, large alpha spreads them; no class is
    over-drawn even when priors pile onto one class."""
    from fedray.data.partition import inner_dirichlet

    labels = np.repeat(np.arange(10), 100)
    sizes = np.array([50, 150, 100, 200, 500])
    parts = inner_dirichlet(labels, sizes, 0.1, rng(0))
    check_disjoint_cover(parts, 1000, 5)
    assert [len(p) for p in parts] == sizes.tolist()
    spread = inner_dirichlet(labels, sizes, 100.0, rng(0))
    assert label_entropy(labels, parts) < label_entropy(labels, spread) - 0.5
    skewed = np.array([0] * 900 + list(range(1, 10)) * 10 + [0] * 10)[:1000]
    check_disjoint_cover(inner_dirichlet(skewed, sizes, 0.05, rng(1)), 1000, 5)
    eq = partition(labels, 7, "inner_dirichlet", rng(2), alpha=0.5)
    assert sorted(len(p) for p in eq) == [142] * 1 + [143] * 6  # 1000 = 6 x 143 + 142
    q = partition(labels, 7, "inner_dirichlet", rng(2), alpha=0.5, inner_sizes="linear")
    assert [len(p) for p in q] == [len(p) for p in partition(labels, 7, "linear", rng(2))]
    with pytest.raises(PartitionError):
        inner_dirichlet(labels, np.array([10, 10]), 0.5, rng(0))
    with pytest.raises(PartitionError):
        inner_dirichlet(labels, np.array([500.0, 500.0]), 0.5, rng(0))
    # Flower deals one sample at a time to a random client: two clients whose priors both
    # favour class 0 share its exhaustion evenly instead of the first taking it all
    two = np.repeat(np.arange(2), 500)
    got = [np.bincount(two[p], minlength=2) for p in inner_dirichlet(
        two, np.array([500, 500]), 1e-3, rng(0))]
    assert all(200 < g[0] < 300 for g in got), got


def test_shard_and_inner_dirichlet_through_the_config():
    from fedray.core.config import load_config
    from fedray.core.spec import ConfigError
    from fedray.data import build_data

    cfg = load_config(None, ["clients.num_clients=10", "data.partition=shard",
                             "data.shards_per_client=2"])
    data = build_data(cfg)
    assert data.num_clients == 10
    too_many = load_config(None, ["clients.num_clients=10", "data.partition=shard",
                                  "data.shards_per_client=500"])
    with pytest.raises(ConfigError) as e:
        build_data(too_many)
    assert e.value.path == "data.shards_per_client"
    cfg = load_config(None, ["clients.num_clients=10", "data.partition=inner_dirichlet",
                             "data.inner_sizes=linear"])
    assert build_data(cfg).num_clients == 10
