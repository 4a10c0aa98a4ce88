"""The CUDA paths of fedray in one short run: what a GPU machine must show before a cluster
is trusted with FAVoR, DROD and FLITE on fractional GPUs. One GPU, sized for at most 8
minutes (not yet timed on a GPU: ``env.step_seconds`` of the output says), nothing
downloaded (the shell script sets HF_HUB_OFFLINE).

    bash benchmarks/gpu_check.sh --out runs/gpu_check           # on a GPU machine
    bash benchmarks/gpu_check.sh --dry-run --out /tmp/gpu_check # anywhere (the test suite)

Checks (each one JSON line on stdout; all of them in OUT/gpu_check.json and GPU_CHECK.md;
the last stdout line is {"ok": ..., "failed": [...], "out": ...}; exit 0 when all pass):

- ``favor_bf16``: a FAVoR client round (shared stage, private stage with ASCE alignment) on a
  tiny Qwen2 saved in bf16 — 4-bit NF4 with bf16 compute on CUDA (the alignment head used to
  fail on bf16 hidden states).
- ``favor_memory``: the same round on Qwen2.5-3B's layer shape (hidden 2,048, MLP 11,008,
  16/2 heads) with the real 151,936-token vocabulary at 4 x 256 tokens, for 2 and 4 decoder
  layers: ``torch.cuda.max_memory_allocated`` per executor and the linear estimate for
  Qwen2.5-0.5B/1.5B/3B depth (24/28/36 layers, same width for 3B; 0.5B/1.5B widths measured
  the same way).
- ``favor_cohort``: 12 FAVoR authors' client rounds on Qwen2.5-0.5B's shapes (4 decoder
  layers, the real vocabulary, 4-bit NF4 on CUDA) one after another and as one cohort
  through the one base (``runtime.vectorize``, :mod:`fedray.methods.favor.cohort`):
  tokens/s and peak GPU memory of each, and the largest relative difference of an upload.
- ``flite_bf16``: FLITE stored and regenerated, ``local.bf16`` autocast, training steps
  (the regenerated backward used to fail) and the two modes' gradients compared.
- ``drod_deterministic``: a DROD client update twice in the deterministic GPU mode,
  uploads compared bitwise.
- ``ray_tiers``: an experiment on local Ray with 4 executors x 0.25 GPU: each executor's
  device, granted GPU ids and CUDA_VISIBLE_DEVICES; plus one executor that takes no GPU.
- ``fatal_error``: a client that triggers a device-side assert; its executor must exit, be
  replaced and the round finish with every client accepted.
- ``favor_qlora_fleet``: FAVoR on the embedded LM in 4-bit NF4 (QLoRA), 8 executors at
  0.125 GPU each, 8 clients x 2 rounds.
- ``drod_fleet_gpu``: DROD's capacity tiers (1.0 / 0.251 / 0.064 of a sliceable
  ResNet-18) with executors at 0.5 / 0.25 / 0.125 GPU, deterministic when Ray names the GPU.
- ``flite_resnet18``: FLITE on a ResNet-18 at CIFAR's 3x32x32 (digits upsampled), from a
  base pretrained here, int4 uploads (648 B of latents each).
- ``pfl_cifar10``: pfl-research's CIFAR-10 benchmark setup (``configs/benchmarks/
  pfl_cifar10.yaml``) for 12 rounds on 4 x 0.25 GPU: seconds per round; with
  ``--pfl-python`` pfl-research's own simulator on the same images, and the ratio.

The three fleet checks run an experiment on Ray and then the same config on the CPU
(``runtime.device=cpu``), and report per executor the share Ray granted and the peak GPU
memory (``torch.cuda.max_memory_allocated`` inside it), per tier samples/s, and what equals
the CPU run: sampled clients, tiers, samples and bytes exactly; round-1 losses within 5%
(DROD, FLITE; FAVoR's NF4 against fp32 only reported).

``--dry-run`` runs the same code on the CPU with small shapes, GPUs declared to Ray (the
test suite's Ray declares one): it proves the script, not the GPU. There the fleets are
smaller (FAVoR: 2 executors, not 8, on a 2-core machine; 1 round), 4-bit quantization is
off (bitsandbytes' 4-bit layers need CUDA; the row says so), peak GPU memory is null with
the executor's peak RSS as a stand-in, and the CPU reference must match bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedray.core.storage import Storage  # noqa: E402
from fedray.methods.fedavg.method import FedAvg  # noqa: E402

QWEN_SHAPES = {  # hidden, MLP, heads, KV heads, layers (the shipped Qwen2.5 configs)
    "qwen2.5-0.5b": (896, 4864, 14, 2, 24),
    "qwen2.5-1.5b": (1536, 8960, 12, 2, 28),
    "qwen2.5-3b": (2048, 11008, 16, 2, 36),
}
VOCAB = 151_936
# a placement that has not happened in 2 minutes will not: a hung executor start must not
# take the device time
PLACEMENT = "runtime.placement_timeout_s=120"


def estimate_favor_memory(shape: str, batch: int = 4, tokens: int = 256, rank: int = 16,
                          adapter_copies: int = 8) -> dict[str, Any]:
    """A FAVoR executor's CUDA memory from the shapes alone (no CUDA context): NF4 weights
    with double quantization (~4.13 bits) for the seven projections of every layer, the
    tied bf16 embedding, fp32 LoRA factors times ``adapter_copies`` (parameter, gradient,
    two Adam moments, server / anchor / endpoint / residual tensors), checkpointed layer
    inputs plus one layer's recomputation, and one 2**24-logit chunk with its fp32 softmax
    and gradient."""
    hidden, mlp, heads, kv, layers = QWEN_SHAPES[shape]
    kv_dim = kv * hidden // heads
    linear = [(hidden, hidden), (kv_dim, hidden), (kv_dim, hidden), (hidden, hidden),
              (mlp, hidden), (mlp, hidden), (hidden, mlp)]  # (out, in) per layer
    weights = layers * sum(o * i for o, i in linear) * 0.516 + VOCAB * hidden * 2
    lora = layers * sum(rank * (o + i) for o, i in linear) * 4 * adapter_copies
    act = (layers * batch * tokens * hidden * 2 + batch * tokens * mlp * 2 * 6
           + batch * heads * tokens * tokens * 4 * 2)
    logits = (1 << 24) * 14
    total = weights + lora + act + logits
    return {"check": "favor_memory_model", "shape": shape, "layers": layers,
            "weights_gib": round(weights / 2**30, 2), "lora_gib": round(lora / 2**30, 2),
            "activations_gib": round(act / 2**30, 2), "logits_gib": round(logits / 2**30, 2),
            "peak_gib": round(total / 2**30, 2), "ok": True}


def _peak_reset(device: str) -> None:
    """Start a peak-memory measurement. The previous model's 4-bit weights may sit in a
    reference cycle (bitsandbytes' ``Params4bit.module`` points back at its layer): they are
    collected first, so that they do not count in the next peak."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def _save_qwen(path: str, hidden: int, mlp: int, heads: int, kv: int, layers: int,
               vocab: int) -> str:
    """A randomly initialised Qwen2 of this shape saved in bf16 with a small tokenizer (the
    check feeds random token ids; only the shapes matter)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor.lm import train_tokenizer

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, tie_word_embeddings=True,
                      max_position_embeddings=1024)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 8, 300).save_pretrained(
        path)
    del model
    return path


def favor_round(path: str, device: str, tokens: int, blocks: int = 8, rank: int = 16,
                dtype: torch.dtype | None = None) -> dict[str, Any]:
    """One FAVoR client round (Algorithm 2: shared stage, private stage with alignment) on
    the LM at ``path`` as an executor loads it; peak CUDA memory from load to end."""
    from fedray.methods.favor.adapter import LoraSpec
    from fedray.methods.favor.lm import load_lm, with_lora
    from fedray.methods.favor.train import StageConfig, adapter_of, client_round

    _peak_reset(device)
    t0 = time.perf_counter()
    base, _ = load_lm(path, device, dtype=dtype)
    model = with_lora(base, LoraSpec(r=rank, alpha=2 * rank, dropout=0.05)).eval()
    server = adapter_of(model)
    vocab = base.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (blocks, tokens), generator=gen).to(device)
    target = torch.nn.functional.normalize(torch.randn(256, generator=gen), dim=0).to(device)
    cfg = StageConfig(epochs=1, micro_batch=4, accumulation=1, lr=2e-4, max_steps=2)
    upload, state, m = client_round(model, server, ids, ids, target, cfg, cfg, prox=0.01,
                                    align=0.3, seed=0, round=1, client=0)
    finite = all(torch.isfinite(v).all() for v in upload.values())
    out = {"param_dtype": str(next(p for p in base.parameters()).dtype),
           "quantized": any("4bit" in type(mod).__name__ for mod in base.modules()),
           "gradient_checkpointing": any(getattr(mod, "gradient_checkpointing", False)
                                         for mod in base.modules()),
           "finite": bool(finite and np.isfinite(m["align_loss"])),
           "align_loss": float(m["align_loss"]), "shared_loss": float(m["shared_loss"]),
           "peak_bytes": _peak(device), "seconds": round(time.perf_counter() - t0, 2)}
    del model, base
    return out


def check_favor(device: str, dry: bool, tmp: str) -> list[dict[str, Any]]:
    rows = [estimate_favor_memory(name) for name in QWEN_SHAPES]
    tiny = _save_qwen(os.path.join(tmp, "tiny"), 64, 128, 4, 2, 2, 512)
    r = favor_round(tiny, device, 32, dtype=torch.bfloat16)  # on CPU too: bf16 hidden states
    cuda_ready = r["quantized"] and r["gradient_checkpointing"] if device == "cuda" else True
    rows.append({"check": "favor_bf16", **r, "ok": r["finite"] and cuda_ready})
    shapes = {"dry-run": (64, 128, 4, 2, 36)} if dry else QWEN_SHAPES
    depths = (1, 2) if dry else (2, 4)
    tokens = 32 if dry else 256
    for name, (hidden, mlp, heads, kv, layers) in shapes.items():
        peaks = {}
        for depth in depths:
            path = _save_qwen(os.path.join(tmp, f"{name}-{depth}"), hidden, mlp, heads, kv,
                              depth, VOCAB)
            res = favor_round(path, device, tokens)
            peaks[depth] = res["peak_bytes"]
            rows.append({"check": "favor_memory", "shape": name, "layers": depth,
                         "tokens": f"4 x {tokens}", "vocab": VOCAB, **res,
                         "ok": res["finite"]})
        if None not in peaks.values():
            a, b = depths
            per_layer = (peaks[b] - peaks[a]) / (b - a)
            estimate = peaks[a] + per_layer * (layers - a)
            rows.append({"check": "favor_memory_estimate", "shape": name, "layers": layers,
                         "per_layer_bytes": int(per_layer), "peak_bytes": int(estimate),
                         "peak_gib": round(estimate / 2**30, 2), "ok": True})
    return rows


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def favor_cohort(path: str, device: str, tokens: int, authors: int, blocks: int = 8,
                 rank: int = 16) -> dict[str, Any]:
    """``authors`` FAVoR client rounds on the LM at ``path``: one after another
    (:func:`fedray.methods.favor.train.client_round`) and as one cohort through the one
    base (:func:`fedray.methods.favor.cohort.client_rounds`, ``runtime.vectorize``):
    tokens/s, peak memory of each (the base loaded once for both) and the largest relative
    difference of an upload (LoRA dropout off, so both paths train on the same terms)."""
    from fedray.methods.favor import cohort
    from fedray.methods.favor.adapter import LoraSpec
    from fedray.methods.favor.lm import load_lm, with_lora
    from fedray.methods.favor.train import StageConfig, adapter_of, client_round

    base, _ = load_lm(path, device)
    model = with_lora(base, LoraSpec(r=rank, alpha=2 * rank, dropout=0.0)).eval()
    server = adapter_of(model)
    vocab = base.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    group = [cohort.Author(c, torch.randint(0, vocab, (blocks, tokens), generator=gen)
                           .to(device), torch.nn.functional.normalize(
                               torch.randn(256, generator=gen), dim=0).to(device))
             for c in range(authors)]
    cfg = StageConfig(epochs=1, micro_batch=4, accumulation=1, lr=2e-4, max_steps=2)
    trained = 2 * authors * min(blocks, 2 * 4) * tokens  # both stages' tokens
    out: dict[str, Any] = {"authors": authors, "tokens": f"{blocks} x {tokens} per author"}
    uploads, metrics = {}, {}
    for mode in ("sequential", "batched"):
        _peak_reset(device)
        _sync(device)
        t = time.perf_counter()
        if mode == "sequential":
            done = [client_round(model, server, a.ids, a.ids, a.target, cfg, cfg, prox=0.01,
                                 align=0.3, seed=0, round=1, client=a.client)
                    for a in group]
        else:
            done = cohort.client_rounds(model, server, group, cfg, cfg, 0.01, 0.3, seed=0,
                                        round=1)
        uploads[mode] = [u for u, _, _ in done]
        metrics[mode] = [m for _, _, m in done]
        _sync(device)
        seconds = time.perf_counter() - t
        out[f"{mode}_seconds"] = round(seconds, 3)
        out[f"{mode}_tokens_per_s"] = round(trained / seconds, 1)
        out[f"{mode}_peak_bytes"] = _peak(device)
    diffs = []
    for a, b in zip(uploads["sequential"], uploads["batched"], strict=True):
        x = torch.cat([v.flatten().float() for v in a.values()])
        y = torch.cat([b[k].flatten().float() for k in a])
        diffs.append(float((x - y).norm() / x.norm().clamp_min(1e-30)))
    out["max_rel_upload_diff"] = max(diffs)
    out["max_rel_loss_diff"] = max(
        abs(b[k] - a[k]) / max(abs(a[k]), 1e-12)
        for a, b in zip(metrics["sequential"], metrics["batched"], strict=True)
        for k in ("shared_loss", "private_loss"))
    out["speedup"] = round(out["sequential_seconds"] / out["batched_seconds"], 2)
    del model, base
    return out


def check_favor_cohort(device: str, dry: bool, tmp: str) -> list[dict[str, Any]]:
    """FAVoR's cohort of authors through one base against the same authors one after
    another, at Qwen2.5-0.5B's shapes (4 layers; a dry run: tiny shapes, 3 authors)."""
    if dry:
        path = _save_qwen(os.path.join(tmp, "cohort-dry"), 64, 128, 4, 2, 2, 512)
        res = favor_cohort(path, device, 32, 3, blocks=4, rank=4)
        ok = res["max_rel_upload_diff"] <= 1e-4  # fp32 on the CPU: the same terms
    else:
        hidden, mlp, heads, kv, _ = QWEN_SHAPES["qwen2.5-0.5b"]
        path = _save_qwen(os.path.join(tmp, "cohort-0.5b"), hidden, mlp, heads, kv, 4, VOCAB)
        res = favor_cohort(path, device, 256, 12)
        # 4-bit NF4 base, bf16 compute, rows batched differently: Adam's first steps move
        # every weight by about ±lr, so one flipped gradient sign changes an upload by 2·lr
        # and the uploads' difference says little; the losses are the check (the upload
        # difference is reported)
        ok = res["max_rel_loss_diff"] <= 1e-2
    return [{"check": "favor_cohort", "shape": "dry-run" if dry else "qwen2.5-0.5b x 4 layers",
             **res, "ok": ok}]


