"""The one RNG-derivation helper: every random draw comes from (seed, round, client, purpose).

Nothing in fedray reads global RNG state, so a client's draws do not depend on which
executor ran it or in which order. ``round=-1`` / ``client=-1`` mean "not tied to a round /
a client" (e.g. the data partition, the model's initial weights).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator

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

