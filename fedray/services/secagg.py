"""Secure aggregation, really run (issue #32, the protocol core): SecAgg (Bonawitz et al.,
CCS 2017, the semi-honest protocol of Fig. 4) and SecAgg+ (Bell et al., CCS 2020: masks and
shares only between neighbours of a random k-regular graph), with real primitives from
``cryptography`` and Shamir secret sharing over the prime field of p = 2⁵²¹ − 1.

One call, :func:`secure_sum`, plays the server and every client of one round and returns
the sum of the surviving clients' inputs — integer vectors in Z_R, R = 2^``bits`` — exactly,
or a failed round, plus every message's bytes per client and phase:

0. *advertise keys*: client u sends two X25519 public keys (c_u for encryption, s_u for
   masks); the server sends each u its neighbours' keys.
1. *share keys*: u draws a mask seed b_u, Shamir-shares s_u's private key and b_u among its
   neighbours with threshold t, and sends each share pair to its neighbour v encrypted
   with AES-GCM under HKDF(X25519(c_u, c_v)) (the server only forwards ciphertexts).
2. *masked input*: u sends y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv)
   (mod R), s_uv = HKDF(X25519(s_u, s_v)), PRG = AES-256-CTR keystream read as
   little-endian ``bits``-bit words.
3. *unmasking*: each surviving u sends, for every neighbour v, its share of b_v (v sent a
   masked input) or of s_v's key (v dropped after sharing). The server needs t shares per
   secret: it removes PRG(b_v) of every survivor and the pairwise masks the dropped
   clients left in their neighbours' inputs. Fewer than t responding neighbours for any
   secret — or fewer than t clients left in any phase — and the round fails, as the
   protocol does; a share that does not authenticate fails it loudly, never as a wrong sum.

Simulation choices (stated, tested): every client's keys and seeds come from
``rng(seed, round, client, ...)`` so a round repeats bit for bit (a simulator's keys are
not secret from whoever holds the seed); the semi-honest variant (no signatures, no
consistency check: Bonawitz et al.'s Fig. 4 without the active-adversary additions);
SecAgg is SecAgg+ on the complete graph. Byte counts: a public key 32 B, a client id 4 B, a
field element 66 B, an AES-GCM ciphertext its plaintext + 12 B nonce + 16 B tag, a masked
input ⌈bits · m / 8⌉ B for m elements.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from fedray.core.seeding import rng

PRIME = (1 << 521) - 1
ELEMENT_BYTES = 66
KEY_BYTES = 32
ID_BYTES = 4
AEAD_OVERHEAD = 12 + 16
PHASES = ("advertise", "share", "masked_input", "unmask")


class SecAggError(RuntimeError):
    """A message that does not authenticate, or a reconstruction that is inconsistent: the
    round stops loudly rather than return a wrong sum."""


# ----------------------------------------------------------------------------- Shamir


def shamir_share(secret: int, holders: list[int], t: int, gen: np.random.Generator
                 ) -> dict[int, int]:
    """Shares of ``secret`` (0 ≤ secret < p) for each holder id (evaluated at x = id + 1),
    any ``t`` of which reconstruct it: a random polynomial of degree t − 1 over GF(p)."""
    if not 0 <= secret < PRIME:
        raise ValueError("secret outside the field")
    coeffs = [secret] + [int.from_bytes(gen.bytes(ELEMENT_BYTES), "little") % PRIME
                         for _ in range(t - 1)]
    out = {}
    for h in holders:
        x, acc = h + 1, 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % PRIME
        out[h] = acc
    return out


def shamir_reconstruct(shares: dict[int, int]) -> int:
    """The secret from shares {holder id: value} (Lagrange interpolation at 0)."""
    xs = {h: h + 1 for h in shares}
    secret = 0
    for h, y in shares.items():
        num, den = 1, 1
        for g in shares:
            if g != h:
                num = num * (-xs[g]) % PRIME
                den = den * (xs[h] - xs[g]) % PRIME
        secret = (secret + y * num * pow(den, PRIME - 2, PRIME)) % PRIME
    return secret


# ----------------------------------------------------------------------------- crypto


def _x25519(seed: int, round: int, client: int, purpose: str):
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return X25519PrivateKey.from_private_bytes(rng(seed, round, client, purpose).bytes(32))


def _raw(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(key, "private_bytes"):
        return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _agree(private, public_raw: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 shared secret: a 32-byte key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    shared = private.exchange(X25519PublicKey.from_public_bytes(public_raw))
    return HKDF(hashes.SHA256(), 32, None, info).derive(shared)


def prg(key: bytes, m: int, bits: int) -> np.ndarray:
    """m words of ``bits`` bits (uint64) from AES-256-CTR's keystream under ``key``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    width = 8 if bits > 32 else 4
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
    stream = enc.update(b"\0" * (width * m)) + enc.finalize()
    words = np.frombuffer(stream, dtype="<u8" if width == 8 else "<u4").astype(np.uint64)
    return words & np.uint64((1 << bits) - 1) if bits < 64 else words