def check_flite(device: str, dry: bool) -> list[dict[str, Any]]:
    from fedray.methods.flite import LatentMapping
    from fedray.models import build_model
    from fedray.models.training import train_local

    gen = np.random.default_rng(0)
    size = 16 if dry else 32
    x = gen.standard_normal((64, 3, size, size), dtype=np.float32)
    y = gen.integers(0, 10, 64)
    rows, grads = [], {}
    for mode in ("stored", "regenerated"):
        torch.manual_seed(0)
        model = build_model("resnet18", (3, size, size), 10, width=8 if dry else 64)
        mapping = LatentMapping(model, d=64, r=32, seed=7, mode=mode).to(device)
        t0 = time.perf_counter()
        m, _ = train_local(mapping, x, y, epochs=1, batch_size=32, lr=0.01, seed=0, round=1,
                           client=0, device=device, bf16=True)
        mapping.zero_grad()
        xb = torch.from_numpy(x[:16]).to(device)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            out = mapping(xb)
        out.float().square().mean().backward()
        grads[mode] = torch.cat([p.grad.float().cpu() for p in mapping.latent_parameters()])
        rows.append({"check": "flite_bf16", "mode": mode, "train_loss": m["train_loss"],
                     "seconds": round(time.perf_counter() - t0, 2),
                     "ok": bool(np.isfinite(m["train_loss"]))})
    cos = float(torch.nn.functional.cosine_similarity(grads["stored"], grads["regenerated"],
                                                      dim=0))
    for r in rows:
        r["grad_cosine_stored_vs_regenerated"] = round(cos, 4)
        r["ok"] = r["ok"] and cos > 0.95
    return rows


