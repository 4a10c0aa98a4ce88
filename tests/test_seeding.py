import numpy as np

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
