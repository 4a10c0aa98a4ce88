import numpy as np
import pytest

from fedray.core.seeding import derive_seed, rng, torch_generator


def test_same_key_same_stream_different_key_different_stream():
    a = rng(1, 2, 3, "x").random(5)
    assert np.array_equal(a, rng(1, 2, 3, "x").random(5))
    for other in [rng(2, 2, 3, "x"), rng(1, 3, 3, "x"), rng(1, 2, 4, "x"), rng(1, 2, 3, "y"),
                  rng(1, -1, 3, "x"), rng(1, 2, -1, "x")]:
        assert not np.array_equal(a, other.random(5))


def test_torch_generator_matches_derived_seed():
    import torch

    g = torch_generator(5, 1, 2, "init")
    assert g.initial_seed() == derive_seed(5, 1, 2, "init")
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=torch_generator(
        5, 1, 2, "init")))
    assert 0 <= derive_seed(2**40, 10**6, 10**6, "p") < 2**63


def test_rngs_are_the_one_by_one_generators_bit_for_bit():
    """The vectorized SeedSequence hash against numpy's own, at the word-count edges: seeds
    and rounds of one, two and four 32-bit words, client ids whose id + 1 needs a second
    word, the not-a-client -1, empty and long purposes."""
    import pytest

    from fedray.core.seeding import rngs, seed_sequence

    clients = [-1, 0, 1, 2, 17, 2**32 - 2, 2**32 - 1, 2**32, 2**33 + 5, 2**64, 9_999_999, 3]
    for seed in (0, 7, 2**32 - 1, 2**32, 2**70 + 11):
        for round in (-1, 0, 5, 2**32 + 7):
            for purpose in ("", "population-client", "local-shuffle-e1", "p" * 40):
                got = rngs(seed, round, clients, purpose)
                assert len(got) == len(clients)
                for c, gen in zip(clients, got, strict=True):
                    one = rng(seed, round, c, purpose)
                    assert gen.bit_generator.state == one.bit_generator.state
                    assert np.array_equal(gen.standard_normal(3), one.standard_normal(3))
    seq = rngs(3, 2, [41], "x")[0].bit_generator.seed_seq
    for n, dtype in ((2, np.uint32), (5, np.uint32), (4, np.uint64), (4, np.dtype("u8")),
                     (3, np.uint64)):
        assert np.array_equal(seq.generate_state(n, dtype),
                              seed_sequence(3, 2, 41, "x").generate_state(n, dtype))
    assert rngs(0, 0, []) == []
    with pytest.raises(ValueError, match="client >= -1"):
        rngs(0, 0, [4, -2])


def test_cohort_batches_are_each_clients_own_batches():
    from fedray.models.training import batches, cohort_batches

    sizes, clients = [0, 3, 7, 19, 40, 1, 32], [5, 0, 11, 2, 900, 7, 13]
    for epochs, max_steps in ((1, None), (3, None), (3, 4), (2, 1), (2, 0)):
        got = cohort_batches(sizes, clients, 8, epochs, 4, 2, max_steps, "local")
        for n, c, plan in zip(sizes, clients, got, strict=True):
            want = list(batches(n, 8, epochs, 4, 2, c, max_steps, "local"))
            assert [b.tolist() for b in plan] == [b.tolist() for b in want]


def test_rngs_edges_match_numpy_or_refuse_like_it():
    import pytest

    from fedray.core.seeding import rngs, seed_sequence

    seq = rngs(1, 0, [3])[0].bit_generator.seed_seq
    assert np.array_equal(seq.generate_state(0), seed_sequence(1, 0, 3).generate_state(0))
    with pytest.raises(ValueError):
        seq.generate_state(2, np.int32)
    with pytest.raises(TypeError):
        rngs(1, 0, [3.0])  # as rng(1, 0, 3.0) refuses a float id
    with pytest.raises(TypeError):
        rngs(1, 0, [3])[0].spawn(1)


@pytest.mark.parametrize("highs,n", [((10, 2), 20), ((10, 2), 7), ((62,), 4), ((3, 5, 7, 9), 3),
                                     ((3 * 2**30, 10), 6), ((2**32 - 1,), 2)])
def test_bounded_integers_are_numpys_draws_and_leave_the_stream_where_numpy_does(highs, n):
    """Against ``gen.integers`` call by call, over 300 generators; 3·2**30 rejects a
    quarter of its words, so rewound clients are among them; the next draws agree too."""
    from fedray.core.seeding import _raw_bounded_ok, bounded_integers, rng, rngs

    assert _raw_bounded_ok()  # the raw path is what runs on this numpy
    ids = list(range(300))
    fast, slow = rngs(3, 2, ids, "bounded"), [rng(3, 2, c, "bounded") for c in ids]
    got = bounded_integers(fast, highs, n)
    want = [np.stack([g.integers(0, h, n) for g in slow]) for h in highs]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.int64 and np.array_equal(a, b)
    after = np.stack([g.standard_normal(3, dtype=np.float32) for g in fast])
    assert np.array_equal(after, np.stack([g.standard_normal(3, dtype=np.float32)
                                           for g in slow]))


@pytest.mark.parametrize("highs,n", [((10,), 3), ((1, 10), 4), ((2**32,), 2), ((2**40,), 2)])
def test_bounded_integers_outside_the_raw_rule_loop_with_numpy(highs, n):
    """An odd word count, a one-value range (numpy draws nothing) and ranges of 2**32 or
    more take numpy's own loop: the same numbers and streams."""
    from fedray.core.seeding import bounded_integers, rngs

    fast, slow = rngs(1, -1, range(20), "edge"), rngs(1, -1, range(20), "edge")
    got = bounded_integers(fast, highs, n)
    for a, h in zip(got, highs, strict=True):
        assert np.array_equal(a, np.stack([g.integers(0, h, n) for g in slow]))
    assert [g.random() for g in fast] == [g.random() for g in slow]