def check_drod(device: str, dry: bool) -> dict[str, Any]:
    """DROD in the deterministic mode, twice: the process's first CUDA work (cuBLAS reads
    ``CUBLAS_WORKSPACE_CONFIG`` when it starts), as in an executor."""
    from fedray.runtime.devices import configure_process

    with deterministic_flags_restored():
        configure_process(device, deterministic=True)  # what an executor does with the flag
        return _drod_twice(device, dry)


@contextlib.contextmanager
def deterministic_flags_restored() -> Iterator[None]:
    """The process-wide settings ``configure_process(deterministic=True)`` changes, set back
    afterwards: the checks after ``drod`` in this process measure the defaults."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = saved[1:5]
        if saved[5] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[5]


def _drod_twice(device: str, dry: bool) -> dict[str, Any]:
    """One DROD client update twice from the same state: bitwise the same uploads?"""
    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.data import build_data
    from fedray.methods.base import ClientContext

    cfg = load_config(None, [
        "algorithm.name=drod", "model.name=sliceable_resnet18",
        f"model.width={8 if dry else 32}", "clients.num_clients=4", "data.image_size=16",
        "data.channels=3", "local.batch_size=16", "local.epochs=1"])
    data = build_data(cfg)
    alg = build_method(cfg)
    uploads = []
    for _ in range(2):
        res = alg.build_resident(data.input_shape, data.num_classes, device)
        g = alg.init_global_state(res, cfg.seed)
        x, yy = data.client_arrays(0, 1)
        xt, yt = data.client_arrays(0, 1, "test")
        ctx = ClientContext(0, 1, cfg.seed, cfg.tier_of(0), x, yy, xt, yt, res, device)
        uploads.append(alg.client_update(ctx, alg.make_policy().broadcast(g, 1, cfg.tier_of(0)))
                       .upload)
    same = uploads[0].keys() == uploads[1].keys() and all(
        np.array_equal(uploads[0][k], uploads[1][k]) for k in uploads[0])
    return {"check": "drod_deterministic", "tensors": len(uploads[0]),
            "bitwise_equal": bool(same), "ok": bool(same)}


class CrashOnceFedAvg(FedAvg):
    """Client 1's first attempt raises a device-side assert (an out-of-range index on CUDA;
    on the CPU of a dry run, the error CUDA raises)."""

    name = "gpu-check-crash-once"
    marker = ""

    def client_update(self, ctx, broadcast):
        if ctx.client_id == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            if str(ctx.device).startswith("cuda"):
                t = torch.zeros(4, device=ctx.device)
                t[torch.tensor([1 << 20], device=ctx.device)] = 1.0
                torch.cuda.synchronize()
            raise RuntimeError("CUDA error: device-side assert triggered")
        return super().client_update(ctx, broadcast)


@contextlib.contextmanager
def connected_ray(dry: bool) -> Iterator[None]:
    """Join ``RAY_ADDRESS`` or start a local Ray for the checks that run on Ray; on a CPU
    machine (``--dry-run``) the local Ray declares one GPU, so that fractional-GPU placement
    is exercised without one. Shuts down only a Ray it started."""
    import ray

    from fedray.core.config import load_config
    from fedray.runtime import init_ray

    if dry and not os.environ.get("RAY_ADDRESS"):
        ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
        started = True
    else:
        started = init_ray(load_config(None, []))
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def check_ray(dry: bool, tmp: str) -> list[dict[str, Any]]:
    """``ray_tiers`` and ``fatal_error`` on the connected Ray (:func:`connected_ray`)."""
    from fedray.core.config import load_config
    from fedray.runtime import Experiment, run_experiment

    base = ["clients.num_clients=8", "rounds=2", "model.hidden=[32]", "local.batch_size=16",
            PLACEMENT]
    tiers = ("runtime.tiers=[{name: gpu, executors: 4, num_cpus: 0.25, num_gpus: 0.25},"
             " {name: cpu, executors: 1, num_cpus: 0.25}]")
    cfg = load_config(None, base + [tiers])
    rows = []
    exp = Experiment(cfg, os.path.join(tmp, "tiers"))
    info = exp.start()
    try:
        while not exp.done:
            exp.step()
        exp.close()
    finally:
        exp.release()
    for e in info["executors"]:
        gpu = e["tier"] == "gpu"
        want = ("cuda" if e["cuda_available"] else "cpu") if gpu else "cpu"
        if not dry and gpu:
            want = "cuda"
        rows.append({"check": "ray_tiers", "executor": f"{e['tier']}/{e['index']}",
                     "device": e["device"], "gpu_ids": e["gpu_ids"],
                     "cuda_visible_devices": e["cuda_visible_devices"],
                     # Ray 2.60 leaves a GPU-less worker's CUDA_VISIBLE_DEVICES as the
                     # node's (ray-project/ray#54868): only a GPU tier's must be set
                     "ok": e["device"] == want and bool(e["gpu_ids"]) == gpu
                     and (e["cuda_visible_devices"] not in ("", None) or not gpu)})
    CrashOnceFedAvg.marker = os.path.join(tmp, "crashed")
    crash = load_config(None, base + ["rounds=1", "runtime.max_client_retries=1",
                                      "runtime.tiers=[{name: gpu, executors: 2, "
                                      "num_cpus: 0.25, num_gpus: 0.25}]"])
    s = run_experiment(crash, os.path.join(tmp, "crash"), progress=False,
                       algorithm_cls=CrashOnceFedAvg)
    rows.append({"check": "fatal_error", "executor_restarts": s["executor_restarts"],
                 "client_failures": s["client_failures"],
                 "ok": s["executor_restarts"] == 1 and s["client_failures"] == 0
                 and os.path.exists(CrashOnceFedAvg.marker)})
    return rows


# ------------------------------------------------------------------ fleets on Ray
#
# favor_qlora_fleet, drod_fleet_gpu and flite_resnet18 each run a short experiment on the
# connected Ray with every tier on a GPU share, then the same config with runtime.device=cpu
# (one executor per tier) as the CPU reference. The method class is wrapped by measured():
# each client's metrics also carry its executor's peak memory, the GPU share Ray granted the
# executor and its count of 4-bit layers, so the clients table of the run holds them.

MIB = 2**20
# what must be identical between the GPU run and the CPU run, per (round, client): which
# clients were sampled, their tier (the slice of the model they train), how many samples
# they hold and the bytes sent each way (shapes and codec only; no float result decides them)
EQUAL_FIELDS = ("sampled", "tier", "status", "num_samples", "upload_bytes", "download_bytes")


def peak_memory(device: str) -> dict[str, float]:
    """This process's peak memory so far: ``torch.cuda.max_memory_allocated`` on CUDA
    (never reset in an executor: its peak from loading the model to now); on every device
    also the peak resident set size (``ru_maxrss``), the CPU stand-in of a dry run."""
    import resource

    out = {"peak_rss_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        out["peak_gpu_bytes"] = float(torch.cuda.max_memory_allocated())
    return out


def _linear4bit_modules(resident: Any) -> int:
    model = resident.get("model") if isinstance(resident, dict) else resident
    if not isinstance(model, torch.nn.Module):
        return 0
    return sum("4bit" in type(m).__name__ for m in model.modules())


def measured(cls: type) -> type:
    """``cls`` whose client updates also report, as client metrics: the executor's peak
    memory (:func:`peak_memory`), the GPU share Ray granted it (``ray_gpu_share``: what its
    placement holds, not what the config asked for) and how many 4-bit layers its resident
    model has. The method itself is untouched (same name, data and results)."""

    def client_update(self, ctx, broadcast):
        import ray

        out = cls.client_update(self, ctx, broadcast)
        share = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
        out.metrics = {**out.metrics, **peak_memory(ctx.device), "ray_gpu_share": share,
                       "linear4bit_modules": _linear4bit_modules(ctx.resident)}
        return out

    return type(f"Measured{cls.__name__}", (cls,), {
        "client_update": client_update, "__module__": __name__,
        "__doc__": f"{cls.__name__} reporting its executor's peak memory (gpu_check)."})


def tiers_override(tiers: list[dict[str, Any]]) -> str:
    return "runtime.tiers=" + json.dumps(tiers)


def run_fleet(cfg: Any, run_dir: str, algorithm_cls: type, data: Any = None
              ) -> tuple[list[dict], list[dict], dict]:
    """Run ``cfg`` on the connected Ray with ``measured(algorithm_cls)``; returns the
    executors' ready reports, the clients table's rows and the summary."""
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import Experiment

    exp = Experiment(cfg, run_dir, algorithm_cls=measured(algorithm_cls), data=data)
    try:
        info = exp.start()
        while not exp.done:
            exp.step()
        summary = exp.close()
    finally:
        exp.release()
    return info["executors"], read_metrics(run_dir, "clients").to_pylist(), summary


def fleet_report(cfg: Any, executors: list[dict], rows: list[dict],
                 trained: Callable[[int], int]) -> dict[str, Any]:
    """Per executor: device, granted GPU ids and share, clients run, peak GPU memory (MiB;
    null off CUDA) and peak RSS (MiB); per tier: the declared ``num_gpus``, the shares Ray
    granted, and samples/s = Σ samples trained / Σ seconds of its clients' updates, where
    ``trained(num_samples)`` is what one client update trains on (its passes and caps)."""
    done = [r for r in rows if r.get("sampled") and r.get("status") == "ok"]
    per_exec = []
    for e in sorted(executors, key=lambda e: (e["tier"], e["index"])):
        name = f"{e['tier']}/{e['index']}"
        mine = [r for r in done if r.get("executor") == name]
        gpu = [r["peak_gpu_bytes"] for r in mine if r.get("peak_gpu_bytes") is not None]
        rss = [r["peak_rss_bytes"] for r in mine if r.get("peak_rss_bytes") is not None]
        per_exec.append({
            "executor": name, "device": e["device"], "gpu_ids": e["gpu_ids"],
            "ray_gpu_share": mine[0]["ray_gpu_share"] if mine else None,
            "clients": len(mine),
            "peak_gpu_mib": round(max(gpu) / MIB, 1) if gpu else None,
            "peak_rss_mib": round(max(rss) / MIB, 1) if rss else None})
    tiers = {}
    for t in cfg.runtime.tiers:
        mine = [r for r in done if r["tier"] == t.name]
        seconds = sum(r["seconds"] for r in mine)
        tiers[t.name] = {
            "num_gpus": t.num_gpus, "capacity": t.capacity,
            "ray_gpu_shares": sorted({x["ray_gpu_share"] for x in per_exec
                                      if x["executor"].startswith(t.name + "/")
                                      and x["ray_gpu_share"] is not None}),
            "clients": len(mine), "samples_trained": sum(trained(r["num_samples"]) for r in mine),
            "samples_per_s": round(sum(trained(r["num_samples"]) for r in mine) / seconds, 1)
            if seconds else None}
    return {"executors": per_exec, "tiers": tiers}


def compare_to_cpu(rows: list[dict], ref: list[dict], tolerance: float | None,
                   loss: str = "train_loss") -> dict[str, Any]:
    """The GPU run's client rows against the CPU run's: :data:`EQUAL_FIELDS` must be
    identical for every (round, client); round 1's per-client ``loss`` metric (both runs
    start from the same global state, so it differs only by the arithmetic: TF32/bf16 GPU
    kernels, 4-bit weights, summation order) is compared as the largest relative
    difference, within ``tolerance`` (None: reported only, e.g. NF4 against fp32)."""
    key = lambda r: (r["round"], r["client_id"])  # noqa: E731
    a, b = {key(r): r for r in rows}, {key(r): r for r in ref}
    differ = sorted({f for k in a.keys() | b.keys() for f in EQUAL_FIELDS
                     if a.get(k, {}).get(f) != b.get(k, {}).get(f)})
    rel = [abs(a[k][loss] - b[k][loss]) / max(abs(b[k][loss]), 1e-12)
           for k in a.keys() & b.keys()
           if k[0] == 1 and a[k].get(loss) is not None and b[k].get(loss) is not None]
    worst = max(rel) if rel else None
    finite = worst is not None and bool(np.isfinite(worst))
    return {"equal": [f for f in EQUAL_FIELDS if f not in differ], "different": differ,
            "upload_bytes": sum(r.get("upload_bytes") or 0 for r in rows),
            "cpu_upload_bytes": sum(r.get("upload_bytes") or 0 for r in ref),
            "loss": loss, "round1_loss_rel_diff": worst, "loss_tolerance": tolerance,
            "ok": not differ and finite and (tolerance is None or worst <= tolerance)}


def local_samples(cfg: Any) -> Callable[[int], int]:
    """Samples one client update of a ``local.*`` method trains on (as the driver counts
    them): its epochs over its data, capped at ``local.max_steps`` batches."""
    loc = cfg.local
    cap = loc.max_steps * loc.batch_size if loc.max_steps else None
    return lambda n: min(n * loc.epochs, cap) if cap else n * loc.epochs


def fleet_check(name: str, cfg: Any, ref_cfg: Any, run_dir: str, tolerance: float | None,
                dry: bool, data: Any = None, trained: Callable[[int], int] | None = None,
                loss: str = "train_loss") -> tuple[dict[str, Any], list[dict]]:
    """Run ``cfg`` (GPU tiers) and ``ref_cfg`` (its CPU reference) into RUN_DIR/gpu and
    RUN_DIR/cpu; returns the row of ``name`` and the GPU run's client rows. ``ok``: every
    executor holds its tier's declared GPU share in Ray, runs on CUDA (the CPU in a dry
    run; then without a GPU memory figure) and ran a client; every tier reports samples/s
    (``trained``: default :func:`local_samples`); :func:`compare_to_cpu` holds on ``loss``
    (in a dry run with tolerance 0). The callers add their method's own conditions."""
    from fedray.core import registry

    algorithm_cls = registry.method(cfg.algorithm["name"])
    t0 = time.perf_counter()
    executors, rows, _ = run_fleet(cfg, os.path.join(run_dir, "gpu"), algorithm_cls, data)
    t1 = time.perf_counter()
    _, ref, _ = run_fleet(ref_cfg, os.path.join(run_dir, "cpu"), algorithm_cls, data)
    report = fleet_report(cfg, executors, rows, trained or local_samples(cfg))
    declared = {t.name: t.num_gpus for t in cfg.runtime.tiers}
    placed = all(e["ray_gpu_share"] == declared[e["executor"].split("/")[0]]
                 and e["clients"] > 0 and bool(e["gpu_ids"]) == (e["ray_gpu_share"] > 0)
                 and e["device"] == ("cpu" if dry else "cuda")
                 and (dry or e["peak_gpu_mib"] is not None) for e in report["executors"])
    fast = all(t["samples_per_s"] for t in report["tiers"].values())
    # a dry run's two runs do the same arithmetic on the same CPU, one thread per
    # executor, whichever executor a client lands on: the losses must agree bit for bit
    equal = compare_to_cpu(rows, ref, 0.0 if dry else tolerance, loss)
    row = {"check": name, "device": "cpu" if dry else "cuda", "rounds": cfg.rounds,
           "clients_per_round": cfg.clients.sampled_count(), **report,
           "cpu_reference": equal, "run_seconds": round(t1 - t0, 1),
           "cpu_run_seconds": round(time.perf_counter() - t1, 1),
           "ok": placed and fast and equal["ok"]}
    if dry:
        row["peak_gpu"] = "cpu (dry run): peak_gpu_mib null, peak_rss_mib is a stand-in"
    return row, rows


