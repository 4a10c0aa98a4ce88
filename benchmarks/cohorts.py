"""Where batching clients pays: one round's local SGD, one process, one thread — clients one
after another (:func:`fedray.models.training.train_local`) against the same clients as
vectorized cohorts (:func:`fedray.models.cohort.train_cohort`), on the workloads issue #28
names. The per-workload ratio is what ``runtime.vectorize=auto``'s rule
(:data:`fedray.methods.base.AUTO_WORK`: trainable parameters × batch size) is set from.

Workloads (synthetic data in each model's input shape; every client's data drawn from its
own generator, as fedray's populations do):

* ``scale``: MLP 32-32-10, 1,000 clients × 16 samples, batch 32 (``benchmarks/scale.py``);
* ``sim_overhead``: MLP 784-256-10, 100 clients × 256 samples, batch 32
  (``benchmarks/sim_overhead.py``);
* ``mlp62``: MLP 784-64-62, 100 clients × 200 samples, batch 32;
* ``femnist``: FEMNIST-shaped — 28×28×1 inputs, 62 classes, fedray's ``cnn`` with two conv
  layers (32, 64 channels; 3×3 kernels where LEAF's are 5×5) and a 2048-unit hidden layer,
  100 clients of 100–300 samples, batch 10.

* ``favor``: FAVoR's client rounds (shared stage, private stage with alignment) of 12
  authors on the embedded default's LM shape (Qwen2, hidden 128, 3 layers, vocabulary
  2,048; LoRA r 16 on all seven projections, dropout 0.05), 16 blocks of 64 tokens each,
  micro-batch 4 × accumulation 2 — one author after another
  (:func:`fedray.methods.favor.train.client_round`) against one cohort through the one
  base (:func:`fedray.methods.favor.cohort.client_rounds`). Each side runs in a fresh
  process whose peak RSS is reported (one executor holding the base once, whatever the
  number of authors).

* ``flite`` / ``flite_regen``: FLITE's local Adam on the latents in the FLITE digits study's
  setting (``benchmarks/flite_study.py``): the width-8 GroupNorm ResNet-18 on 8×8×1 inputs,
  10 classes, frozen orthogonal head, all 20 conv weights mapped at d = 64, r = 32 (factors
  stored, or regenerated from the seed on every pass), Adam lr 1e-2, weight decay 1e-4,
  clip 1.0, batch 16, ``--flite-clients`` clients (default 8) of 100–185 samples — one
  after another as :meth:`Flite.client_update <fedray.methods.flite.method.Flite.
  client_update>` trains them against one cohort of all of them
  (:func:`fedray.methods.flite.cohort.train_latents`); ``--flite-net``, ``--flite-width``
  and ``--flite-input`` pick another network (the other points of FLITE's ``auto`` rule,
  :meth:`Flite.cohort_fit <fedray.methods.flite.method.Flite.cohort_fit>`). Each side
  runs in a fresh process whose peak RSS and CPU seconds are reported too (on a CPU shared
  with other work, CPU seconds are the steadier measure); the difference is ‖zv − zs‖ /
  ‖zs‖ of the trained latents (worst and median). Random labels on a random network are
  chaotic here too: a latent component whose gradient hovers at 0 takes Adam's ±lr step
  either way, and a 1e-8 perturbation of z̄ moves one client's sequential latent itself
  by 1e-2 relative.

* ``drod``: DROD's clients (dual-axis Ordered Dropout, three tiers ρ = 1 / 0.251 / 0.064) in
  the DROD digits study's setting (``benchmarks/drod_study.py``: the width-16 GroupNorm
  ResNet-18 on 16×16×1 digits, batch 32, lr 0.1, one epoch; ``--drod-clients`` clients
  (default 48), one cohort per tier) — :meth:`Hetero.client_update
  <fedray.methods.drod.method.Hetero.client_update>` client after client against one
  :meth:`~fedray.methods.drod.method.Hetero.cohort_update` per tier, each side in a fresh
  process; the difference is the worst ‖Δv − Δs‖ / ‖Δs‖ over the uploads.

For each: seconds for the round both ways (median of ``--repeats``, after one warm-up
cohort: the first ``vmap`` call of a process imports ``torch._dynamo``, ≈ 2 s), their
ratio, the rule's ``work`` and the worst relative difference of a client's delta
(‖Δv − Δs‖ / ‖Δs‖). Where local training is chaotic — the ``femnist`` workload trains on
random labels, and a 1e-7 relative perturbation of its start moves the sequential deltas
themselves by up to 9% — the two paths differ by what float rounding amplifies to.

    .venv/bin/python benchmarks/cohorts.py [--workloads scale femnist] [--cohort-size 256]
    .venv/bin/python benchmarks/cohorts.py --workloads flite flite_regen [--flite-clients 16]
        [--flite-net resnet18 --flite-width 8 --flite-input 3 32 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from fedray.methods.base import AUTO_WORK
from fedray.methods.flite.cohort import AUTO_SHARE
from fedray.methods.flite.factors import mapped_layers
from fedray.models import build_model
from fedray.models.cohort import forward_macs, train_cohort
from fedray.models.training import get_state, set_state, train_local

WORKLOADS: dict[str, dict] = {
    "scale": dict(model="mlp", shape=(32,), classes=10, kwargs={"hidden": [32]}, clients=1000,
                  samples=(16, 16), batch=32),
    "sim_overhead": dict(model="mlp", shape=(784,), classes=10, kwargs={"hidden": [256]},
                         clients=100, samples=(256, 256), batch=32),
    "mlp62": dict(model="mlp", shape=(784,), classes=62, kwargs={"hidden": [64]},
                  clients=100, samples=(200, 200), batch=32),
    "femnist": dict(model="cnn", shape=(1, 28, 28), classes=62,
                    kwargs={"channels": [32, 64], "hidden": 2048}, clients=100,
                    samples=(100, 300), batch=10),
}


def data_of(w: dict, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    sizes = np.random.default_rng(seed).integers(w["samples"][0], w["samples"][1] + 1,
                                                 w["clients"])
    out = []
    for c, n in enumerate(sizes):
        g = np.random.default_rng([seed, c])
        out.append((g.standard_normal((int(n), *w["shape"]), dtype=np.float32),
                    g.integers(0, w["classes"], int(n)).astype(np.int64)))
    return out


def measure(name: str, cohort: int, repeats: int) -> dict:
    w = WORKLOADS[name]
    torch.manual_seed(0)
    model = build_model(w["model"], w["shape"], w["classes"], **w["kwargs"])
    data = data_of(w)
    start = get_state(model)
    kw = dict(epochs=1, batch_size=w["batch"], lr=0.05, seed=0, round=1)
    names = [n for n, _ in model.named_parameters()]
    train_cohort(model, data[:2], [0, 1], **kw)  # the first vmap imports torch._dynamo
    seq_t, vec_t = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        seq = []
        for c, (x, y) in enumerate(data):
            set_state(model, start)
            train_local(model, x, y, client=c, **kw)
            seq.append(get_state(model))
        seq_t.append(time.perf_counter() - t)
        set_state(model, start)
        t = time.perf_counter()
        vec = []
        for first in range(0, len(data), cohort):
            part = data[first:first + cohort]
            vec += train_cohort(model, part, list(range(first, first + len(part))), **kw)
        vec_t.append(time.perf_counter() - t)
    worst = 0.0
    for s, v in zip(seq, vec, strict=True):
        ds = np.concatenate([(s[n] - start[n]).ravel() for n in names])
        dv = np.concatenate([(v.params[n] - start[n]).ravel() for n in names])
        worst = max(worst, float(np.linalg.norm(dv - ds) / np.linalg.norm(ds)))
    params = sum(p.numel() for p in model.parameters())
    s, v = statistics.median(seq_t), statistics.median(vec_t)
    return {"workload": name, "clients": w["clients"], "params": params,
            "work": params * w["batch"], "auto": params * w["batch"] <= AUTO_WORK,
            "sequential_s": s, "vectorized_s": v, "ratio": v / s, "worst_rel_delta": worst}


def favor_side(mode: str, authors: int = 12, repeats: int = 3) -> dict:
    """One side of the ``favor`` workload in this process: median seconds and the uploads."""
    import resource

    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor import cohort
    from fedray.methods.favor.adapter import LoraSpec
    from fedray.methods.favor.lm import with_lora
    from fedray.methods.favor.train import StageConfig, adapter_of, client_round

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=2048, hidden_size=128, intermediate_size=352,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    model = with_lora(AutoModelForCausalLM.from_config(cfg), LoraSpec()).eval()
    server = adapter_of(model)
    g = torch.Generator().manual_seed(1)
    group = [cohort.Author(c, torch.randint(0, 2048, (16, 64), generator=g),
                           torch.nn.functional.normalize(torch.randn(256, generator=g), dim=0))
             for c in range(authors)]
    stage = StageConfig(epochs=1, micro_batch=4, accumulation=2, lr=2e-3)
    times, uploads = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        if mode == "sequential":
            uploads = [client_round(model, server, a.ids, a.ids, a.target, stage, stage, 0.01,
                                    0.3, seed=0, round=1, client=a.client, proj_hidden=64)[0]
                       for a in group]
        else:
            uploads = [u for u, _, _ in cohort.client_rounds(
                model, server, group, stage, stage, 0.01, 0.3, seed=0, round=1,
                proj_hidden=64)]
        times.append(time.perf_counter() - t)
    flat = [torch.cat([u[k].flatten() for k in sorted(u)]).tolist() for u in uploads]
    return {"seconds": statistics.median(times), "uploads": flat,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_favor(threads: int) -> dict:
    """Both sides of ``favor``, each in a fresh process (its own peak RSS)."""
    import subprocess
    import sys

    side = {}
    for mode in ("sequential", "batched"):
        out = subprocess.run([sys.executable, __file__, "--favor-side", mode, "--threads",
                              str(threads)], capture_output=True, text=True, check=True)
        side[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    worst = max(float(np.linalg.norm(np.subtract(b, a)) / np.linalg.norm(a))
                for a, b in zip(side["sequential"]["uploads"], side["batched"]["uploads"],
                                strict=True))
    s, v = side["sequential"]["seconds"], side["batched"]["seconds"]
    return {"workload": "favor", "clients": 12, "sequential_s": s, "vectorized_s": v,
            "ratio": v / s, "worst_rel_delta": worst,
            "sequential_peak_rss_mb": side["sequential"]["peak_rss_mb"],
            "vectorized_peak_rss_mb": side["batched"]["peak_rss_mb"]}


SIDES = ("sequential", "vectorized")


def flite_workload(clients: int = 8, net: str = "resnet18", width: int = 8,
                   shape: tuple[int, ...] = (1, 8, 8)) -> dict:
    """The ``flite`` workloads' setting (default: the FLITE digits study's); ``net`` is
    ``resnet18`` (``width``) or ``cnn`` (channels ``width``, 2 ``width``; hidden 32)."""
    kwargs = {"width": width} if net == "resnet18" else {"channels": [width, 2 * width],
                                                         "hidden": 32}
    return dict(model=net, width=width, shape=tuple(shape), classes=10, kwargs=kwargs,
                clients=clients, samples=(100, 185), batch=16, d=64, r=32)


def flite_side(mode: str, factors: str, w: dict, repeats: int = 3) -> dict:
    """One side of ``flite`` in this process: median seconds (wall and process CPU) of the
    round's local training, the trained latents and the process's peak RSS."""
    import resource

    from fedray.methods.flite.cohort import train_latents
    from fedray.methods.flite.mapping import LatentMapping
    from fedray.models.heads import configure_head
    from fedray.models.training import Adam

    torch.manual_seed(0)
    model = configure_head(build_model(w["model"], w["shape"], w["classes"], **w["kwargs"]),
                           "orthogonal", 0)
    mapping = LatentMapping(model, d=w["d"], r=w["r"], seed=0, mode=factors)
    data = data_of(w)
    z0 = np.zeros(mapping.D, np.float32)
    kw = dict(epochs=1, batch_size=w["batch"], lr=1e-2, seed=0, round=1)

    def sequential(part):
        out = []
        for c, (x, y) in enumerate(part):
            mapping.set_latent_vector(z0)
            opt = Adam(mapping.latent_parameters(), lr=1e-2, weight_decay=1e-4, clip=1.0)
            train_local(mapping, x, y, client=c, optimizer=opt, **kw)
            out.append(mapping.latent_vector().numpy().copy())
        return out

    def vectorized(part):
        return [z for z, _ in train_latents(mapping, z0, part, list(range(len(part))),
                                            weight_decay=1e-4, clip=1.0, **kw)]

    run = sequential if mode == "sequential" else vectorized
    run(data[:2])  # warm-up (the first vmap imports torch._dynamo)
    times, cpu, latents = [], [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        latents = run(data)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu),
            "latents": [z.tolist() for z in latents],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_flite(factors: str, w: dict, threads: int, repeats: int) -> dict:
    """Both sides of ``flite`` (``factors``: stored or regenerated) on workload ``w``, each
    in a fresh process (its own peak RSS)."""
    import subprocess
    import sys

    side = {}
    for mode in SIDES:
        out = subprocess.run([sys.executable, __file__, "--flite-side", mode, "--flite-factors",
                              factors, "--flite-clients", str(w["clients"]), "--flite-net",
                              w["model"], "--flite-width", str(w["width"]),
                              "--flite-input", *map(str, w["shape"]), "--threads",
                              str(threads), "--repeats", str(repeats)],
                             capture_output=True, text=True, check=True)
        side[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    rels = [float(np.linalg.norm(np.subtract(b, a)) / np.linalg.norm(a))
            for a, b in zip(side["sequential"]["latents"], side["vectorized"]["latents"],
                            strict=True)]
    s, v = side["sequential"]["seconds"], side["vectorized"]["seconds"]
    name = "flite" if factors == "stored" else "flite_regen"
    model = build_model(w["model"], w["shape"], w["classes"], **w["kwargs"])
    sizes = dict(model.named_parameters())
    network = 3 * w["batch"] * forward_macs(model, w["shape"])
    products = 2 * w["r"] * sum(sizes[n].numel() for n in mapped_layers(model))
    return {"workload": name, "clients": w["clients"], "params": products // (2 * w["r"]),
            "work": network + products, "auto": products >= AUTO_SHARE * network,
            "share": products / network, "sequential_s": s, "vectorized_s": v,
            "ratio": v / s, "worst_rel_delta": max(rels),
            "sequential_cpu_s": side["sequential"]["cpu_seconds"],
            "vectorized_cpu_s": side["vectorized"]["cpu_seconds"],
            "median_rel_delta": statistics.median(rels),
            "sequential_peak_rss_mb": side["sequential"]["peak_rss_mb"],
            "vectorized_peak_rss_mb": side["vectorized"]["peak_rss_mb"]}


def drod_workload(clients: int = 48) -> dict:
    """The ``drod`` workload's config (the DROD study's setting) as overrides."""
    tiers = ("[{name: t100, executors: 1, num_cpus: 0.5, capacity: 1.0},"
             " {name: t025, executors: 1, num_cpus: 0.5, capacity: 0.251},"
             " {name: t006, executors: 1, num_cpus: 0.5, capacity: 0.064}]")
    return {"algorithm.name": "drod", "model.name": "sliceable_resnet18", "model.width": 16,
            "data.dataset": "digits", "data.image_size": 16, "data.alpha": 0.5,
            "clients.num_clients": clients, "local.epochs": 1, "local.batch_size": 32,
            "local.lr": 0.1, "runtime.tiers": tiers}


def drod_side(mode: str, clients: int, repeats: int = 3) -> dict:
    """One side of ``drod`` in this process: median seconds (wall and process CPU) of one
    round's local training of every client, tier by tier, the uploads and the peak RSS."""
    import resource

    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.methods.base import ClientContext

    cfg = load_config(None, [f"{k}={v}" for k, v in drod_workload(clients).items()])
    alg = build_method(cfg)
    data = alg.build_data(cfg)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    pol, g = alg.make_policy(), alg.init_global_state(res, cfg.seed)
    tiers = {t.name: [c for c in range(clients) if cfg.tier_of(c) == t.name]
             for t in cfg.runtime.tiers}

    def ctx(c: int) -> ClientContext:
        return ClientContext(c, 1, cfg.seed, cfg.tier_of(c), *data.client_arrays(c, 1),
                             *data.client_arrays(c, 1, "test"), res, "cpu")

    def run(part: dict) -> list:
        out = []
        for tier, members in part.items():
            sent = pol.broadcast(g, 1, tier)
            out += ([alg.client_update(ctx(c), sent) for c in members]
                    if mode == "sequential" else alg.cohort_update([ctx(c) for c in members],
                                                                    sent))
        return out

    run({t: m[:2] for t, m in tiers.items()})  # warm-up (the first vmap imports dynamo)
    times, cpu, outs = [], [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        outs = run(tiers)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu),
            "deltas": [np.concatenate([np.ravel(v) for v in o.upload.values()]).tolist()
                       for o in outs],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_drod(clients: int, threads: int, repeats: int) -> dict:
    """Both sides of ``drod``, each in a fresh process (its own peak RSS)."""
    import subprocess
    import sys

    side = {}
    for mode in SIDES:
        out = subprocess.run([sys.executable, __file__, "--drod-side", mode, "--drod-clients",
                              str(clients), "--threads", str(threads), "--repeats",
                              str(repeats)], capture_output=True, text=True, check=True)
        side[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    rels = [float(np.linalg.norm(np.subtract(b, a)) / np.linalg.norm(a))
            for a, b in zip(side["sequential"]["deltas"], side["vectorized"]["deltas"],
                            strict=True)]
    s, v = side["sequential"]["seconds"], side["vectorized"]["seconds"]
    return {"workload": "drod", "clients": clients, "sequential_s": s, "vectorized_s": v,
            "ratio": v / s, "worst_rel_delta": max(rels),
            "median_rel_delta": statistics.median(rels),
            "sequential_cpu_s": side["sequential"]["cpu_seconds"],
            "vectorized_cpu_s": side["vectorized"]["cpu_seconds"],
            "sequential_peak_rss_mb": side["sequential"]["peak_rss_mb"],
            "vectorized_peak_rss_mb": side["vectorized"]["peak_rss_mb"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    extra = ["favor", "flite", "flite_regen", "drod"]
    p.add_argument("--workloads", nargs="+", default=[*WORKLOADS, *extra],
                   choices=[*WORKLOADS, *extra])
    p.add_argument("--cohort-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--flite-clients", type=int, default=8,
                   help="clients of the flite workloads (one cohort)")
    p.add_argument("--flite-net", choices=["resnet18", "cnn"], default="resnet18",
                   help="the flite workloads' network (default: the study's ResNet-18)")
    p.add_argument("--flite-width", type=int, default=8, help="its width (cnn: channels)")
    p.add_argument("--flite-input", type=int, nargs=3, default=[1, 8, 8],
                   metavar=("C", "H", "W"), help="its input shape (default digits' 1 8 8)")
    p.add_argument("--drod-clients", type=int, default=48,
                   help="clients of the drod workload (one cohort per tier)")
    p.add_argument("--favor-side", choices=["sequential", "batched"], help=argparse.SUPPRESS)
    p.add_argument("--drod-side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--flite-side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--flite-factors", choices=["stored", "regenerated"], default="stored",
                   help=argparse.SUPPRESS)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.favor_side:
        print(json.dumps(favor_side(a.favor_side)))
        return
    if a.drod_side:
        print(json.dumps(drod_side(a.drod_side, a.drod_clients, a.repeats)))
        return
    w = flite_workload(a.flite_clients, a.flite_net, a.flite_width, a.flite_input)
    if a.flite_side:
        print(json.dumps(flite_side(a.flite_side, a.flite_factors, w, a.repeats)))
        return
    factors = {"flite": "stored", "flite_regen": "regenerated"}
    rows = [measure_favor(a.threads) if n == "favor"
            else measure_drod(a.drod_clients, a.threads, a.repeats) if n == "drod"
            else measure_flite(factors[n], w, a.threads, a.repeats)
            if n in factors else measure(n, a.cohort_size, a.repeats) for n in a.workloads]
    print("| workload | clients | params | work (params × batch) | auto | sequential s | "
          "vectorized s | vectorized / sequential | worst ‖Δv−Δs‖/‖Δs‖ |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if r["workload"] == "favor":
            print(f"| favor | 12 authors | LoRA | – | on | {r['sequential_s']:.3f} | "
                  f"{r['vectorized_s']:.3f} | {r['ratio']:.2f}× | "
                  f"{r['worst_rel_delta']:.1e} |")
            print(f"\nfavor peak RSS of the one process: sequential "
                  f"{r['sequential_peak_rss_mb']:.0f} MB, batched "
                  f"{r['vectorized_peak_rss_mb']:.0f} MB")
            continue
        if r["workload"] == "drod":
            print(f"| drod | {r['clients']} (3 tiers) | sliceable ResNet-18 w16 | – | off | "
                  f"{r['sequential_s']:.3f} | {r['vectorized_s']:.3f} | {r['ratio']:.2f}× | "
                  f"{r['worst_rel_delta']:.1e} |")
            print(f"\ndrod peak RSS of the one process: sequential "
                  f"{r['sequential_peak_rss_mb']:.0f} MB, vectorized "
                  f"{r['vectorized_peak_rss_mb']:.0f} MB; process CPU seconds: sequential "
                  f"{r['sequential_cpu_s']:.3f}, vectorized {r['vectorized_cpu_s']:.3f} "
                  f"({r['vectorized_cpu_s'] / r['sequential_cpu_s']:.2f}×); median "
                  f"‖Δv−Δs‖/‖Δs‖ {r['median_rel_delta']:.1e}\n")
            continue
        if r["workload"].startswith("flite"):
            print(f"| {r['workload']} | {r['clients']} | {r['params']:,} mapped | "
                  f"{r['work']:,} | {'on' if r['auto'] else 'off'} (factor share "
                  f"{r['share']:.2f}) | {r['sequential_s']:.3f} | {r['vectorized_s']:.3f} | "
                  f"{r['ratio']:.2f}× | {r['worst_rel_delta']:.1e} |")
            print(f"\n{r['workload']} peak RSS of the one process: sequential "
                  f"{r['sequential_peak_rss_mb']:.0f} MB, vectorized "
                  f"{r['vectorized_peak_rss_mb']:.0f} MB; process CPU seconds (what a CPU "
                  f"shared with other work does not inflate): sequential "
                  f"{r['sequential_cpu_s']:.3f}, vectorized {r['vectorized_cpu_s']:.3f} "
                  f"({r['vectorized_cpu_s'] / r['sequential_cpu_s']:.2f}×); median "
                  f"‖zv−zs‖/‖zs‖ {r['median_rel_delta']:.1e}\n")
            continue
        print(f"| {r['workload']} | {r['clients']} | {r['params']:,} | {r['work']:,} | "
              f"{'on' if r['auto'] else 'off'} | {r['sequential_s']:.3f} | "
              f"{r['vectorized_s']:.3f} | {r['ratio']:.2f}× | {r['worst_rel_delta']:.1e} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
