"""The one RNG-derivation helper: every random draw comes from (seed, round, client, purpose).

Nothing in fedray reads global RNG state, so a client's draws do not depend on which
executor ran it or in which order. ``round=-1`` / ``client=-1`` mean "not tied to a round /
a client" (e.g. the data partition, the model's initial weights).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import operator
from collections.abc import Iterator, Sequence

import numpy as np


@functools.lru_cache(maxsize=4096)
def _purpose_key(purpose: str) -> int:
    return int.from_bytes(hashlib.blake2b(purpose.encode(), digest_size=8).digest(), "little")


def seed_sequence(seed: int, round: int = -1, client: int = -1,
                  purpose: str = "") -> np.random.SeedSequence:
    """A ``SeedSequence`` unique to (seed, round, client, purpose)."""
    if seed < 0 or round < -1 or client < -1:
        raise ValueError(f"seed >= 0, round >= -1, client >= -1 required, got "
                         f"{(seed, round, client)}")
    return np.random.SeedSequence(entropy=seed,
                                  spawn_key=(round + 1, client + 1, _purpose_key(purpose)))


def derive_seed(seed: int, round: int = -1, client: int = -1, purpose: str = "") -> int:
    """A 63-bit integer seed (fits ``torch.Generator.manual_seed``)."""
    state = seed_sequence(seed, round, client, purpose).generate_state(2, np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) & ((1 << 63) - 1))


def rng(seed: int, round: int = -1, client: int = -1, purpose: str = "") -> np.random.Generator:
    """A numpy ``Generator`` for (seed, round, client, purpose)."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, round, client, purpose)))


# numpy's SeedSequence hash (numpy/random/bit_generator.pyx), stream-compatible
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4
_U32 = np.uint32


def _words(n: int) -> list[int]:
    """``n``'s little-endian uint32 words as SeedSequence splits an int (0 → [0])."""
    out = [n & 0xFFFFFFFF]
    n >>= 32
    while n:
        out.append(n & 0xFFFFFFFF)
        n >>= 32
    return out


def _pools(entropy: np.ndarray) -> np.ndarray:
    """The 4-word pools of SeedSequences whose assembled entropy words are the rows of
    ``entropy`` (M × L uint32, L >= 4): ``mix_entropy``, one row per sequence at once.
    The hash constant advances the same way for every row, so it stays a Python int."""
    hc = _INIT_A

    def hashmix(v: np.ndarray) -> np.ndarray:
        nonlocal hc
        v = v ^ _U32(hc)
        hc = hc * _MULT_A & 0xFFFFFFFF
        v = v * _U32(hc)
        return v ^ (v >> _U32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = _U32(_MIX_L) * x - _U32(_MIX_R) * y
        return r ^ (r >> _U32(16))

    pool = [hashmix(entropy[:, i]) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, entropy.shape[1]):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy[:, src]))
    return np.stack(pool, axis=1)


def _generate(pools: np.ndarray, n_words: int) -> np.ndarray:
    """``SeedSequence.generate_state(n_words, np.uint32)`` of each pool (rows)."""
    hc, out = _INIT_B, []
    for i in range(n_words):
        v = pools[:, i % _POOL] ^ _U32(hc)
        hc = hc * _MULT_B & 0xFFFFFFFF
        v = v * _U32(hc)
        out.append(v ^ (v >> _U32(16)))
    return np.stack(out, axis=1)


class _Pooled(np.random.bit_generator.ISeedSequence):
    """A SeedSequence already mixed (its pool, and the four 64-bit words PCG64 asks for,
    computed for many sequences at once by :func:`rngs`): ``generate_state`` gives what
    the ``SeedSequence`` of the same (seed, round, client, purpose) gives. Nothing in
    fedray spawns from a client's generator, and this one cannot: ``spawn`` raises
    ``TypeError``, as numpy does for any non-spawnable sequence."""

    def __init__(self, pool: np.ndarray, pcg64: np.ndarray):
        self.pool, self.pcg64 = pool, pcg64

    def generate_state(self, n_words: int, dtype: type = np.uint32) -> np.ndarray:
        if n_words == 4 and dtype is np.uint64:  # what PCG64 asks: 0.1 µs, not 0.7 µs
            return self.pcg64.copy()
        kind = np.dtype(dtype)
        if kind not in (np.dtype(np.uint32), np.dtype(np.uint64)):
            raise ValueError("only support uint32 or uint64")
        wide = kind == np.dtype(np.uint64)
        if n_words == 0:
            return np.zeros(0, kind)
        with np.errstate(over="ignore"):
            words = _generate(self.pool[None], n_words * (2 if wide else 1))[0]
        return words.astype("<u4").view("<u8").astype(np.uint64) if wide else words