def minilm() -> tuple[Any, Any, str]:
    """(encoder, tokenizer, what it is): the shipped MiniLM, or — where its weights were
    left behind (``benchmarks/device_bundle.py`` carries the package without its 91 MB of
    weights to a lent GPU machine) — the same architecture from its config with random
    weights."""
    from fedray.methods.favor.asce import default_backbone, load_backbone

    path = default_backbone()
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return (*load_backbone(path), "shipped MiniLM-L6")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    return (AutoModel.from_config(AutoConfig.from_pretrained(path)),
            AutoTokenizer.from_pretrained(path), "MiniLM-L6 from its config, random weights "
                                                 "(weights not carried)")


def prepare_favor(work_dir: str, clients: int, lm: Any) -> dict[str, str]:
    """The embedded default's inputs (what ``prepare_embedded`` makes), the quick way: a
    synthetic roster in BlogText's schema, the tiny Qwen2 LM pretrained on disjoint authors
    (``pretrain_tiny``), and as ASCE the shipped MiniLM (:func:`minilm`) with an *untrained*
    projection, saved by ``save_asce`` in the format FAVoR loads — the check needs style
    targets of the right shape, not good ones, and training ASCE takes most of a minute on
    2 cores."""
    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors
    from fedray.methods.favor.asce import StyleEncoder, save_asce
    from fedray.methods.favor.lm import pretrain_tiny

    csv = generate_corpus(os.path.join(work_dir, "authors.csv"), clients, 0, posts=(10, 12))
    pre = generate_corpus(os.path.join(work_dir, "pretrain.csv"), 2, 0, posts=(30, 40),
                          first_author=100_000)
    texts = [t for a in load_authors(pre, lambda t: 1, min_tokens=1, seed=0) for t in a.train]
    base = pretrain_tiny(texts, os.path.join(work_dir, "base_lm"), lm)
    torch.manual_seed(0)
    backbone, tokenizer, encoder = minilm()
    asce = os.path.join(work_dir, "asce")
    save_asce(StyleEncoder(backbone), tokenizer, asce, {"trained": False})
    return {"csv": str(csv), "base": base, "asce": asce, "encoder": encoder}


