"""Malicious clients as a role (issue #30): the ``adversary`` config section and
:class:`Adversary`, the one object the runtime asks who is malicious and what they do.

Who: exactly ⌊fraction · N⌋ of the N clients, drawn once without replacement from
``(seed, "adversary")`` — a pure function of the seed and the population, so the same
clients are malicious on every executor count and after ``--resume`` — or the ids listed in
``adversary.clients`` (inline, or a text file of one id per line, ``#`` comments allowed,
read once when the config is loaded: the run's ``config.yaml`` stores the ids).
Every client row of ``clients.parquet`` carries ``malicious`` (1 or 0).

What (each rule a free function of :mod:`fedray.methods.robust.attacks`):

- data poisoning, where the executor builds a malicious client's context: ``label_flip``
  (every training label through ``adversary.permutation``, default c → C − 1 − c) and
  ``backdoor`` (a ``trigger_size``² pixel trigger on ``poison_fraction`` of the client's
  training samples, relabelled ``target``; with ``boost`` ≠ 1 the update is scaled by it —
  Bagdasaryan et al.'s model replacement uses boost = n / η). The run's global evaluation
  then reports ``attack_success_rate``: the share of triggered test samples whose label is
  not the target that the global model classifies as the target;
- model poisoning of one client, on its executor between its local update and the update
  transform chain (the attacker acts before encoding, so the bytes counted are the bytes
  such an upload really takes): ``sign_flip``, ``scale`` (by ``adversary.scale``) and
  ``gaussian`` (N(0, σ²) per coordinate from ``(seed, round, client)``);
- colluding model poisoning, on the driver before aggregation: ``alie``, ``ipm``,
  ``min_max``, ``min_sum``. The attackers are omniscient: they see every benign update the
  server accepted this round (decoded, in client-id order, as float64 rows over the
  upload's floating tensors in name order) and each accepted malicious client's update is
  replaced by the one crafted vector. ALIE's n and m are the round's accepted updates and
  accepted malicious ones. A round with no benign update accepted leaves the attackers'
  honest updates as they are (``adversary/colluded`` 0). The bytes on the ledger are those
  of the attacker's own upload (the crafted update has its shape and dtypes).

Model poisoning needs the ``attack`` capability (an upload that is an update Δ with the
broadcast's shapes: the FedAvg family, ORDERS, FedBuff, FedAsync); colluding attacks also
need a synchronous round and every upload on the driver (``runtime.reduce=driver``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core import registry
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, spec
from fedray.methods.robust import attacks

State = dict[str, np.ndarray]
Upload = tuple[int, int, State]

DATA = ("label_flip", "backdoor")
SOLO = ("sign_flip", "scale", "gaussian")
COLLUDING = ("alie", "ipm", "min_max", "min_sum")


@dataclass
class AdversaryConfig:
    """Malicious clients and their attack (:mod:`fedray.methods.robust.adversary`)."""

    attack: Literal["none", "sign_flip", "scale", "gaussian", "alie", "ipm", "min_max",
                    "min_sum", "label_flip", "backdoor"] = spec(
        "none", help="what malicious clients do: none (honest, still recorded as malicious); "
                     "model poisoning: sign_flip, scale, gaussian, alie (Baruch et al. 2019), "
                     "ipm (Xie et al. 2020), min_max / min_sum (Shejwalkar & Houmansadr 2021); "
                     "data poisoning: label_flip, backdoor (Bagdasaryan et al. 2020)")
    fraction: float = spec(0.0, ge=0, lt=1, help="share of all clients that are malicious: "
                                                 "floor(fraction * num_clients), drawn once "
                                                 "from the seed")
    clients: list[int] | str | None = spec(
        None, help="the malicious client ids, or a text file of one id per line (instead of "
                   "fraction)")
    scale: float = spec(10.0, help="scale: λ, the factor on the malicious update")
    sigma: float = spec(1.0, gt=0, help="gaussian: σ of the noise a malicious client uploads")
    eps: float = spec(0.5, gt=0, help="ipm: ε, the malicious update is -ε times the benign "
                                      "mean")
    z: float | None = spec(None, help="alie: z, overriding Baruch et al.'s z_max(n, m)")
    direction: Literal["unit", "std", "sign"] = spec(
        "unit", help="min_max / min_sum: the perturbation p (unit: -μ/|μ|, std: -σ, "
                     "sign: -sign μ)")
    permutation: list[int] | None = spec(
        None, help="label_flip: the new label of each class (default c -> C - 1 - c)")
    target: int = spec(0, ge=0, help="backdoor: the label triggered samples get")
    poison_fraction: float = spec(0.5, gt=0, le=1, help="backdoor: share of a malicious "
                                                        "client's samples triggered")
    trigger_size: int = spec(3, ge=1, help="backdoor: side of the square trigger, in pixels")
    trigger_value: float | None = spec(
        None, help="backdoor: the trigger's pixel value (default: the largest input value of "
                   "the dataset's test split, a white pixel after normalization)")
    boost: float = spec(1.0, gt=0, help="backdoor: model replacement, the malicious update "
                                        "scaled by this (Bagdasaryan et al.: n / η)")

    @property
    def active(self) -> bool:
        return self.fraction > 0 or self.clients is not None

    def validate(self, cfg: Any) -> None:
        """Who is malicious, and whether this run's method, runtime and data allow the
        attack; the data-shape checks wait for the data when the dataset's shape is read at
        run time (:meth:`check_data`)."""
        if self.fraction > 0 and self.clients is not None:
            raise ConfigError("adversary.clients", self.clients,
                              "unset when adversary.fraction is set (one or the other)")
        if self.attack != "none" and not self.active:
            raise ConfigError("adversary.fraction", self.fraction,
                              f"> 0, or adversary.clients set, with adversary.attack="
                              f"{self.attack}")
        if not self.active:
            return
        n = cfg.clients.num_clients
        if self.fraction > 0 and share_count(self.fraction, n) == 0:
            raise ConfigError("adversary.fraction", self.fraction,
                              f"at least 1 / num_clients = {1 / n:g} (floor(fraction * {n}) "
                              f"clients are malicious)")
        ids = malicious_ids(self, n)
        if isinstance(self.clients, str):  # the run records the ids, not a file that may change
            self.clients = ids.tolist()
        if self.attack == "none":
            return
        method = registry.method_of(cfg)
        registry.require(method, "attack", "adversary.attack", self.attack)
        if self.attack in COLLUDING:
            if "asynchronous" in method.capabilities:
                raise ConfigError("adversary.attack", self.attack,
                                  f"one of none, {', '.join(SOLO + DATA)} for {method.name}: "
                                  f"a colluding attack needs a synchronous round's updates")
            if cfg.runtime.reduce == "executors":
                raise ConfigError("runtime.reduce", "executors",
                                  f"driver with adversary.attack={self.attack} (a colluding "
                                  f"attack sees every benign upload, not partial sums)")
        if self.attack in DATA:
            entry = registry.dataset(cfg.data.dataset)
            if entry.shape is not None:
                self.check_shape(*entry.shape(cfg.data))

    def check_data(self, cfg: Any, data: Any) -> None:
        """The data-poisoning checks on the built data (shape and classes)."""
        if self.active and self.attack in DATA:
            self.check_shape(tuple(data.input_shape), int(data.num_classes))

    def check_shape(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        if num_classes < 2:
            raise ConfigError("adversary.attack", self.attack,
                              "data poisoning of a classification dataset (labels 0..C-1)")
        if self.attack == "label_flip" and self.permutation is not None and \
                sorted(self.permutation) != list(range(num_classes)):
            raise ConfigError("adversary.permutation", self.permutation,
                              f"a permutation of 0..{num_classes - 1} (the dataset's classes)")
        if self.attack == "backdoor":
            if self.target >= num_classes:
                raise ConfigError("adversary.target", self.target,
                                  f"a class in 0..{num_classes - 1}")
            if len(input_shape) != 3 or self.trigger_size > min(input_shape[1:]):
                raise ConfigError("adversary.trigger_size", self.trigger_size,
                                  f"a square trigger inside images (C, H, W); the inputs are "
                                  f"{tuple(input_shape)}")


def share_count(fraction: float, n: int) -> int:
    """⌊fraction · n⌋ as the decimal fraction means it (0.29 · 100 is 29, not the 28 that
    float rounding of 28.999999999999996 would give)."""
    return math.floor(fraction * n + 1e-9)


def malicious_ids(cfg: AdversaryConfig, num_clients: int, seed: int = 0) -> np.ndarray:
    """The sorted malicious client ids (``seed`` matters only for ``fraction``)."""
    if cfg.clients is None:
        k = share_count(cfg.fraction, num_clients)
        return np.sort(rng(seed, purpose="adversary").choice(num_clients, k, replace=False)
                       ).astype(np.int64)
    ids = _read_ids(cfg.clients) if isinstance(cfg.clients, str) else list(cfg.clients)
    if not ids:
        raise ConfigError("adversary.clients", cfg.clients, "at least one client id")
    for i in ids:
        if not 0 <= i < num_clients:
            raise ConfigError("adversary.clients", i, f"client ids in 0..{num_clients - 1}")
    return np.unique(np.asarray(ids, np.int64))


MAX_IDS_FILE = 64 << 20


def _read_ids(path: str) -> list[int]:
    """Client ids from a text file (one per line; blank lines and ``#`` comments skipped).
    A line that is not an id is named by its number only: the file's content is never
    echoed (a path to a file that is not an id list shows nothing of it)."""
    rule = "a list of client ids or a UTF-8 text file of one id per line"
    if not os.path.isfile(path):
        raise ConfigError("adversary.clients", path, rule)
    if os.path.getsize(path) > MAX_IDS_FILE:
        raise ConfigError("adversary.clients", path, f"{rule}, at most {MAX_IDS_FILE >> 20} MiB")
    ids = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            if not text.isascii() or not text.isdigit() or len(text) > 18:
                raise ConfigError("adversary.clients", path,
                                  f"{rule}: line {n} is not a non-negative integer of at most "
                                  f"18 digits")
            ids.append(int(text))
    return ids


class Adversary:
    """The run's malicious clients and their attack (built the same on every executor and
    on the driver from the config alone)."""

    def __init__(self, cfg: AdversaryConfig, seed: int, num_clients: int,
                 num_classes: int = 0, trigger_value: float | None = None):
        self.cfg, self.seed, self.num_classes = cfg, seed, num_classes
        self.trigger_value = cfg.trigger_value if cfg.trigger_value is not None \
            else trigger_value
        self.ids = malicious_ids(cfg, num_clients, seed)
        self._triggered: tuple[np.ndarray, np.ndarray] | None = None

    def is_malicious(self, cid: int) -> bool:
        i = int(np.searchsorted(self.ids, cid))
        return i < len(self.ids) and int(self.ids[i]) == cid

    def poison_data(self, cid: int, round: int, x: np.ndarray, y: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """A client's training samples as it trains on them."""
        c = self.cfg
        if c.attack not in DATA or not self.is_malicious(cid):
            return x, y
        if c.attack == "label_flip":
            return x, attacks.flip_labels(np.asarray(y), self.num_classes, c.permutation)
        return attacks.backdoor(np.asarray(x), np.asarray(y), c.target, c.poison_fraction,
                                rng(self.seed, round, cid, "adversary/backdoor"),
                                c.trigger_size, self.trigger_value)

    def poison_upload(self, cid: int, round: int, upload: State) -> State:
        """A client's upload before the transform chain: the solo model-poisoning rules and
        the backdoor's boost, on every floating tensor (others pass unchanged)."""
        c = self.cfg
        solo = c.attack in SOLO or (c.attack == "backdoor" and c.boost != 1.0)
        if not solo or not self.is_malicious(cid):
            return upload
        gen = rng(self.seed, round, cid, "adversary/gaussian") if c.attack == "gaussian" \
            else None
        out = {}
        for k in sorted(upload):
            v = np.asarray(upload[k])
            if not np.issubdtype(v.dtype, np.floating):
                out[k] = v
                continue
            if c.attack == "sign_flip":
                new = attacks.sign_flip(v)
            elif c.attack == "scale":
                new = attacks.scale(v, c.scale)
            elif c.attack == "gaussian":
                new = attacks.gaussian(v.shape, c.sigma, gen)
            else:
                new = attacks.scale(v, c.boost)
            out[k] = np.asarray(new, v.dtype)
        return {k: out[k] for k in upload}  # drawn in name order, kept in the upload's

    def collude(self, accepted: list[Upload]) -> tuple[list[Upload], dict[str, float]]:
        """The round's accepted uploads with each malicious one replaced by the colluding
        rule's crafted update; (uploads, metrics)."""
        bad = [i for i, (cid, _, _) in enumerate(accepted) if self.is_malicious(cid)]
        metrics = {"adversary/malicious_accepted": float(len(bad))}
        if self.cfg.attack not in COLLUDING or not bad:
            return accepted, metrics
        skip = set(bad)
        good = [u for i, (_, _, u) in enumerate(accepted) if i not in skip]
        if not good:
            return accepted, metrics | {"adversary/colluded": 0.0}
        names = sorted(k for k, v in good[0].items()
                       if np.issubdtype(np.asarray(v).dtype, np.floating))
        benign = np.stack([np.concatenate([np.asarray(u[k], np.float64).ravel() for k in names])
                           for u in good])
        crafted = self._craft(benign, len(accepted), len(bad))
        out = list(accepted)
        for i in bad:
            cid, n, own = accepted[i]
            new, at = dict(own), 0
            for k in names:
                v = np.asarray(own[k])
                new[k] = crafted[at:at + v.size].reshape(v.shape).astype(v.dtype)
                at += v.size
            out[i] = (cid, n, new)
        return out, metrics | {"adversary/colluded": float(len(bad))}

    def _craft(self, benign: np.ndarray, n: int, m: int) -> np.ndarray:
        c = self.cfg
        if c.attack == "alie":
            return attacks.alie(benign, n, m, c.z)
        if c.attack == "ipm":
            return attacks.ipm(benign, c.eps)
        if c.attack == "min_max":
            return attacks.min_max(benign, c.direction)
        return attacks.min_sum(benign, c.direction)

    def triggered_test(self, x: np.ndarray, y: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """The backdoor's test set: every test sample whose label is not the target,
        triggered and labelled the target (accuracy on it = the attack success rate);
        None for other attacks."""
        if self.cfg.attack != "backdoor":
            return None
        if self._triggered is None:
            keep = np.asarray(y) != self.cfg.target
            xs = attacks.add_trigger(np.asarray(x)[keep], self.cfg.trigger_size,
                                     self.trigger_value)
            self._triggered = xs, np.full(len(xs), self.cfg.target, np.asarray(y).dtype)
        return self._triggered


def detection(malicious: np.ndarray, kept: np.ndarray) -> dict[str, float | None]:
    """Detection of the malicious client-rounds by a robust rule: *detected* = excluded
    (``robust_kept`` = 0); precision = detected malicious / detected, recall = detected
    malicious / malicious (None where the denominator is 0)."""
    flagged, bad = np.asarray(kept) == 0, np.asarray(malicious).astype(bool)
    hits = int((flagged & bad).sum())
    return {"precision": hits / int(flagged.sum()) if flagged.any() else None,
            "recall": hits / int(bad.sum()) if bad.any() else None}


def attack_summary(cfg: AdversaryConfig, num_clients: int, seed: int, malicious: np.ndarray,
                   judged: tuple[np.ndarray, np.ndarray] | None, asr: float | None
                   ) -> dict[str, Any]:
    """What a run's ``summary.json`` says of its adversary: how many clients lie, how many
    sampled client-rounds were theirs (``malicious``: the flag of every sampled client-round
    of ``clients.parquet``), and, under a robust rule, over the client-rounds it weighed
    (``judged``: their malicious flags and ``robust_kept``; the rounds it skipped left
    out), the :func:`detection` precision and recall. Rules that down-weight rather than
    exclude (trimmed mean, norm bounding, centered clipping, FLTrust's trust scores) show in
    the mean weight of the malicious and of the benign client-rounds."""
    out: dict[str, Any] = {"attack": cfg.attack,
                           "malicious_clients": len(malicious_ids(cfg, num_clients, seed)),
                           "malicious_client_rounds": int(np.asarray(malicious).sum())}
    if judged is not None:
        flags, kept = judged
        bad = np.asarray(flags).astype(bool)
        out |= {f"detection_{k}": v for k, v in detection(bad, kept).items()}
        out["mean_kept_malicious"] = float(kept[bad].mean()) if bad.any() else None
        out["mean_kept_benign"] = float(kept[~bad].mean()) if (~bad).any() else None
    if asr is not None:
        out["final_attack_success_rate"] = asr
    return out


def adversary_of(cfg: Any, data: Any = None) -> Adversary | None:
    """The run's adversary (None: every client honest and nothing recorded). ``data`` (the
    executors') gives ``label_flip`` its class count and the backdoor its trigger value;
    the driver, which only colludes, passes none."""
    section = getattr(cfg, "adversary", None)
    if section is None or not section.active:
        return None
    if data is None:
        return Adversary(section, cfg.seed, cfg.clients.num_clients)
    value = float(np.max(data.x_test)) if section.attack == "backdoor" and \
        section.trigger_value is None else None
    return Adversary(section, cfg.seed, cfg.clients.num_clients, int(data.num_classes), value)


registry.register_section("adversary", AdversaryConfig)