def rngs(seed: int, round: int, clients: Sequence[int], purpose: str = ""
         ) -> list[np.random.Generator]:
    """``[rng(seed, round, c, purpose) for c in clients]``, the same generators (the same
    streams, bit for bit), for a fraction of the cost: the ``SeedSequence`` hash runs once
    over all clients as uint32 array arithmetic, instead of ≈ 14 µs of sequence and
    ``PCG64`` construction per client. For loops that seed one generator per client of a
    cohort."""
    ids = [operator.index(c) for c in clients]
    if seed < 0 or round < -1 or any(c < -1 for c in ids):
        raise ValueError(f"seed >= 0, round >= -1, client >= -1 required, got "
                         f"{(seed, round, min(ids, default=-1))}")
    head = _words(seed)
    head += [0] * (_POOL - len(head))  # spawn-keyed: entropy padded to the pool size
    head += _words(round + 1)
    tail = _words(_purpose_key(purpose))
    out: list[np.random.Generator | None] = [None] * len(ids)
    by_width: dict[int, list[int]] = {}  # rows by the word count of client + 1
    if all(c < 0xFFFFFFFF for c in ids):
        by_width[1] = list(range(len(ids)))
    else:
        for i, c in enumerate(ids):
            by_width.setdefault(len(_words(c + 1)), []).append(i)
    for width, rows in by_width.items():
        middle = np.array([_words(ids[i] + 1) for i in rows], dtype=np.uint32) \
            if width > 1 else np.array([ids[i] + 1 for i in rows], np.uint32)[:, None]
        entropy = np.concatenate([np.tile(np.array(head, np.uint32), (len(rows), 1)), middle,
                                  np.tile(np.array(tail, np.uint32), (len(rows), 1))], axis=1)
        with np.errstate(over="ignore"):
            pools = _pools(entropy)
            wide = _generate(pools, 8).astype("<u4").view("<u8").astype(np.uint64)
        for j, i in enumerate(rows):
            out[i] = np.random.Generator(np.random.PCG64(_Pooled(pools[j], wide[j])))
    return out  # type: ignore[return-value]


_LOW32 = np.uint64(0xFFFFFFFF)