def check_favor_fleet(dry: bool, tmp: str) -> list[dict[str, Any]]:
    """``favor_qlora_fleet``: FAVoR on the embedded default (synthetic BlogText authors, the
    tiny Qwen2 LM pretrained here, ASCE on the shipped MiniLM: :func:`prepare_favor`) with
    every executor at 0.125 GPU: 8 executors, 8 clients a round, 2 rounds, the LM in 4-bit
    NF4 with bf16 compute (QLoRA). A dry run: 2 executors at 0.125 of the declared GPU,
    4 clients, 1 round, and the same code on the CPU in fp32 — bitsandbytes' 4-bit layers
    need CUDA, so the row says quantization is off. Against the CPU run: sampling, tiers,
    samples and bytes identical; the loss difference is reported only (NF4 is not fp32)."""
    from fedray.core.config import load_config
    from fedray.data import build_data
    from fedray.methods.favor.lm import TinyLM
    from fedray.methods.favor.prepare import embedded_overrides

    if dry:  # about the size of jobs/favor_blogtext.py --smoke
        lm = TinyLM(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    steps=5, batch_size=8, max_length=64)
        executors, clients, rounds, cpus = 2, 4, 1, 0.5
    else:  # the embedded default's shape, pretrained briefly (the check needs no good LM)
        lm = TinyLM(steps=50)
        executors, clients, rounds, cpus = 8, 8, 2, 1
    prep = prepare_favor(os.path.join(tmp, "favor-embedded"), clients, lm)
    common = embedded_overrides(prep) + [
        f"clients.num_clients={clients}", f"rounds={rounds}", "algorithm.private_epochs=1",
        "algorithm.eval_prompts=1", "eval.clients=none", "eval.every=0",
        PLACEMENT]
    tier = {"name": "lm", "executors": executors, "num_cpus": cpus, "num_gpus": 0.125}
    cfg = load_config(None, common + [tiers_override([tier])])
    ref_cfg = load_config(None, common + ["runtime.device=cpu", tiers_override(
        [{**tier, "executors": 1 if dry else 2, "num_cpus": cpus}])])
    data = build_data(cfg)  # the same corpus for both runs
    passes = cfg.algorithm["shared_epochs"] + cfg.algorithm["private_epochs"]
    row, rows = fleet_check("favor_qlora_fleet", cfg, ref_cfg,
                            os.path.join(tmp, "favor-fleet"), None, dry, data,
                            trained=lambda n: n * passes, loss="shared_loss")
    row["asce_encoder"] = prep["encoder"]
    row["quantization"] = ("off: CPU dry run (bitsandbytes 4-bit needs CUDA), fp32" if dry
                           else "nf4 4-bit, double quant, bf16 compute")
    # the fewest 4-bit layers any executor's resident LM had (0 on the CPU)
    row["linear4bit_layers"] = int(min(r["linear4bit_modules"] for r in rows if r["sampled"]))
    row["ok"] = (row["ok"] and (row["linear4bit_layers"] > 0) != dry
                 and len(row["executors"]) == executors)
    return [row]


