"""FLITE generator memory: stored vs seed-regenerated factors (paper §3.4, Appendix 0.D).

For ResNet-18/GN with CIFAR-100 shapes (100 classes, 20 mapped conv weights, d = 64, r = 32,
D = 1280) each mode runs in a fresh subprocess, which builds the model and a batch, then
builds the :class:`~fedray.methods.flite.LatentMapping` and runs one forward + backward.
Reported per mode: the factor bytes the mapping holds, the process's peak RSS
(``ru_maxrss``) minus its RSS just before the mapping was built, and the build and
forward+backward times. A third child, ``plain``, runs forward + backward of the model
itself (all weights trainable) as the reference for what the activations and weight
gradients alone cost. Prints one JSON object.

.venv/bin/python benchmarks/flite_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MODES = ("plain", "stored", "regenerated")


def current_rss() -> int:
    """Resident bytes now (Linux /proc; the rest of the report needs Linux's ru_maxrss too)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """Peak resident bytes of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(mode: str, batch: int, d: int, r: int, seed: int) -> dict:
    import torch

    from fedray.core.seeding import derive_seed, torch_generator
    from fedray.methods.flite import LatentMapping
    from fedray.models import build_model

    with torch.random.fork_rng(devices=[]):  # the same model in every child
        torch.manual_seed(derive_seed(seed, -1, -1, "model-init"))
        model = build_model("resnet18", (3, 32, 32), 100)
    gen = torch_generator(seed, purpose="flite-memory-input")
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 100, (batch,), generator=gen)
    rss_before, peak_before = current_rss(), peak_rss()

    t0 = time.perf_counter()
    net = model if mode == "plain" else LatentMapping(model, d=d, r=r, seed=seed, mode=mode)
    t1 = time.perf_counter()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    t2 = time.perf_counter()

    out = {"mode": mode, "rss_before_bytes": rss_before, "peak_rss_before_bytes": peak_before,
           "peak_rss_after_bytes": peak_rss(),
           "peak_rss_increase_bytes": peak_rss() - rss_before,
           "build_s": round(t1 - t0, 3), "forward_backward_s": round(t2 - t1, 3)}
    if mode != "plain":
        out.update(factor_bytes=net.factor_bytes(), D=net.D,
                   mapped_parameters=net.num_mapped_parameters,
                   grad_norm=float(torch.cat([p.grad for p in net.latent_parameters()]).norm()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.d, args.r, args.seed)))
        return
    results = {"model": "resnet18", "input_shape": [3, 32, 32], "classes": 100,
               "batch": args.batch, "d": args.d, "r": args.r, "modes": {}}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode, "--batch", str(args.batch),
               "--d", str(args.d), "--r", str(args.r), "--seed", str(args.seed)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results["modes"][mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
