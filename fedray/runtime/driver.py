"""Driver: the round loop of one experiment, run as a Ray actor.

Per round: sample clients from (seed, round); ``ray.put`` each tier's broadcast once; hand
the sampled clients to their tier's executors in batches; gather results as they finish;
re-run clients whose update raised (up to ``runtime.max_client_retries``); reject uploads
with NaN/Inf; stop the run when fewer than ``runtime.min_accepted`` uploads were accepted;
give the accepted uploads to the policy in client-id order; evaluate; log Parquet metrics
(every per-client quantity reduced in client-id order, so the metrics are bitwise the same
whatever the executor count or finish order); checkpoint. It knows no model code and no method.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from fedray.methods.base import ClientResult, EvalResult, Status
from fedray.metrics import MetricsWriter
from fedray.payload import Payload
from fedray.registry import make_method
from fedray.runtime.pool import DeadJob, ExecutorPool
from fedray.seeding import rng
from fedray.state_store import ClientStateStore
from fedray.storage import Storage

KEEP_CHECKPOINTS = 2


def sample_clients(seed: int, round: int, num_clients: int, k: int) -> list[int]:
    """The clients of ``round``: a uniform draw without replacement, from (seed, round)."""
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(int(c) for c in rng(seed, round, -1, "sample").choice(num_clients, k,
                                                                         replace=False))


class RoundFailedError(RuntimeError):
    """A round had fewer accepted uploads than ``runtime.min_accepted``: the global model was
    not updated and the run stops (its metrics up to and including this round are logged;
    ``--resume`` re-runs the round)."""

    def __init__(self, round: int, accepted: int, needed: int,
                 failures: list[tuple[int, str, str | None]]):
        self.round, self.accepted, self.needed, self.failures = round, accepted, needed, failures
        shown = "; ".join(f"client {c} {status}: {err}" for c, status, err in failures[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"round {round}: {accepted} accepted uploads, runtime.min_accepted "
                         f"is {needed}; {shown}{more}")

    def __reduce__(self):  # survives pickling (raised inside the driver actor)
        return RoundFailedError, (self.round, self.accepted, self.needed, self.failures)


def _finite(tensors: dict[str, np.ndarray]) -> bool:
    """Every float tensor of a decoded upload is free of NaN and Inf. Checked after decoding
    (codec and transform chain), where a NaN can no longer hide in integer codes."""
    return all(np.isfinite(v).all() for v in tensors.values()
               if np.asarray(v).dtype.kind == "f")


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@dataclass
class Evaluation:
    """One round's scores: per client (its local test split) and per tier (global test)."""

    clients: dict[int, EvalResult] = field(default_factory=dict)
    tiers: dict[str, EvalResult] = field(default_factory=dict)


@dataclass
class RoundRecord:
    """What one round produced, as the metrics tables log it."""

    round: int
    sampled: list[int]
    final: dict[int, ClientResult]
    attempts: dict[int, int]
    download: dict[int, int]  # bytes each sampled client downloaded (all attempts, base)
    evaluation: Evaluation
    policy_metrics: dict[str, Any]
    restarts: int
    seconds: float