def check_drod_fleet(dry: bool, tmp: str) -> list[dict[str, Any]]:
    """``drod_fleet_gpu``: DROD's capacity tiers (budgets 1.0 / 0.251 / 0.064 of a
    sliceable ResNet-18, as in configs/drod_split_digits.yaml) with one executor per tier at
    0.5 / 0.25 / 0.125 GPU — 0.875 of one GPU (the job's 2 executors per tier would ask
    1.75) — on digits upsampled to CIFAR's 3×32×32, 9 clients, 2 rounds. On GPU with
    ``runtime.deterministic`` (pinned to the GPU type Ray reports) when Ray reports one.
    Against the CPU run: sampling, tiers, samples and bytes identical (a tier's slice of the
    model fixes its bytes); round-1 losses within 5% (TF32 convolutions, other summation
    order). A dry run: width 4, 16×16, 6 clients, 1 round, on the CPU; there every loss is
    the CPU run's."""
    import ray

    from fedray.core.config import load_config

    accel = sorted(k.split(":", 1)[1] for k in ray.cluster_resources()
                   if k.startswith("accelerator_type:"))
    deterministic = not dry and len(accel) == 1
    size, width, clients, rounds = (16, 4, 6, 1) if dry else (32, 32, 9, 2)
    common = ["name=gpu-check-drod", "algorithm.name=drod", "algorithm.theta=0.5",
              "model.name=sliceable_resnet18", f"model.width={width}", "data.dataset=digits",
              f"data.image_size={size}", "data.channels=3", "data.partition=dirichlet",
              "data.alpha=0.5", f"clients.num_clients={clients}", f"rounds={rounds}",
              "local.epochs=1", "local.batch_size=16", "local.max_steps=4", "local.lr=0.1",
              "eval.every=0", "eval.clients=none", PLACEMENT]
    shares = {"t100": (1.0, 0.5), "t025": (0.251, 0.25), "t006": (0.064, 0.125)}
    tiers = [{"name": n, "executors": 1, "num_cpus": 0.25 if dry else 1, "num_gpus": g,
              "capacity": c} | ({"accelerator_type": accel[0]} if deterministic else {})
             for n, (c, g) in shares.items()]
    cfg = load_config(None, common + [tiers_override(tiers),
                                      f"runtime.deterministic={str(deterministic).lower()}"])
    ref_threads = 1 if dry else 4
    ref_tiers = [{k: v for k, v in t.items() if k != "accelerator_type"}
                 | {"num_cpus": 0.25 if dry else ref_threads} for t in tiers]
    ref_cfg = load_config(None, common + ["runtime.device=cpu", tiers_override(ref_tiers),
                                          f"runtime.threads_per_executor={ref_threads}"])
    row, _ = fleet_check("drod_fleet_gpu", cfg, ref_cfg, os.path.join(tmp, "drod-fleet"),
                         0.05, dry)
    row["deterministic"] = deterministic
    row["accelerator_type"] = accel[0] if deterministic else None
    return [row]


def check_flite_fleet(dry: bool, tmp: str) -> list[dict[str, Any]]:
    """``flite_resnet18``: FLITE on a ResNet-18 (``resnet18``, full width 64) at CIFAR's
    3×32×32 and 10 classes — digits upsampled, so nothing is downloaded — from a base
    pretrained here for one epoch (on the GPU when there is one), d = 64, r = 32, int4
    uploads; 4 clients, 2 executors at 0.25 GPU, 2 rounds of 4 local steps. Against the CPU
    run: sampling, samples and the bytes of every upload identical; round-1 losses within
    5%. A dry run: width 4, the same shapes, 1 round, on the CPU."""
    from fedray.core.config import load_config
    from fedray.models.pretrain import pretrain

    width, rounds = (4, 1) if dry else (64, 2)
    data = ["data.dataset=digits", "data.image_size=32", "data.channels=3",
            "data.partition=iid", "model.name=resnet18", f"model.width={width}", "seed=0"]
    base = os.path.join(tmp, "flite-base")
    pretrain(load_config(None, data + ["pretrain.epochs=1", "pretrain.batch_size=64",
                                       "pretrain.warmup_epochs=0", "pretrain.fraction=0.3",
                                       "pretrain.head=orthogonal"]), base, progress=False)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the executors get the GPU's memory, not this process
    common = data + ["name=gpu-check-flite", "algorithm.name=flite", f"algorithm.base={base}",
                     "algorithm.d=64", "algorithm.r=32", "payload.upload=int4",
                     "clients.num_clients=4", f"rounds={rounds}", "local.epochs=1",
                     "local.batch_size=32", "local.max_steps=4", "eval.every=0",
                     "eval.clients=none", PLACEMENT]
    tier = {"name": "gpu", "executors": 2, "num_cpus": 0.5 if dry else 2, "num_gpus": 0.25}
    cfg = load_config(None, common + [tiers_override([tier])])
    threads = 1 if dry else 8
    ref_cfg = load_config(None, common + [
        "runtime.device=cpu", f"runtime.threads_per_executor={threads}",
        tiers_override([{**tier, "executors": 1, "num_cpus": 0.5 if dry else threads}])])
    row, rows = fleet_check("flite_resnet18", cfg, ref_cfg, os.path.join(tmp, "flite"),
                            0.05, dry)
    # every upload: z, D = 64 latents per conv weight (20 in a ResNet-18), at int4 — 648 B
    # of codes, scale and zero-point (FLITE's figure) plus the payload's header
    from fedray.models import build_model
    from fedray.wire.payload import Payload

    convs = sum(isinstance(m, torch.nn.Conv2d)
                for m in build_model("resnet18", (3, 32, 32), 10, width=width).modules())
    want = Payload.encode({"z": np.zeros(64 * convs, np.float32)}, "int4")
    sent = {r["upload_bytes"] for r in rows if r["sampled"]}
    row.update(mapped_layers=convs, latents=64 * convs,
               latent_bytes=sum(int(b.nbytes) for b in want.buffers),
               header_bytes=len(want.header), upload_bytes_per_client=sorted(sent))
    row["ok"] = row["ok"] and sent == {want.nbytes} and convs == 20
    return [row]


