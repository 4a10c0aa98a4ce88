"""The CUDA paths of fedray in one short run: what a GPU machine must show before a cluster
is trusted with FAVoR on fractional GPUs.

Checks (each one JSON line on stdout; all of them in OUT/gpu_check.json and GPU_CHECK.md):

- ``favor_bf16``: a FAVoR client round (shared stage, private stage with ASCE alignment) on a
  tiny Qwen2 saved in bf16 — 4-bit NF4 with bf16 compute on CUDA (the alignment head used to
  fail on bf16 hidden states).
- ``favor_memory``: the same round on Qwen2.5-3B's layer shape (hidden 2,048, MLP 11,008,
  16/2 heads) with the real 151,936-token vocabulary at 4 x 256 tokens, for 2 and 4 decoder
  layers: ``torch.cuda.max_memory_allocated`` per executor and the linear estimate for
  Qwen2.5-0.5B/1.5B/3B depth (24/28/36 layers, same width for 3B; 0.5B/1.5B widths measured
  the same way).
- ``flite_bf16``: FLITE stored and regenerated, ``local.bf16`` autocast, training steps
  (the regenerated backward used to fail) and the two modes' gradients compared.
- ``drod_deterministic``: a DROD client update twice in the deterministic GPU mode,
  uploads compared bitwise.
- ``ray_tiers``: an experiment on local Ray with 4 executors x 0.25 GPU: each executor's
  device, granted GPU ids and CUDA_VISIBLE_DEVICES; plus one executor that takes no GPU.
- ``fatal_error``: a client that triggers a device-side assert; its executor must exit, be
  replaced and the round finish with every client accepted.

``--dry-run`` runs the same code on the CPU with small shapes (and GPUs declared to Ray), as
the test suite does: it proves the script, not the GPU.

    bash benchmarks/gpu_check.sh --out runs/gpu_check           # on a GPU machine
    bash benchmarks/gpu_check.sh --dry-run --out /tmp/gpu_check # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedray.methods.fedavg.method import FedAvg  # noqa: E402

QWEN_SHAPES = {  # hidden, MLP, heads, KV heads, layers (the shipped Qwen2.5 configs)
    "qwen2.5-0.5b": (896, 4864, 14, 2, 24),
    "qwen2.5-1.5b": (1536, 8960, 12, 2, 28),
    "qwen2.5-3b": (2048, 11008, 16, 2, 36),
}
VOCAB = 151_936


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


def check_flite(device: str, dry: bool) -> list[dict[str, Any]]:
    from fedray.methods.flite import LatentMapping
    from fedray.models import build_model
    from fedray.training import train_local

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
    from fedray.config import load_config
    from fedray.data import build_data
    from fedray.methods.base import ClientContext
    from fedray.registry import build_method
    from fedray.runtime.devices import configure_process

    configure_process(device, deterministic=True)  # what an executor does with the flag
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


def check_ray(dry: bool, tmp: str) -> list[dict[str, Any]]:
    from fedray.config import load_config
    from fedray.runtime import Experiment, init_ray, run_experiment

    base = ["clients.num_clients=8", "rounds=2", "model.hidden=[32]", "local.batch_size=16",
            "runtime.placement_timeout_s=600"]
    tiers = ("runtime.tiers=[{name: gpu, executors: 4, num_cpus: 0.25, num_gpus: 0.25},"
             " {name: cpu, executors: 1, num_cpus: 0.25}]")
    cfg = load_config(None, base + [tiers])
    if dry and not os.environ.get("RAY_ADDRESS"):  # a CPU machine: declare one GPU to Ray
        import ray

        ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
        started = True
    else:
        started = init_ray(cfg)
    rows = []
    try:
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
                         "ok": e["device"] == want and bool(e["gpu_ids"]) == gpu
                         and (e["cuda_visible_devices"] != "") == gpu})
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
    finally:
        if started:
            import ray

            ray.shutdown()
    return rows


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = ["# GPU check", "", "```", json.dumps(env, indent=1), "```", "",
             "| check | ok | details |", "|---|---|---|"]
    for r in rows:
        detail = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("check", "ok"))
        lines.append(f"| {r['check']} | {'yes' if r['ok'] else '**NO**'} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, small shapes, GPUs declared to Ray: checks the script only")
    p.add_argument("--out", default="runs/gpu_check", help="where the results are written")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["favor", "flite", "drod", "ray"], help="checks to leave out")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("error: no CUDA device visible to torch; use --dry-run to check the script on "
              "the CPU", file=sys.stderr)
        return 2
    device = "cuda" if cuda and not args.dry_run else "cpu"
    env = {"device": device, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
           "dry_run": args.dry_run}
    rows: list[dict[str, Any]] = []
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        steps = [("favor", lambda: check_favor(device, args.dry_run, tmp)),
                 ("flite", lambda: check_flite(device, args.dry_run)),
                 ("drod", lambda: [check_drod(device, args.dry_run)]),
                 ("ray", lambda: check_ray(args.dry_run, tmp))]
        for name, step in steps:
            if name in args.skip:
                continue
            try:
                new = step()
            except Exception as e:  # noqa: BLE001 — one failed check must not hide the rest
                new = [{"check": name, "ok": False, "error": f"{type(e).__name__}: {e}"}]
            for r in new:
                print(json.dumps(r), flush=True)
            rows += new
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "GPU_CHECK.md"), "w") as f:
        f.write(markdown(rows, env))
    failed = [r["check"] for r in rows if not r["ok"]]
    print(json.dumps({"ok": not failed, "failed": failed, "out": args.out}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
