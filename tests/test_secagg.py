"""SecAgg / SecAgg+ (issue #32, the protocol core): Shamir sharing, the exact sum of the
surviving clients' inputs mod 2^bits with dropouts at every phase, SecAgg+'s k-regular
graph, a round that falls below the threshold failing as the protocol fails, a tampered
share stopping the round loudly, and every message's bytes per client and phase."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.services.secagg import (
    AEAD_OVERHEAD,
    ELEMENT_BYTES,
    ID_BYTES,
    KEY_BYTES,
    PRIME,
    Drops,
    SecAggError,
    neighbours,
    secure_sum,
    shamir_reconstruct,
    shamir_share,
)


def test_any_t_shares_reconstruct_and_fewer_do_not():
    g = np.random.default_rng(0)
    secret = int.from_bytes(g.bytes(32), "little")
    shares = shamir_share(secret, list(range(7)), 4, g)
    for pick in ([0, 1, 2, 3], [6, 2, 5, 0], [1, 3, 4, 6, 5]):
        assert shamir_reconstruct({h: shares[h] for h in pick}) == secret
    assert shamir_reconstruct({h: shares[h] for h in (0, 1, 2)}) != secret
    assert all(0 <= v < PRIME for v in shares.values())


def inputs_of(n: int, m: int, bits: int, seed: int = 0) -> dict[int, np.ndarray]:
    g = np.random.default_rng(seed)
    return {c: g.integers(0, 1 << bits, m, dtype=np.uint64) for c in range(3, 3 + n)}


def plain_sum(inputs: dict[int, np.ndarray], who, bits: int) -> np.ndarray:
    return (np.sum([inputs[c] for c in who], axis=0, dtype=np.uint64)
            & np.uint64((1 << bits) - 1))


@pytest.mark.parametrize("drops", [
    Drops(),
    Drops(before_share={4}),
    Drops(before_masked={5, 8}),
    Drops(before_unmask={6}),
    Drops(before_share={3}, before_masked={7}, before_unmask={4}),
])
def test_the_unmasked_sum_is_exactly_the_survivors_sum(drops):
    x = inputs_of(8, 40, 16)
    res = secure_sum(x, bits=16, threshold=4, seed=1, round=2, drops=drops)
    gone = drops.before_share | drops.before_masked
    assert res.included == [c for c in sorted(x) if c not in gone]
    assert np.array_equal(res.total, plain_sum(x, res.included, 16))
    assert set(res.seen) == set(res.included)  # what the server saw is masked, not x
    assert all(not np.array_equal(res.seen[c], x[c]) for c in res.seen)
    again = secure_sum(x, bits=16, threshold=4, seed=1, round=2, drops=drops)
    assert np.array_equal(again.total, res.total)  # keys from (seed, round, client)


def test_secagg_plus_masks_only_with_its_k_neighbours_and_still_sums_exactly():
    ids = list(range(12))
    graph = neighbours(ids, 4, seed=0, round=1)
    assert all(len(v) == 4 for v in graph.values())
    assert all(u in graph[v] for u in ids for v in graph[u])  # symmetric
    assert graph != neighbours(ids, 4, seed=0, round=2)  # a new graph each round
    x = {c: v for c, v in zip(ids, inputs_of(12, 30, 32).values(), strict=True)}
    res = secure_sum(x, 32, threshold=2, seed=0, round=1, k=4,
                     drops=Drops(before_masked={3}, before_unmask={9}))
    assert np.array_equal(res.total, plain_sum(x, res.included, 32))
    full = secure_sum(x, 32, threshold=2, seed=0, round=1)
    assert sum(full.up["share"].values()) > 2.5 * sum(res.up["share"].values())


@pytest.mark.parametrize("drops, phase", [
    (Drops(before_share={3, 4, 5, 6, 7}), "shared keys"),
    (Drops(before_masked={3, 4, 5, 6, 7}), "sent masked inputs"),
    (Drops(before_unmask={3, 4, 5, 6, 7}), "answered the unmasking"),
])
def test_a_round_below_the_threshold_fails_as_the_protocol_fails(drops, phase):
    res = secure_sum(inputs_of(8, 10, 16), bits=16, threshold=4, seed=0, round=1, drops=drops)
    assert res.failed and phase in res.reason


def test_a_tampered_share_stops_the_round_loudly():
    x = inputs_of(5, 10, 16)
    with pytest.raises(SecAggError, match="failed authentication"):
        secure_sum(x, 16, threshold=3, seed=0, round=1, tamper=[(4, 5)])


def test_a_substituted_encryption_key_stops_the_round_loudly():
    """The server forwards client 4 a key of its own in place of client 6's: 4 cannot open
    the share 6 sealed for it (or 6 the one 4 sealed), so the round stops, never summing."""
    x = inputs_of(5, 10, 16)
    for pair in [(4, 6), (6, 4)]:
        with pytest.raises(SecAggError, match="failed authentication"):
            secure_sum(x, 16, threshold=3, seed=0, round=1, wrong_keys=[pair])


def test_every_message_is_counted_per_client_and_phase():
    n, m, bits = 6, 25, 20
    x = inputs_of(n, m, bits)
    res = secure_sum(x, bits, threshold=3, seed=0, round=1)
    share = ID_BYTES * 2 + ELEMENT_BYTES * 2 + AEAD_OVERHEAD
    for c in x:
        assert res.up["advertise"][c] == 2 * KEY_BYTES
        assert res.down["advertise"][c] == (n - 1) * (ID_BYTES + 2 * KEY_BYTES)
        assert res.up["share"][c] == res.down["share"][c] == (n - 1) * share
        assert res.up["masked_input"][c] == (bits * m + 7) // 8
        assert res.up["unmask"][c] == (n - 1) * (ID_BYTES + ELEMENT_BYTES)
        assert res.down["unmask"][c] == (n - 1) * ID_BYTES  # its neighbours' status


def test_quantized_updates_sum_exactly_and_decode_within_the_rounding():
    from fedray.services.secagg import dequantize, quantize, required_bits

    g = np.random.default_rng(0)
    n, clip, scale = 7, 0.5, 1000.0
    bits = required_bits(clip, scale, n)
    assert bits == (7 * 500).bit_length() + 1 == 13
    updates = {c: g.normal(0, 0.4, 64) for c in range(n)}
    q = {c: quantize(u, clip, scale, bits, np.random.default_rng(c)) for c, u in
         updates.items()}
    res = secure_sum(q, bits, threshold=4, seed=3, round=1)
    assert np.array_equal(res.total, plain_sum(q, range(n), bits))
    want = np.sum([np.clip(u, -clip, clip) for u in updates.values()], axis=0)
    got = dequantize(res.total, scale, bits)
    assert np.abs(got - want).max() <= n / scale  # each client's rounding is below 1/scale
    assert required_bits(clip, scale, n) > required_bits(clip, scale, 1)


def test_a_threshold_or_width_outside_the_protocol_is_refused():
    x = inputs_of(4, 5, 16)
    with pytest.raises(ValueError, match="threshold"):
        secure_sum(x, 16, threshold=0, seed=0, round=1)
    with pytest.raises(ValueError, match="bits"):
        secure_sum(x, 64, threshold=2, seed=0, round=1)