def write_cifar10(root: str, train: int, test: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """CIFAR-10 in torchvision's own files (``cifar-10-batches-py``: five train batches, a
    test batch, the meta file) with random pixels, and torchvision's md5 list pointed at
    them (this process only: it is the one that loads the data). Returns the train images
    (N, 3, 32, 32) uint8 and labels."""
    import hashlib
    import pickle

    import torchvision.datasets as tvd

    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    g = np.random.default_rng(seed)
    xs = g.integers(0, 256, (train + test, 3072), dtype=np.uint8)
    ys = g.integers(0, 10, train + test)
    per = train // 5
    files = [(f"data_batch_{i + 1}", xs[i * per:(i + 1) * per], ys[i * per:(i + 1) * per])
             for i in range(5)] + [("test_batch", xs[train:], ys[train:])]

    def dump(name: str, obj: dict) -> str:
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
        with open(path, "rb") as f:
            return hashlib.md5(f.read()).hexdigest()  # noqa: S324 — torchvision's checksum

    sums = {name: dump(name, {"data": x, "labels": y.tolist()}) for name, x, y in files}
    meta = dump("batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    tvd.CIFAR10.train_list = [[f"data_batch_{i + 1}", sums[f"data_batch_{i + 1}"]]
                              for i in range(5)]
    tvd.CIFAR10.test_list = [["test_batch", sums["test_batch"]]]
    tvd.CIFAR10.meta = {**tvd.CIFAR10.meta, "md5": meta}
    return xs[:5 * per].reshape(-1, 3, 32, 32), ys[:5 * per]


def check_pfl_cifar10(dry: bool, tmp: str) -> list[dict[str, Any]]:
    """``pfl_cifar10``: pfl-research's CIFAR-10 benchmark setup
    (``configs/benchmarks/pfl_cifar10.yaml``: 1,000 users x 50 images, 50 a round, one
    epoch of batches of 10 at lr 0.1, ``pfl_cnn``) for 12 rounds on 4 executors at 0.25
    GPU, on CIFAR-10 in torchvision's files with random pixels (nothing downloaded; the
    time does not depend on the pixels): seconds per round (median of rounds 2 on) and
    peak memory. With ``--pfl-python`` (a Python with ``pfl`` installed, e.g.
    ``.venv-pfl/bin/python``), pfl-research on the same images and sizes
    (``benchmarks/pfl_sim.py --cifar-npz``, ``PFL_PYTORCH_DEVICE=cuda``): its seconds per
    round and fedray's ratio to it. A dry run: the config's smoke size, 2 rounds, CPU."""
    import statistics
    import subprocess

    from fedray.core.config import load_config
    from fedray.runtime import Experiment

    users, rounds = (20, 2) if dry else (1000, 12)
    x, y = write_cifar10(os.path.join(tmp, "cifar10"), 50 * users, 100 if dry else 10_000)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "fedray",
                        "configs", "benchmarks", "pfl_cifar10.yaml")
    over = [f"data.root={os.path.join(tmp, 'cifar10')}", f"rounds={rounds}",
            f"eval.every={rounds}", PLACEMENT]
    cfg = load_config(path, over, smoke=True) if dry else load_config(path, over)
    exp = Experiment(cfg, os.path.join(tmp, "pfl-cifar10"))
    seconds = []
    try:
        exp.start()
        while not exp.done:
            t0 = time.perf_counter()
            exp.step()
            seconds.append(time.perf_counter() - t0)
        summary = exp.close()
    finally:
        exp.release()
    ours = statistics.median(seconds[1:] or seconds)
    row = {"check": "pfl_cifar10", "ok": summary["rounds"] == rounds, "users": users,
           "per_round": cfg.clients.sampled_count(), "rounds": rounds,
           "fedray_round_seconds": [round(v, 3) for v in seconds],
           "fedray_s_per_round": round(ours, 3),
           "final_global_accuracy": summary["final_global_accuracy"]}
    pfl = OPTIONS.get("pfl_python")
    if pfl:
        npz = os.path.join(tmp, "cifar10.npz")
        np.savez(npz, x=x.astype(np.float32) / 255, y=y)
        try:
            out = subprocess.run(
                [pfl, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pfl_sim.py"),
                 "--cifar-npz", npz, "--population", str(users), "--clients",
                 str(cfg.clients.sampled_count()), "--rounds", str(rounds)],
                capture_output=True, text=True, timeout=PFL_TIMEOUT_S,
                env={**os.environ, "PFL_PYTORCH_DEVICE": "cpu" if dry else "cuda"})
        except subprocess.TimeoutExpired:
            row.update(ok=False, pfl_error=f"pfl-research ran past {PFL_TIMEOUT_S} s")
            return [row]
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode or not lines:
            row.update(ok=False, pfl_error=(out.stderr.strip().splitlines() or ["?"])[-1])
        else:
            theirs = statistics.median(json.loads(lines[-1])["round_seconds"][1:] or
                                       json.loads(lines[-1])["round_seconds"])
            row.update(pfl_s_per_round=round(theirs, 3),
                       fedray_over_pfl=round(ours / theirs, 3))
    else:
        row["pfl"] = "not run (--pfl-python not given)"
    return [row]


OPTIONS: dict[str, Any] = {}  # main's options the steps read (--pfl-python)
PFL_TIMEOUT_S = 300  # pfl-research's 12 rounds; a hung one must not eat the device time
FLEET_KEYS = ("executors", "tiers", "cpu_reference")  # a fleet row's tables, not its details


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    """GPU_CHECK.md: the environment, one line per row, then each fleet's executors (peak
    memory), tiers (samples/s) and CPU comparison as tables."""
    lines = ["# GPU check", "", "```", json.dumps(env, indent=1), "```", "",
             "| check | ok | details |", "|---|---|---|"]
    for r in rows:
        detail = ", ".join(f"{k}={v}" for k, v in r.items()
                           if k not in ("check", "ok", *FLEET_KEYS))
        lines.append(f"| {r['check']} | {'yes' if r['ok'] else '**NO**'} | {detail} |")
    for r in rows:
        if "executors" not in r:
            continue
        lines += ["", f"## {r['check']}", "",
                  "| executor | device | GPU ids | Ray GPU share | clients | peak GPU MiB | "
                  "peak RSS MiB |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {e['executor']} | {e['device']} | {','.join(e['gpu_ids']) or '–'} | "
                  f"{e['ray_gpu_share']} | {e['clients']} | {e['peak_gpu_mib'] or 'cpu'} | "
                  f"{e['peak_rss_mib']} |" for e in r["executors"]]
        lines += ["", "| tier | num_gpus | capacity | Ray GPU shares | clients | "
                      "samples trained | samples/s |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {t['num_gpus']} | {t['capacity']} | {t['ray_gpu_shares']} | "
                  f"{t['clients']} | {t['samples_trained']} | {t['samples_per_s']} |"
                  for name, t in r["tiers"].items()]
        c = r["cpu_reference"]
        lines += ["", f"Against the CPU run: identical {', '.join(c['equal']) or 'nothing'}"
                      f"{'; DIFFERENT ' + ', '.join(c['different']) if c['different'] else ''}"
                      f"; upload bytes {c['upload_bytes']} vs {c['cpu_upload_bytes']}; "
                      f"round-1 {c['loss']} relative difference {c['round1_loss_rel_diff']} "
                      f"(tolerance {c['loss_tolerance']})."]
    return "\n".join(lines) + "\n"