def _seal(key: bytes, nonce_seed: bytes, plaintext: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = hashlib.sha256(nonce_seed).digest()[:12]
    return nonce + AESGCM(key).encrypt(nonce, plaintext, None)


def _open(key: bytes, message: bytes) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(message[:12], message[12:], None)
    except InvalidTag:
        raise SecAggError("a share ciphertext failed authentication (tampered, or a "
                          "wrong key): the round stops") from None


# ----------------------------------------------------------------------------- graph


def neighbours(clients: list[int], k: int | None, seed: int, round: int
               ) -> dict[int, list[int]]:
    """Who masks and shares with whom: everyone (SecAgg, ``k`` None) or, for SecAgg+, a
    random k-regular graph — Bell et al.'s Harary-graph construction: the clients in a
    random order from ``(seed, round)`` on a ring, each linked to the k/2 nearest on either
    side (k even, k < n)."""
    ids = sorted(clients)
    if k is None or k >= len(ids) - 1:
        return {u: [v for v in ids if v != u] for u in ids}
    if k % 2 or k < 2:
        raise ValueError(f"SecAgg+ degree k: an even number >= 2, got {k}")
    order = [ids[i] for i in rng(seed, round, -1, "secagg-graph").permutation(len(ids))]
    n = len(order)
    out: dict[int, set[int]] = {u: set() for u in ids}
    for i, u in enumerate(order):
        for d in range(1, k // 2 + 1):
            for v in (order[(i + d) % n], order[(i - d) % n]):
                out[u].add(v)
    return {u: sorted(vs) for u, vs in out.items()}


# ----------------------------------------------------------------------------- protocol


@dataclass
class Drops:
    """Clients that stop responding before each phase (after advertising, after sharing,
    after sending their masked input)."""

    before_share: set[int] = field(default_factory=set)
    before_masked: set[int] = field(default_factory=set)
    before_unmask: set[int] = field(default_factory=set)


@dataclass
class SecAggResult:
    """The round: the exact sum of the included clients' inputs mod 2^bits (None when the
    round failed, with ``reason``), who is included, and each client's bytes up and down
    per phase."""

    total: np.ndarray | None
    included: list[int]
    reason: str | None
    up: dict[str, dict[int, int]]
    down: dict[str, dict[int, int]]
    seen: dict[int, np.ndarray] = field(default_factory=dict)  # the masked inputs received
    graph: dict[int, list[int]] = field(default_factory=dict)  # who masks with whom

    @property
    def failed(self) -> bool:
        return self.total is None


def secure_sum(inputs: dict[int, np.ndarray], bits: int, threshold: int, seed: int,
               round: int, drops: Drops | None = None, k: int | None = None,
               tamper: Iterable[tuple[int, int]] = (),
               wrong_keys: Iterable[tuple[int, int]] = ()) -> SecAggResult:
    """One round of SecAgg (``k`` None) or SecAgg+ (degree ``k``) over ``inputs`` — {client:
    uint64 vector of m words < 2^bits} — with Shamir threshold ``threshold``. Tests of the
    failure path: ``tamper``, (sender, receiver) share ciphertexts corrupted in transit;
    ``wrong_keys``, (receiver, sender) pairs where the server forwards the receiver another
    encryption key in place of the sender's. (Substituting a *mask* key would need the
    active-adversary variant's signatures to detect; this semi-honest protocol has none.)"""
    if not 1 <= threshold:
        raise ValueError(f"threshold: at least 1, got {threshold}")
    if not 2 <= bits <= 62:
        raise ValueError(f"bits: 2..62 (sums and their sign fix stay in int64), got {bits}")
    drops = drops or Drops()
    ids = sorted(inputs)
    m = len(next(iter(inputs.values()))) if inputs else 0
    p = _Round(ids, bits, threshold, seed, round, m, neighbours(ids, k, seed, round),
               set(wrong_keys))
    p.advertise()
    u1 = [u for u in ids if u not in drops.before_share]
    if len(u1) < threshold:
        return p.fail(f"{len(u1)} clients shared keys, the threshold is {threshold}", [])
    p.share_keys(u1, set(tamper))
    u2 = [u for u in u1 if u not in drops.before_masked]
    if len(u2) < threshold:
        return p.fail(f"{len(u2)} clients sent masked inputs, the threshold is {threshold}",
                      [])
    p.mask(inputs, u1, u2)
    u3 = [u for u in u2 if u not in drops.before_unmask]
    if len(u3) < threshold:
        return p.fail(f"{len(u3)} clients answered the unmasking, the threshold is "
                      f"{threshold}", u2)
    return p.unmask(u1, u2, u3)


class _Round:
    """One round of the protocol as the simulator plays it: every client's keys (from
    ``rng(seed, round, client, ...)``), the neighbour graph, the bytes each client sends and
    receives per phase, the sealed share pairs and the masked inputs — one method per
    phase of :func:`secure_sum`, each given the clients still in it."""

    def __init__(self, ids: list[int], bits: int, threshold: int, seed: int, round: int,
                 m: int, graph: dict[int, list[int]], wrong: set[tuple[int, int]]):
        self.bits, self.threshold, self.seed, self.round, self.m = bits, threshold, seed, round, m
        self.graph, self.wrong = graph, wrong
        self.mod = np.uint64((1 << bits) - 1)
        self.up = {p: dict.fromkeys(ids, 0) for p in PHASES}
        self.down = {p: dict.fromkeys(ids, 0) for p in PHASES}
        self.c_key = {u: _x25519(seed, round, u, "secagg-c") for u in ids}
        self.s_key = {u: _x25519(seed, round, u, "secagg-s") for u in ids}
        self.pub_c = {u: _raw(self.c_key[u].public_key()) for u in ids}
        self.pub_s = {u: _raw(self.s_key[u].public_key()) for u in ids}
        self.b_seed: dict[int, bytes] = {}
        self.sealed: dict[tuple[int, int], bytes] = {}
        self.masked: dict[int, np.ndarray] = {}

    def fail(self, reason: str, included: list[int]) -> SecAggResult:
        return SecAggResult(None, included, reason, self.up, self.down, self.masked,
                            self.graph)

    def wrap(self, v: np.ndarray) -> np.ndarray:
        return v & self.mod

    def seen_c(self, receiver: int, sender: int) -> bytes:
        """The encryption key of ``sender`` as the server forwarded it to ``receiver``."""
        if (receiver, sender) in self.wrong:
            return _raw(_x25519(self.seed, self.round, sender,
                                "secagg-substituted").public_key())
        return self.pub_c[sender]

    def advertise(self) -> None:
        """0. Each client sends its two public keys; the server sends each its
        neighbours' (id and two keys each)."""
        for u, vs in self.graph.items():
            self.up["advertise"][u] = 2 * KEY_BYTES
            self.down["advertise"][u] = len(vs) * (ID_BYTES + 2 * KEY_BYTES)

    def share_keys(self, u1: list[int], tamper: set[tuple[int, int]]) -> None:
        """1. Each u in ``u1`` Shamir-shares its mask key s_u and a fresh mask seed b_u
        among its neighbours still in ``u1``, each share pair sealed for its holder."""
        seed, round = self.seed, self.round
        for u in u1:
            self.b_seed[u] = rng(seed, round, u, "secagg-b").bytes(32)
        for u in u1:
            holders = [v for v in self.graph[u] if v in u1]
            gen = rng(seed, round, u, "secagg-shamir")
            s_sh = shamir_share(int.from_bytes(_raw(self.s_key[u]), "little"), holders,
                                self.threshold, gen)
            b_sh = shamir_share(int.from_bytes(self.b_seed[u], "little"), holders,
                                self.threshold, gen)
            for v in holders:
                key = _agree(self.c_key[u], self.seen_c(u, v), b"secagg-enc")
                body = (u.to_bytes(ID_BYTES, "little") + v.to_bytes(ID_BYTES, "little")
                        + s_sh[v].to_bytes(ELEMENT_BYTES, "little")
                        + b_sh[v].to_bytes(ELEMENT_BYTES, "little"))
                msg = _seal(key, f"{seed}:{round}:{u}:{v}".encode(), body)
                if (u, v) in tamper:
                    msg = msg[:-1] + bytes([msg[-1] ^ 1])
                self.sealed[(u, v)] = msg
                self.up["share"][u] += len(msg)
                self.down["share"][v] += len(msg)

    def mask(self, inputs: dict[int, np.ndarray], u1: list[int], u2: list[int]) -> None:
        """2. Each u in ``u2`` sends y_u = x_u + PRG(b_u) ± PRG(s_uv) for every neighbour v
        that shared keys (+ for v > u, − for v < u), mod 2^bits."""
        m, bits = self.m, self.bits
        for u in u2:
            y = self.wrap(np.asarray(inputs[u], np.uint64) + prg(self.b_seed[u], m, bits))
            for v in self.graph[u]:
                if v not in u1:
                    continue
                p = prg(_agree(self.s_key[u], self.pub_s[v], b"secagg-mask"), m, bits)
                y = self.wrap(y + p) if u < v else self.wrap(y - p)
            self.masked[u] = y
            self.up["masked_input"][u] = (bits * m + 7) // 8

    def unmask(self, u1: list[int], u2: list[int], u3: list[int]) -> SecAggResult:
        """3. The survivors ``u3`` open their neighbours' shares (b_v of a sender, s_v of a
        client that dropped after sharing); the server sums the masked inputs and removes
        the masks it can reconstruct from ``threshold`` shares each — or fails."""
        opened = self.open_shares(u1, u2, u3)
        m, bits, t = self.m, self.bits, self.threshold
        total = np.zeros(m, np.uint64)
        for u in u2:
            total = self.wrap(total + self.masked[u])
        for v in u2:
            shares = opened.get(("b", v), {})
            if len(shares) < t:
                return self.fail(f"client {v}'s mask seed has {len(shares)} shares, the "
                                 f"threshold is {t}", u2)
            seed_v = shamir_reconstruct(dict(list(shares.items())[:t]))
            total = self.wrap(total - prg(seed_v.to_bytes(32, "little"), m, bits))
        for v in (v for v in u1 if v not in u2):
            shares = opened.get(("s", v), {})
            if len(shares) < t:
                return self.fail(f"dropped client {v}'s key has {len(shares)} shares, the "
                                 f"threshold is {t}", u2)
            key = self.reconstructed_key(v, shares)
            for u in self.graph[v]:
                if u in u2:  # u added +p if u < v, else -p: undo it
                    p = prg(_agree(key, self.pub_s[u], b"secagg-mask"), m, bits)
                    total = self.wrap(total - p) if u < v else self.wrap(total + p)
        return SecAggResult(total, u2, None, self.up, self.down, self.masked, self.graph)

    def open_shares(self, u1: list[int], u2: list[int], u3: list[int]
                    ) -> dict[tuple[str, int], dict[int, int]]:
        """Each survivor's opened shares, {("b" | "s", v): {holder: share}}; a ciphertext
        that does not authenticate, or names other clients, stops the round."""
        opened: dict[tuple[str, int], dict[int, int]] = {}
        for u in u3:
            # the server tells u which of its neighbours sent a masked input and which dropped
            self.down["unmask"][u] = ID_BYTES * sum(v in u1 for v in self.graph[u])
            for v in self.graph[u]:
                if v not in u1 or (v, u) not in self.sealed:
                    continue
                body = _open(_agree(self.c_key[u], self.seen_c(u, v), b"secagg-enc"),
                             self.sealed[(v, u)])
                if int.from_bytes(body[:ID_BYTES], "little") != v or \
                        int.from_bytes(body[ID_BYTES:2 * ID_BYTES], "little") != u:
                    raise SecAggError(f"share from {v} to {u} names other clients")
                at = 2 * ID_BYTES
                s_share = int.from_bytes(body[at:at + ELEMENT_BYTES], "little")
                b_share = int.from_bytes(body[at + ELEMENT_BYTES:], "little")
                which = ("b", v) if v in u2 else ("s", v)
                opened.setdefault(which, {})[u] = b_share if which[0] == "b" else s_share
                self.up["unmask"][u] += ID_BYTES + ELEMENT_BYTES
        return opened

    def reconstructed_key(self, v: int, shares: dict[int, int]):
        """Dropped client ``v``'s mask key from ``threshold`` shares, checked against the
        public key it advertised."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        secret = shamir_reconstruct(dict(list(shares.items())[:self.threshold]))
        key = X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "little"))
        if _raw(key.public_key()) != self.pub_s[v]:
            raise SecAggError(f"dropped client {v}'s reconstructed key does not match its "
                              f"advertised one")
        return key


# ----------------------------------------------------------------------------- integers


def required_bits(clip: float, scale: float, n: int) -> int:
    """The smallest ``bits`` whose signed range holds the sum of n quantized updates: each
    coordinate lies in [−⌈clip · scale⌉, ⌈clip · scale⌉] after clipping to [−clip, clip],
    scaling and (stochastic) rounding, so the sum's magnitude is at most n⌈clip · scale⌉
    and must stay below 2^(bits − 1)."""
    peak = n * int(np.ceil(clip * scale))
    return max(2, int(peak).bit_length() + 1)


def quantize(x: np.ndarray, clip: float, scale: float, bits: int, gen: np.random.Generator
             ) -> np.ndarray:
    """A float update as words of Z_{2^bits}: every coordinate clipped to [−clip, clip],
    multiplied by ``scale``, rounded stochastically (unbiased: ⌊v⌋ + 1 with probability
    v − ⌊v⌋, from ``gen``) and stored in two's complement mod 2^bits."""
    v = np.clip(np.asarray(x, np.float64), -clip, clip) * scale
    low = np.floor(v)
    q = (low + (gen.random(v.shape) < (v - low))).astype(np.int64)
    words = q.astype(np.uint64)
    return words & np.uint64((1 << bits) - 1) if bits < 64 else words


def dequantize(total: np.ndarray, scale: float, bits: int) -> np.ndarray:
    """The float sum from a sum of quantized updates mod 2^bits (read as signed)."""
    t = np.asarray(total, np.uint64).astype(np.int64)  # bits = 64: two's complement already
    if bits < 64:
        t = np.where(t >= (1 << (bits - 1)), t - (1 << bits), t)
    return t.astype(np.float64) / scale