def _lemire(words: np.ndarray, high: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's bounded draw of [0, high) from uint32 words (Lemire's multiply-shift, as in
    ``random_bounded_uint64_fill`` for a range below 2**32): the values, and where a word
    falls in the rejection zone (numpy would draw again there)."""
    m = words.astype(np.uint64) * np.uint64(high)
    return (m >> np.uint64(32)).astype(np.int64), (m & _LOW32) < (2**32 - high) % high


def _bounded_loop(gens: Sequence[np.random.Generator], highs: Sequence[int], n: int
                  ) -> list[np.ndarray]:
    out = [np.empty((len(gens), n), np.int64) for _ in highs]
    for i, gen in enumerate(gens):
        for o, high in zip(out, highs, strict=True):
            o[i] = gen.integers(0, high, n)
    return out


@functools.lru_cache(maxsize=1)
def _raw_bounded_ok() -> bool:
    """Whether :func:`bounded_integers`' reading of the raw stream gives this numpy's
    ``integers`` (checked once per process on a few generators; if not, it loops)."""
    if not np.little_endian:
        return False
    highs, n = (10, 2, 1_000_003, 3, 3 * 2**30), 6  # the last rejects a quarter of words
    fast = _bounded_raw([rng(7, -1, c, "check") for c in range(8)], highs, n)
    slow = _bounded_loop([rng(7, -1, c, "check") for c in range(8)], highs, n)
    return all(np.array_equal(a, b) for a, b in zip(fast, slow, strict=True))


def _bounded_raw(gens: Sequence[np.random.Generator], highs: Sequence[int], n: int
                 ) -> list[np.ndarray]:
    words = len(highs) * n // 2
    raw = np.empty((len(gens), words), np.uint64)
    for i, gen in enumerate(gens):
        raw[i] = gen.bit_generator.random_raw(words)
    low = raw.view(np.uint32)  # each 64-bit draw's low half first, as next_uint32 reads it
    out, redo = [], np.zeros(len(gens), bool)
    for j, high in enumerate(highs):
        values, rejected = _lemire(low[:, j * n:(j + 1) * n], high)
        out.append(values)
        redo |= rejected.any(axis=1)
    for i in np.flatnonzero(redo):  # ≈ 1e-8 a client: back to the start, numpy's own loop
        gens[i].bit_generator.advance(2**128 - words)
        for o, row in zip(out, _bounded_loop([gens[i]], highs, n), strict=True):
            o[i] = row[0]
    return out


def bounded_integers(gens: Sequence[np.random.Generator], highs: Sequence[int], n: int
                     ) -> list[np.ndarray]:
    """For fresh generators (from :func:`rng` / :func:`rngs`, nothing drawn yet): for each
    ``high`` in turn, ``n`` draws of ``gen.integers(0, high, n)`` from every generator,
    stacked ((K, n) int64 each) — the same numbers, and each generator's stream left
    where those calls leave it (its buffered half-word flag included). A generator that
    has drawn before may hold a buffered half-word: pass only fresh ones.

    Why: numpy's ``integers`` costs ≈ 4.6 µs a call, mostly argument handling. Here each
    generator gives its ``len(highs) * n`` 32-bit words in one ``random_raw`` call and
    numpy's bounded rule (Lemire's multiply-shift on the low then the high half of each
    64-bit draw) runs on the whole stack. A client whose words hit the rule's rejection
    zone (probability (2**32 mod high) / 2**32 a word) is rewound and drawn by numpy
    itself. Used when every ``high`` is in [2, 2**32), the word count is even (a fresh
    generator then ends with no half-used draw, as numpy's does) and a one-time check
    against this numpy agrees; otherwise the plain loop."""
    highs = [operator.index(h) for h in highs]
    if (not gens or (len(highs) * n) % 2 or not all(2 <= h < 2**32 for h in highs)
            or not all(isinstance(g.bit_generator, np.random.PCG64) for g in gens)
            or not _raw_bounded_ok()):
        return _bounded_loop(gens, highs, n)
    return _bounded_raw(gens, highs, n)


def torch_generator(seed: int, round: int = -1, client: int = -1, purpose: str = "",
                    device: str = "cpu"):
    """A ``torch.Generator`` for (seed, round, client, purpose)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, round, client, purpose))
    return g


@contextlib.contextmanager
def torch_seeded(seed: int, round: int = -1, client: int = -1, purpose: str = ""
                 ) -> Iterator[None]:
    """Run the body with torch's global CPU generator seeded from ``(seed, round, client,
    purpose)`` and restore it afterwards: the one way fedray seeds torch's global draws
    (initialisations, dropout masks). Draws made on the CPU are the same on any device.
    CUDA generators are seeded too once CUDA is up (as ``torch.manual_seed`` would), but not
    queued for a lazy start: that queueing records a stack trace per call, most of a small
    client's update on a CPU executor."""
    import torch

    s = derive_seed(seed, round, client, purpose)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(s)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(s)
        yield


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=1024)
def _uniform_key(seed: int, round: int, purpose: str) -> int:
    return derive_seed(seed, round, -1, purpose)


def uniform(seed: int, round: int, clients: np.ndarray | int, purpose: str) -> np.ndarray:
    """One uniform draw in [0, 1) per client of ``clients``, a pure function of (seed,
    round, client, purpose) computed without a generator per client (SplitMix64 of a key
    from :func:`derive_seed`): used where a draw per member of a million-client population
    is needed at once (tier by fractions, availability, dropout)."""
    key = np.uint64(_uniform_key(seed, round, purpose))
    ids = np.asarray(clients, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix(_splitmix(ids ^ key) + key)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