# the checks, in the order they run: (device, dry run, temporary directory) -> rows
# The open issues' GPU measurements early (favor_cohort: #28, after drod's few seconds, which
# must be the process's first CUDA work; pfl_cifar10: #31), so that a call cut short has them.
LOCAL_STEPS = {
    "drod": lambda device, dry, tmp: [check_drod(device, dry)],  # before anything uses CUDA
    "favor_cohort": lambda device, dry, tmp: check_favor_cohort(device, dry, tmp),
    "favor": lambda device, dry, tmp: check_favor(device, dry, tmp),
    "flite": lambda device, dry, tmp: check_flite(device, dry),
}
RAY_STEPS = {  # on one Ray (connected_ray), after the local ones
    "pfl_cifar10": lambda device, dry, tmp: check_pfl_cifar10(dry, tmp),
    "ray": lambda device, dry, tmp: check_ray(dry, tmp),
    "favor_qlora_fleet": lambda device, dry, tmp: check_favor_fleet(dry, tmp),
    "drod_fleet_gpu": lambda device, dry, tmp: check_drod_fleet(dry, tmp),
    "flite_resnet18": lambda device, dry, tmp: check_flite_fleet(dry, tmp),
}


STEPS = {**LOCAL_STEPS, **RAY_STEPS}


def failed_row(name: str, e: Exception) -> dict[str, Any]:
    return {"check": name, "ok": False, "error": f"{type(e).__name__}: {e}"}


def run_steps(steps: dict, device: str, dry: bool, tmp: str, seconds: dict[str, float],
              rows: list[dict[str, Any]], done: dict[str, list[int]],
              save: Callable[[], None]) -> None:
    """Each step's rows appended to ``rows`` (their indices into ``done[step]``), printed
    as they come, and saved (``save``: a device call cut off at its time limit still brings
    back what finished), its wall time into ``seconds``; a step that raises is one failed
    row (one failed check must not hide the rest)."""
    for name, step in steps.items():
        t0 = time.perf_counter()
        try:
            new = step(device, dry, tmp)
        except Exception as e:  # noqa: BLE001
            new = [failed_row(name, e)]
        seconds[name] = round(time.perf_counter() - t0, 1)
        for r in new:
            print(json.dumps(r), flush=True)
        done[name] = list(range(len(rows), len(rows) + len(new)))
        rows += new
        save()


def carried(state: str | None, env: dict[str, Any]) -> tuple[list[dict], dict, dict]:
    """From ``STATE/gpu_check.json`` of an earlier run in the same mode (device, dry run):
    the rows, row indices and seconds of the steps whose every row passed — a second call
    on the same machine goes on where a cut-off one stopped."""
    path = os.path.join(state, "gpu_check.json") if state else ""
    if not path or not os.path.exists(path):
        return [], {}, {}
    rows: list[dict] = []
    done: dict[str, list[int]] = {}
    seconds: dict[str, float] = {}
    try:
        with open(path) as f:
            old = json.load(f)
        if {k: old["env"].get(k) for k in ("device", "dry_run")} != \
                {k: env[k] for k in ("device", "dry_run")}:
            return [], {}, {}
        for name, idx in old["steps"].items():
            kept = [old["rows"][i] for i in idx]
            if name in STEPS and kept and all(r["ok"] is True for r in kept):
                done[name] = list(range(len(rows), len(rows) + len(kept)))
                rows += kept
                seconds[name] = old["env"]["step_seconds"][name]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        print(f"warning: {path} is not a state this script wrote ({type(e).__name__}: "
              f"{e}); every check runs", file=sys.stderr)
        return [], {}, {}
    return rows, done, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, small shapes, GPUs declared to Ray: checks the script only")
    p.add_argument("--out", default="runs/gpu_check", help="where the results are written")
    p.add_argument("--skip", nargs="*", default=[], choices=list(STEPS),
                   help="checks to leave out")
    p.add_argument("--state", default=None,
                   help="also save the results here after every check; checks that passed "
                        "in an earlier run with this state (same mode) are not run again")
    p.add_argument("--pfl-python", default=None,
                   help="a Python with pfl-research installed: pfl_cifar10 also times pfl "
                        "on the same images (benchmarks/pfl_sim.py --cifar-npz)")
    args = p.parse_args(argv)
    OPTIONS["pfl_python"] = args.pfl_python
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("error: no CUDA device visible to torch; use --dry-run to check the script on "
              "the CPU", file=sys.stderr)
        return 2
    device = "cuda" if cuda and not args.dry_run else "cpu"
    env = {"device": device, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
           "dry_run": args.dry_run, "step_seconds": {}}
    rows, done, env["step_seconds"] = carried(args.state, env)
    env["carried_over"] = sorted(done)
    t0 = time.perf_counter()
    outs = [args.out] + ([args.state] if args.state else [])
    for d in outs:
        os.makedirs(d, exist_ok=True)

    def save() -> None:  # each file whole or not at all (Storage): a kill may come any time
        env["seconds"] = round(time.perf_counter() - t0, 1)
        files = {"gpu_check.json": json.dumps({"env": env, "rows": rows, "steps": done},
                                              indent=1),
                 "GPU_CHECK.md": markdown(rows, env)}
        for d in outs:
            for name, text in files.items():
                Storage(d).write_bytes(name, text.encode())

    skip = set(args.skip) | set(done)
    with tempfile.TemporaryDirectory() as tmp:
        run_steps({k: v for k, v in LOCAL_STEPS.items() if k not in skip}, device,
                  args.dry_run, tmp, env["step_seconds"], rows, done, save)
        ray_steps = {k: v for k, v in RAY_STEPS.items() if k not in skip}
        if ray_steps:
            gc.collect()  # 4-bit models in reference cycles: their memory goes back too
            if device == "cuda":
                torch.cuda.empty_cache()  # the executors get the GPU, not this process's cache
            try:
                with connected_ray(args.dry_run):
                    run_steps(ray_steps, device, args.dry_run, tmp, env["step_seconds"],
                              rows, done, save)
            except Exception as e:  # noqa: BLE001 — Ray did not start: say so in the table
                rows.append(failed_row("ray", e))
    save()
    failed = [r["check"] for r in rows if not r["ok"]]
    print(json.dumps({"ok": not failed, "failed": failed, "out": args.out}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
