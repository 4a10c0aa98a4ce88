"""ClientExecutor: a Ray actor that keeps the heavy things resident (model, data) and runs
the updates of the virtual clients it is handed, one after another.

It knows nothing of the round loop: it receives typed jobs (:mod:`fedray.runtime.jobs`: a
broadcast, a round and the clients with the state version each must start from) and
returns typed results, one :class:`ClientResult` per client. A client whose update raises
is returned with status ``error`` (the driver decides whether to re-run it); everything
else is the algorithm's.

Its device is what Ray granted it (:func:`fedray.runtime.devices.worker_device`): CUDA only
with a GPU share. After an error that poisons the CUDA context (illegal memory access,
device-side assert) the process exits, so the pool replaces it and re-queues its clients,
instead of failing every later client on a dead context.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.data.population import global_test_set
from fedray.methods.base import (
    ClientContext,
    ClientOutput,
    ClientResult,
    EvalResult,
    State,
    Status,
    accumulate,
    accumulate_rows,
    finite,
    stack_slice,
)
from fedray.runtime.jobs import (
    Broadcast,
    ClientSlot,
    EvalBatch,
    EvalJob,
    GlobalEvalJob,
    GlobalScore,
    Partial,
    RootJob,
    RootUpdate,
    StackedUploads,
    TrainBatch,
    TrainJob,
    cohort_runs,
)
from fedray.wire.payload import Payload


@dataclass
class _Trained:
    """One client's local update before the transform chain and the codec: the method's
    output and the chain memory it started from, or the one-line error it raised."""

    output: ClientOutput | None
    memory: Any
    seconds: float
    error: str | None = None

    @classmethod
    def failed(cls, exc: Exception, seconds: float) -> _Trained:
        exit_if_fatal(exc)
        return cls(None, None, seconds,
                   traceback.format_exception_only(type(exc), exc)[-1].strip())


def exit_if_fatal(exc: BaseException) -> None:
    """End this process when ``exc`` left its CUDA context unusable (the pool replaces it)."""
    from fedray.runtime.devices import is_fatal_device_error

    if is_fatal_device_error(exc):
        traceback.print_exception(exc)
        os._exit(3)


class ClientExecutor:
    def __init__(self, cfg: Any, algorithm_cls: type, data: Any, run_uri: str, tier: str,
                 index: int):
        from fedray.core.registry import make_method
        from fedray.core.state_store import ClientStateStore
        from fedray.core.storage import Storage
        from fedray.methods.robust.adversary import adversary_of
        from fedray.runtime.devices import configure_process, settle_heap, worker_device

        self.cfg, self.tier, self.index = cfg, tier, index
        self.name = f"{tier}/{index}"
        self.data = data
        self.device = worker_device()
        share = next(t.num_gpus for t in cfg.runtime.tiers if t.name == tier)
        configure_process(self.device, gpu_share=share, deterministic=cfg.runtime.deterministic,
                          threads=cfg.runtime.threads_per_executor)
        self.algorithm = make_method(algorithm_cls, cfg)
        self.resident = self.algorithm.build_resident(data.input_shape, data.num_classes,
                                                      self.device)
        self.chain = self.algorithm.update_chain()
        self.adversary = adversary_of(cfg, data)
        self.store = ClientStateStore(Storage(run_uri))
        self._broadcast_key: Any = None
        self._broadcast: dict | None = None
        self._policy: Any = None
        settle_heap()

    def reset(self, cfg: Any, algorithm_cls: type, data: Any, run_uri: str, tier: str,
              index: int) -> dict:
        """Become an executor of a new run (``runtime.keep_warm``): every attribute is
        rebuilt from these arguments as ``__init__`` builds it. Returns :meth:`ready`."""
        self.release()
        self.__init__(cfg, algorithm_cls, data, run_uri, tier, index)  # type: ignore[misc]
        return self.ready()

    def release(self) -> None:
        """Drop everything of the finished run: data, model, broadcast, state store."""
        from fedray.runtime.devices import free_device_memory

        self.__dict__.clear()
        free_device_memory()

    def ready(self) -> dict:
        model = getattr(self.resident, "model", self.resident)
        params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") \
            else None
        import ray

        from fedray.runtime.devices import device_info

        return {"pid": os.getpid(), "tier": self.tier, "index": self.index,
                "node_id": ray.get_runtime_context().get_node_id(),
                "model_parameters": params, **device_info()}

    def init_global_state(self, seed: int) -> Payload:
        return Payload.encode(self.algorithm.init_global_state(self.resident, seed), "fp32")

    def _decoded(self, broadcast: Broadcast) -> dict:
        """Decode each broadcast once per executor, however many of its clients use it (the
        payload is fetched from the object store only for a key not decoded yet)."""
        if broadcast.key != self._broadcast_key:
            import ray

            self._broadcast_key = None  # a failed fetch leaves nothing stale behind
            self._broadcast = ray.get(broadcast.ref).decode()
            self._broadcast_key = broadcast.key
        return self._broadcast  # type: ignore[return-value]

    def run_clients(self, job: TrainJob) -> TrainBatch:
        """Run the job's clients, each from the client-state version it names, for the
        job's round: one after another, or (``job.cohort``) in near-equal cohorts of at most
        that many (:func:`~fedray.runtime.jobs.cohort_runs`), each cohort's local
        training one batched computation
        (:meth:`~fedray.methods.base.Algorithm.cohort_update`).

        A reduced job (``runtime.reduce=executors``, a linear rule) keeps the uploads here:
        each one is encoded (its bytes are what is counted), decoded as the server would,
        and, when free of NaN and Inf, added to Σ_i w_i Δ_i in the job's client order
        (:func:`~fedray.methods.base.accumulate`, float64); the results come back without
        payloads, with the :class:`~fedray.runtime.jobs.Partial`."""
        tensors = self._decoded(job.broadcast)
        self._read_ahead([slot.client for slot in job.clients])
        try:
            return self._run(job, tensors)
        finally:
            self._read_ahead([])  # nothing prepared outlives the call

    def _run(self, job: TrainJob, tensors: State) -> TrainBatch:
        partial = Partial({}, 0.0) if job.reduce else None
        policy = self._linear_policy() if job.reduce else None
        batch = TrainBatch([], partial)
        for slots in cohort_runs(job.clients, job.cohort or 1):
            outputs = self._cohort(slots, job.round, tensors) if job.cohort else \
                [self._one(slot, job.round, tensors) for slot in slots]
            if self.adversary is not None:
                outputs = [self._attacked(slot.client, job.round, got)
                           for slot, got in zip(slots, outputs, strict=True)]
            stack = self._stacked(slots, job.round, outputs) if job.cohort else None
            if stack is not None:
                results, uploads = stack
                if partial is not None:
                    results = self._reduce_stack(results, uploads, policy, partial)
                else:
                    batch.stacks.append(uploads)
                batch.results += results
                continue
            batch.results += [self._finish(slot.client, job.round, tensors, got, policy,
                                           partial)
                              for slot, got in zip(slots, outputs, strict=True)]
        return batch

    def _attacked(self, cid: int, round: int, got: _Trained) -> _Trained:
        """A malicious client's update as it uploads it (before the transform chain and
        the codec: the bytes counted are those of what it sends)."""
        if got.error is not None:
            return got
        upload = self.adversary.poison_upload(cid, round, dict(got.output.upload))
        return dataclasses.replace(got, output=dataclasses.replace(got.output, upload=upload))

    def _stacked(self, slots: list[ClientSlot], round: int, outputs: list[_Trained]
                 ) -> tuple[list[ClientResult], StackedUploads] | None:
        """A cohort's results with its uploads as one stacked payload, where that is
        exact: no update transforms, an elementwise codec, and every upload of one
        structure (names, shapes, dtypes), so that each client's encoded size — counted as
        its ``upload_bytes`` — is the first one's. None: send them one by one."""
        from fedray.wire.payload import CODECS

        codec = self.cfg.payload.upload
        ok = [got.output for got in outputs if got.error is None]
        if self.chain or not CODECS[codec].elementwise or not ok:
            return None
        if stack_slice([o.upload for o in ok]) is None:  # rows of one stack: one structure
            shape = [(k, np.shape(v), np.asarray(v).dtype) for k, v in ok[0].upload.items()]
            if any([(k, np.shape(v), np.asarray(v).dtype) for k, v in o.upload.items()]
                   != shape for o in ok[1:]):
                return None
        nbytes = Payload.encode(ok[0].upload, codec).nbytes
        results, members = [], []
        for slot, got in zip(slots, outputs, strict=True):
            if got.error is not None:
                results.append(self._error(slot.client, round, got))
                continue
            t0 = time.perf_counter()
            try:
                version, state_bytes = self._save_state(slot.client, round, got.output.state,
                                                        got.memory)
            except Exception as e:  # noqa: BLE001 — reported per client
                results.append(self._error(slot.client, round, _Trained.failed(e, got.seconds)))
                continue
            members.append(got.output)
            results.append(ClientResult(
                slot.client, round, Status.OK, got.output.num_samples, None,
                dict(got.output.metrics), upload_bytes=nbytes,
                seconds=got.seconds + time.perf_counter() - t0, executor=self.name,
                state_version=version, state_bytes=state_bytes))
        stacked = (stack_slice([o.upload for o in members]) or
                   {k: np.stack([np.asarray(o.upload[k]) for o in members])
                    for k in ok[0].upload}) if members else {}
        clients = [r.client_id for r in results if r.ok]
        return results, StackedUploads(clients, Payload.encode(stacked, codec))

    def _reduce_stack(self, results: list[ClientResult], uploads: StackedUploads, policy: Any,
                      partial: Partial) -> list[ClientResult]:
        """A cohort's stacked uploads added to the partial sum: decoded once, the rows free
        of NaN and Inf added in client order as :meth:`_finish` adds each client's own
        decoded upload (an elementwise codec decodes a row as it decodes that client's
        payload, and :func:`~fedray.methods.base.accumulate_rows` adds as
        :func:`~fedray.methods.base.accumulate` does: the same bits), the others named. A
        client whose weight raises fails alone; stacked rows share their shapes, so a stack
        that cannot be added fails each of its clients. Returns the results."""
        samples = {r.client_id: r.num_samples for r in results if r.ok}
        tensors, clean = uploads.checked()
        failed, rows, weights = {}, [], []
        for i in np.flatnonzero(clean):
            cid = uploads.clients[i]
            try:
                weights.append(policy.weight(samples[cid]))
                rows.append(i)
            except Exception as e:  # noqa: BLE001 — reported per client
                failed[cid] = _Trained.failed(e, 0.0)
        try:
            accumulate_rows(partial.total, tensors if len(rows) == len(clean) else
                            {k: v[rows] for k, v in tensors.items()}, weights)
        except Exception as e:  # noqa: BLE001 — reported per client
            failed |= {uploads.clients[i]: _Trained.failed(e, 0.0) for i in rows}
            weights = []
        for w in weights:
            partial.weight += w
        partial.nonfinite += [c for c, ok in zip(uploads.clients, clean, strict=True) if not ok]
        return [self._error(r.client_id, r.round, failed[r.client_id])
                if r.client_id in failed else r for r in results]

    @staticmethod
    def _add(partial: Partial, cid: int, upload: State, num_samples: int, policy: Any,
             clean: bool) -> None:
        """One decoded upload into the partial sum (the caller keeps client order): added
        with the rule's weight when free of NaN and Inf, else named and left out."""
        if clean:
            w = policy.weight(num_samples)
            accumulate(partial.total, upload, w)
            partial.weight += w
        else:
            partial.nonfinite.append(cid)

    def _save_state(self, cid: int, round: int, method_state: Any, memory: Any
                    ) -> tuple[int | None, int]:
        """Write what the client keeps (its method state and its chain memory): (the
        version written or None, its bytes)."""
        state = method_state
        if self.chain.stateful:
            state = {"transforms": memory} | (
                {"method": method_state} if method_state is not None else {})
        if state is None:
            return None, 0
        return round, self.store.save(cid, round, state)

    def _one(self, slot: ClientSlot, round: int, tensors: State) -> _Trained:
        """One client's update, alone."""
        t0 = time.perf_counter()
        try:
            ctx, memory = self._prepare(slot, round)
            return _Trained(self.algorithm.client_update(ctx, tensors), memory,
                            time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 — reported per client, never swallowed
            return _Trained.failed(e, time.perf_counter() - t0)

    def _cohort(self, slots: list[ClientSlot], round: int, tensors: State) -> list[_Trained]:
        """A cohort's updates as one batched computation. A client whose state or data
        cannot be read fails alone; when the batched update raises, each client is re-run
        alone (so only the one that raises fails). Each client is charged an equal share of
        the cohort's time."""
        t0 = time.perf_counter()
        ready: list[tuple[int, ClientContext, Any]] = []
        got: dict[int, _Trained] = {}
        for i, slot in enumerate(slots):
            try:
                ready.append((i, *self._prepare(slot, round)))
            except Exception as e:  # noqa: BLE001
                got[i] = _Trained.failed(e, 0.0)
        try:
            outputs = self.algorithm.cohort_update([c for _, c, _ in ready], tensors) \
                if ready else []
        except Exception as e:  # noqa: BLE001
            exit_if_fatal(e)
            for i, _, _ in ready:
                got[i] = self._one(slots[i], round, tensors)
            return [got[i] for i in range(len(slots))]
        share = (time.perf_counter() - t0) / max(len(ready), 1)
        for (i, _, memory), output in zip(ready, outputs, strict=True):
            got[i] = _Trained(output, memory, share)
        return [got[i] for i in range(len(slots))]

    def _prepare(self, slot: ClientSlot, round: int) -> tuple[ClientContext, Any]:
        """A client's context and its transform chain's memory, from its stored state."""
        method_state, memory = self._load_state(slot.client, slot.version)
        return self._context(slot.client, round, method_state), memory

    def _finish(self, cid: int, round: int, tensors: State, got: _Trained, policy: Any,
                partial: Partial | None) -> ClientResult:
        """A client's output through the transform chain and the codec; its state written
        back; with ``partial``, its decoded upload added to the sum."""
        if got.error is not None:
            return self._error(cid, round, got)
        t0 = time.perf_counter()
        try:
            result, memory = got.output, got.memory
            upload, metrics = result.upload, dict(result.metrics)
            if self.chain:
                shapes = {k: tensors[k].shape for k in upload if k in tensors}
                upload, memory, sent = self.chain.client(
                    upload, shapes, memory, seed=self.cfg.seed, round=round, client=cid,
                    reference=tensors if self.chain.needs_reference else None)
                metrics |= sent
            payload = Payload.encode(upload, self.cfg.payload.upload)
            version, state_bytes = self._save_state(cid, round, result.state, memory)
            nbytes = payload.nbytes
            if partial is not None:
                seen, payload = payload.decode(), None
                self._add(partial, cid, seen, result.num_samples, policy, finite(seen))
            return ClientResult(cid, round, Status.OK, result.num_samples, payload, metrics,
                                upload_bytes=nbytes,
                                seconds=got.seconds + time.perf_counter() - t0,
                                executor=self.name, state_version=version,
                                state_bytes=state_bytes)
        except Exception as e:  # noqa: BLE001 — reported per client, never swallowed
            return self._error(cid, round,
                               _Trained.failed(e, got.seconds + time.perf_counter() - t0))

    def _error(self, cid: int, round: int, got: _Trained) -> ClientResult:
        """A client whose update (or what came after it) raised, as the driver receives it."""
        return ClientResult(cid, round, Status.ERROR, error=got.error, seconds=got.seconds,
                            executor=self.name)

    def _linear_policy(self) -> Any:
        """The run's aggregation rule, for its weights w_i (made once per run)."""
        if self._policy is None:
            self._policy = self.algorithm.make_policy()
        return self._policy

    def _load_state(self, cid: int, version: int | None) -> tuple[Any, Any]:
        """(the method's state, the transform chain's memory) the client left last time;
        with a stateful chain both are kept in one state file."""
        if not (self.algorithm.uses_client_state or self.chain.stateful):
            return None, None
        state = self.algorithm.upgrade_state(self.store.load(cid, version))
        if not self.chain.stateful or state is None:
            return state, None
        return state.get("method"), state.get("transforms")

    def _read_ahead(self, cids: list[int]) -> None:
        """Tell the client data which clients it is about to be asked for, in order, where
        it can prepare them together (a synthetic population seeds their generators in
        one pass); what it then returns is the same as without."""
        hook = getattr(self.data, "read_ahead", None)
        if hook is not None:
            hook(cids)

    def _context(self, cid: int, round: int, state: Any = None) -> ClientContext:
        x_tr, y_tr = self.data.client_arrays(cid, round, "train")
        if self.adversary is not None:
            x_tr, y_tr = self.adversary.poison_data(cid, round, x_tr, y_tr)
        x_te, y_te = self.data.client_arrays(cid, round, "test")
        extra = self.data.client_extra(cid, round)
        return ClientContext(cid, round, self.cfg.seed, self.tier, x_tr, y_tr, x_te, y_te,
                             self.resident, self.device, state, extra)

    def evaluate_clients(self, job: EvalJob) -> EvalBatch:
        """The broadcast model on each client's local test split (personalized accuracy),
        and, with ``eval.finetune_epochs``, after that much local fine-tuning."""
        tensors = self._decoded(job.broadcast)
        epochs = self.cfg.eval.finetune_epochs
        round = job.round
        self._read_ahead(job.clients)
        out = {}
        try:
            for cid in job.clients:
                ctx = self._context(cid, round)
                res = EvalResult.of(self.algorithm.evaluate(self.resident, tensors, ctx.x_test,
                                                            ctx.y_test, self.device))
                if epochs:
                    res.finetuned = EvalResult.of(
                        self.algorithm.finetune_evaluate(ctx, tensors, epochs))
                out[cid] = res
        except Exception as e:
            exit_if_fatal(e)
            raise
        return EvalBatch(out)

    def evaluate_global(self, job: GlobalEvalJob) -> GlobalScore:
        """The broadcast model on the global test set (``eval.global_test_set``: the
        in-memory sample, or the whole test partition streamed), tagged with the broadcast
        key; under a backdoor attack also its ``attack_success_rate`` (accuracy on the
        sample's triggered test samples relabelled the target)."""
        tensors = self._decoded(job.broadcast)
        try:
            scores = self.algorithm.evaluate(self.resident, tensors, *global_test_set(
                self.data, self.cfg.eval.global_test_set), self.device)
            triggered = self.adversary.triggered_test(self.data.x_test, self.data.y_test) \
                if self.adversary is not None else None
            if triggered is not None:
                asr = self.algorithm.evaluate(self.resident, tensors, *triggered, self.device)
                scores = {**scores, "attack_success_rate": asr["accuracy"]}
        except Exception as e:
            exit_if_fatal(e)
            raise
        return GlobalScore(job.broadcast.key, EvalResult.of(scores))

    def root_update(self, job: RootJob) -> RootUpdate:
        """The server's update on its root dataset (FLTrust): the method's own client update
        from the broadcast, as client -1 of the round, on ``job.samples`` samples drawn once
        from the clients' training splits (:func:`fedray.methods.robust.root_dataset`)."""
        from fedray.methods.robust import root_dataset

        tensors = self._decoded(job.broadcast)
        if getattr(self, "_root", None) is None or self._root[0] != job.samples:
            self._root = (job.samples, *root_dataset(self.data, job.samples, self.cfg.seed))
        _, x, y = self._root
        ctx = ClientContext(-1, job.round, self.cfg.seed, self.tier, x, y, x[:0], y[:0],
                            self.resident, self.device)
        try:
            out = self.algorithm.client_update(ctx, tensors)
        except Exception as e:
            exit_if_fatal(e)
            raise
        return RootUpdate(Payload.encode(dict(out.upload), "fp32"))

    def exit(self) -> None:
        """Die on purpose (used by tests of the fault-tolerance path)."""
        os._exit(1)