class Driver:
    def __init__(self, cfg: Any, algorithm_cls: type, pool: ExecutorPool, run_uri: str):
        self.cfg = cfg
        self.pool = pool
        self.run_uri = run_uri
        self.storage = Storage(run_uri)
        self.metrics = MetricsWriter(self.storage)
        self.algorithm = make_method(algorithm_cls, cfg)
        self.policy = self.algorithm.make_policy()
        self.chain = self.algorithm.update_chain()  # uploads are decoded before the policy
        self.round = 0
        self.global_state: dict[str, np.ndarray] = {}
        self.versions: dict[int, int] = {}
        self.kept_versions: dict[int, int] = {}  # the manifest of the previous checkpoint
        self.totals = {"upload_bytes": 0, "download_bytes": 0, "failures": 0, "rejected": 0}
        self.base_bytes = self.algorithm.base_bytes()
        self.has_base: set[int] = set()
        self.num_clients = cfg.clients.num_clients
        self.tier_of = [cfg.tier_of(c) for c in range(self.num_clients)]

    # ------------------------------------------------------------------ setup / resume

    def setup(self, resume: bool = False) -> dict:
        """Wait for the executors, then load the latest checkpoint or initialise the model."""
        self.pool.wait_placed()
        ck = self.storage.read_checkpoint() if resume else None
        if ck is not None:
            self.round, self.global_state = ck["round"], ck["global_state"]
            self.versions, self.totals = ck["versions"], ck["totals"]
            self.kept_versions = dict(self.versions)
            self.has_base = set(ck["has_base"])
            self.policy.load_state_dict(ck["policy_state"])
            self.pool.restarts = ck["restarts"]
        else:
            first = self.pool.executors[self.cfg.runtime.tiers[0].name][0]
            self.global_state = ray.get(first.init_global_state.remote(self.cfg.seed)).decode()
            self.global_state = {k: np.array(v) for k, v in self.global_state.items()}
        if resume:  # rounds logged after the checkpoint were not committed: re-run them
            self.metrics.truncate_after(self.round)
        return {"round": self.round, "executors": self.pool.info,
                "parameters": int(sum(v.size for v in self.global_state.values()))}

    # ------------------------------------------------------------------ one round

    def _jobs(self, method: str, clients: list[int], bcast: dict[str, tuple], round: int,
              item=lambda c: c, alone: set[int] = frozenset()) -> list[tuple[str, str, tuple]]:
        """Pool jobs running ``method`` over ``clients``: grouped by tier, in batches; the
        clients in ``alone`` (whose batch killed its executor) one per job."""
        by_tier: dict[str, list[int]] = {}
        for c in clients:
            by_tier.setdefault(self.tier_of[c], []).append(c)
        jobs = []
        for tier, cids in by_tier.items():
            key, ref, _ = bcast[tier]
            batched = [c for c in cids if c not in alone]
            parts = chunks(batched, self._chunk_size(len(batched), tier)) if batched else []
            for part in parts + [[c] for c in cids if c in alone]:
                jobs.append((tier, method, (key, ref, round, [item(c) for c in part])))
        return jobs

    def _chunk_size(self, n: int, tier: str) -> int:
        if self.cfg.runtime.chunk_size:
            return self.cfg.runtime.chunk_size
        execs = len(self.pool.executors[tier])
        return max(1, math.ceil(n / (2 * execs)))

    def _broadcasts(self, round: int, tiers: set[str], kind: str) -> dict[str, tuple]:
        """One encoded broadcast per tier, each ``ray.put`` once."""
        out, seen = {}, {}
        for tier in sorted(tiers):
            tensors = self.policy.broadcast(self.global_state, round, tier)
            if id(tensors) not in seen:
                payload = Payload.encode(tensors, self.cfg.payload.download)
                seen[id(tensors)] = (f"{round}:{kind}:{tier}", ray.put(payload), payload.nbytes)
            out[tier] = seen[id(tensors)]
        return out

    def run_round(self) -> dict:
        """Run the next round and return its metrics row."""
        t0 = time.perf_counter()
        r = self.round + 1
        cfg = self.cfg
        sampled = sample_clients(cfg.seed, r, self.num_clients, cfg.clients.sampled_count())
        bcast = self._broadcasts(r, {self.tier_of[c] for c in sampled}, "train")
        attempts = dict.fromkeys(sampled, 0)
        final: dict[int, ClientResult] = {}
        todo = list(sampled)
        restarts_before = self.pool.restarts
        alone: set[int] = set()  # clients of a batch whose executor died: isolated
        while todo:
            for c in todo:
                attempts[c] += 1
            jobs = self._jobs("run_clients", todo, bcast, r,
                              item=lambda c: (c, self.versions.get(c)), alone=alone)
            todo = []
            for batch in self.pool.run(jobs, requeue_dead=False):
                if isinstance(batch, DeadJob):  # counts as a failed attempt of each client
                    cids = [c for c, _ in batch.args[3]]
                    alone.update(cids)
                    batch = [ClientResult(c, r, Status.ERROR, executor=batch.executor,
                                          error=f"its executor {batch.reason} while running "
                                                f"it (with {len(cids)} client(s) in the "
                                                f"batch)")
                             for c in cids]
                for res in batch:
                    if res.status is Status.ERROR and attempts[res.client_id] <= \
                            cfg.runtime.max_client_retries:
                        todo.append(res.client_id)
                    else:
                        final[res.client_id] = res
        accepted = []
        shapes = {k: v.shape for k, v in self.global_state.items()}
        for cid in sorted(final):
            res = final[cid]
            upload = self.chain.server(res.payload.decode(), shapes) if res.ok else None
            if res.ok and not _finite(upload):  # decoded: codes (bf16 bits, int8) hide none
                res.status, res.error = Status.REJECTED, "upload contains NaN or Inf"
            if res.ok:
                accepted.append((cid, res.num_samples, upload))
                if res.state_version is not None:
                    self.versions[cid] = res.state_version
        download = self._charge(sampled, final, attempts, bcast)
        restarts = self.pool.restarts - restarts_before
        if len(accepted) < cfg.runtime.min_accepted:
            self._log(RoundRecord(r, sampled, final, attempts, download, Evaluation(), {},
                                  restarts, time.perf_counter() - t0))
            raise RoundFailedError(r, len(accepted), cfg.runtime.min_accepted,
                                   [(c, str(final[c].status), final[c].error) for c in sampled
                                    if not final[c].ok])
        if accepted:
            self.global_state, policy_metrics = self.policy.aggregate(
                self.global_state, accepted, r)
        else:
            policy_metrics = {}
        self.round = r
        evaluation = self._evaluate(r, sampled)
        row = self._log(RoundRecord(r, sampled, final, attempts, download, evaluation,
                                    policy_metrics, restarts, time.perf_counter() - t0))
        if r % cfg.runtime.checkpoint_every == 0 or r == cfg.rounds:
            self.checkpoint()
        return row

    def _charge(self, sampled: list[int], final: dict[int, ClientResult],
                attempts: dict[int, int], bcast: dict[str, tuple]) -> dict[int, int]:
        """The byte ledger of one round: each sampled client's download (its tier's broadcast
        once per attempt, plus the pretrained base at its first round) and upload, added to
        the run's totals; failures and rejections are counted too."""
        download = {}
        for c in sampled:
            d = bcast[self.tier_of[c]][2] * attempts[c]
            if self.base_bytes and c not in self.has_base:
                d += self.base_bytes
                self.has_base.add(c)
            download[c] = d
            self.totals["download_bytes"] += d
            self.totals["upload_bytes"] += final[c].upload_bytes
            self.totals["failures"] += final[c].status is Status.ERROR
            self.totals["rejected"] += final[c].status is Status.REJECTED
        return download

    # ------------------------------------------------------------------ evaluation

    def _evaluate(self, r: int, sampled: list[int]) -> Evaluation:
        ev = self.cfg.eval
        due = (ev.every and r % ev.every == 0) or r == self.cfg.rounds
        if not due:
            return Evaluation()
        who = {"all": list(range(self.num_clients)), "sampled": sampled, "none": []}[ev.clients]
        names = [t.name for t in self.cfg.runtime.tiers]
        tiers = {self.tier_of[c] for c in who} | (set(names) if ev.global_test else set())
        bcast = self._broadcasts(r, tiers, "eval")
        jobs = self._jobs("evaluate_clients", who, bcast, r)
        scored: dict[str, str] = {}  # broadcast key -> tier whose executor scores it
        if ev.global_test:
            for tier in names:
                if bcast[tier][0] not in scored:
                    scored[bcast[tier][0]] = tier
                    jobs.append((tier, "evaluate_global", bcast[tier][:2]))
        out = Evaluation()
        for res in self.pool.run(jobs):
            if isinstance(res, tuple):  # (broadcast key, EvalResult) of a global test
                out.tiers[scored[res[0]]] = res[1]
            else:
                out.clients.update(dict(res))
        if ev.global_test:
            out.tiers = {t: out.tiers[scored[bcast[t][0]]] for t in names}
        out.clients = dict(sorted(out.clients.items()))  # reduced in client-id order
        return out

    # ------------------------------------------------------------------ logging

    def _log(self, rec: RoundRecord) -> dict:
        """Write the round's row and its clients' rows (every per-client quantity reduced in
        client-id order); return the round row."""
        per_client = rec.policy_metrics.pop("per_client", {})
        evaluated = rec.evaluation
        client_rows = []
        per_tier: dict[str, float] = {}
        for c in sorted(set(rec.sampled) | set(evaluated.clients)):
            tier = self.tier_of[c]
            row: dict[str, Any] = {"round": rec.round, "client_id": c, "tier": tier,
                                   "sampled": c in rec.final}
            if c in rec.final:
                res, d = rec.final[c], rec.download[c]
                for kind, nbytes in (("upload_bytes", res.upload_bytes), ("download_bytes", d)):
                    key = f"tier/{tier}/{kind}"
                    per_tier[key] = per_tier.get(key, 0) + nbytes
                row.update(status=str(res.status), error=res.error, attempts=rec.attempts[c],
                           executor=res.executor, num_samples=res.num_samples,
                           upload_bytes=res.upload_bytes, download_bytes=d,
                           seconds=res.seconds, **{k: float(v) for k, v in res.metrics.items()})
                if res.state_version is not None:
                    row["state_bytes"] = float(res.state_bytes)
            row.update({k: float(v) for k, v in per_client.get(c, {}).items()})
            ev = evaluated.clients.get(c)
            if ev is not None:
                row.update(eval_loss=ev.loss, eval_accuracy=ev.accuracy, eval_samples=ev.n)
                if ev.finetuned is not None:
                    row.update(ft_loss=ev.finetuned.loss, ft_accuracy=ev.finetuned.accuracy)
            client_rows.append(row)
        ok = [rec.final[c] for c in rec.sampled if rec.final[c].ok]
        accs = np.array([e.accuracy for e in evaluated.clients.values()])
        ft = np.array([e.finetuned.accuracy for e in evaluated.clients.values()
                       if e.finetuned is not None])
        n_ok = [res.num_samples for res in ok]
        losses = [res.metrics.get("train_loss", math.nan) for res in ok]
        scores = evaluated.tiers
        g = {}
        if scores:  # the fleet: unweighted mean over tiers of each tier's own model
            g = {"accuracy": float(np.mean([v.accuracy for v in scores.values()])),
                 "loss": float(np.mean([v.loss for v in scores.values()]))}
        per_tier |= {f"tier/{t}/{k}": float(v) for t, res in scores.items()
                     for k, v in {"loss": res.loss, "accuracy": res.accuracy,
                                  **res.extra}.items()}
        up = sum(rec.final[c].upload_bytes for c in rec.sampled)
        down = sum(rec.download.values())
        row = {
            "round": rec.round, "sampled": len(rec.sampled), "ok": len(ok),
            "failed": sum(rec.final[c].status is Status.ERROR for c in rec.sampled),
            "rejected": sum(rec.final[c].status is Status.REJECTED for c in rec.sampled),
            "train_loss": float(np.average(losses, weights=n_ok)) if ok else math.nan,
            "personalized_accuracy": float(accs.mean()) if accs.size else math.nan,
            "personalized_accuracy_std": float(accs.std()) if accs.size else math.nan,
            "personalized_accuracy_ft": float(ft.mean()) if ft.size else math.nan,
            "global_accuracy": float(g.get("accuracy", math.nan)),
            "global_loss": float(g.get("loss", math.nan)),
            "upload_bytes": up, "download_bytes": down,
            "cum_upload_bytes": self.totals["upload_bytes"],
            "cum_download_bytes": self.totals["download_bytes"],
            "cum_bytes": self.totals["upload_bytes"] + self.totals["download_bytes"],
            "executor_restarts": rec.restarts, "seconds": rec.seconds,
            **{f"policy/{k}": float(v) for k, v in rec.policy_metrics.items()},
            **per_tier,
        }
        self.metrics.write_round(rec.round, row, client_rows)
        return row

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> None:
        """Round-boundary checkpoint: global and policy state, client-state manifest,
        byte totals. The sampling position is the round itself (sampling is a function
        of (seed, round))."""
        ck = {"round": self.round, "global_state": self.global_state,
              "policy_state": self.policy.state_dict(), "versions": dict(self.versions),
              "totals": dict(self.totals), "restarts": self.pool.restarts,
              "has_base": sorted(self.has_base)}
        self.storage.write_checkpoint(self.round, ck, keep=KEEP_CHECKPOINTS)
        ClientStateStore(self.storage).prune(self.versions, self.kept_versions)
        self.kept_versions = dict(self.versions)

    # ------------------------------------------------------------------ queries

    def get_global_state(self) -> dict[str, np.ndarray]:
        return self.global_state

    def get_round(self) -> int:
        return self.round

    def executor_handles(self) -> dict[str, list[Any]]:
        return self.pool.handles()

    def finish(self) -> dict:
        self.metrics.consolidate()
        return {"round": self.round, "totals": dict(self.totals),
                "executor_restarts": self.pool.restarts}

    def shutdown(self) -> None:
        self.pool.shutdown()
