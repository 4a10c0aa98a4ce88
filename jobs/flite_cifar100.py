"""FLITE on CIFAR-100 — the paper's main setting, for a GPU cluster.

ResNet-18 with GroupNorm (32 groups) and a frozen orthogonal head is pretrained centrally
(SGD 0.9, lr 0.05, 3-epoch warmup + cosine, wd 5e-4, batch 128, 100 epochs, crop+flip) as
one Ray task on a GPU, then fine-tuned federatedly with FLITE (K = 8 clients, d = 64,
r = 32 → D = 1,280 latents, Adam 1e-2 / wd 1e-4 / clip 1.0, unweighted mean), executors
pinned to fractional GPUs.

    ray job submit --working-dir . -- python jobs/flite_cifar100.py \\
        --data-root /mnt/data/cifar --run-dir s3://bucket/runs/flite-c100

``--smoke`` runs the same path tiny on CPU (digits upsampled to 32×32×3, a narrow ResNet-18,
2 pretraining epochs, 2 rounds, 4 clients) and needs no dataset: what CI runs. Shows the two
stages (pretraining epochs, federated rounds) on stderr and ends with the federated run's
summary and where the files are (``--json``: that summary as one JSON object).
``--gpus-per-executor 0`` runs the real path on CPUs (pretraining then takes one CPU).

Hyperparameters and where they come from (FLITE = Achanta & Reed, "Federated Lightweight
Fine-Tuning"; §4 "Centrally-pretrained base" and "Federated configuration", App. 0.C):

==========================  ===================  ========================================
knob                        here                 source
==========================  ===================  ========================================
model                       ResNet-18, GN 32     §4 (ResNet-18+GroupNorm), App. 0.C (32
                            groups, full width   groups); ``model.groups=32``
pretraining optimizer       SGD m 0.9, lr 0.05,  §4, App. 0.C (``pretrain.*`` defaults)
                            wd 5e-4, batch 128
pretraining schedule        3-epoch linear       §4, App. 0.C ("cosine decay to zero")
                            warmup, cosine → 0
pretraining epochs          100                  §4, App. 0.C
augmentation (pretraining)  crop (pad 4) + flip  App. 0.C "standard crop+flip"
                                                 (``pretrain.augment=true``; the pad of 4
                                                 is the standard recipe, not stated)
classifier head             orthogonal, frozen   §3.5, App. 0.C
K                           8 (``--clients``)    §4 "default K = 8", Table 1
partition                   IID (``--alpha``)    Table 1 (IID); α ∈ {0.5, 0.1} in §4
d, r                        64, 32               §4, App. 0.C (D = 1,280)
client optimizer            Adam 1e-2, wd 1e-4,  §4, App. 0.C (``algorithm.*`` defaults)
                            clip 1.0, z₀ = 0
server                      unweighted mean      Alg. 1, App. 0.C
local epochs E              1                    not stated for CIFAR-100 (E = 1 on
                                                 WikiText-2, 2 on TinyImageNet)
rounds R                    50                   not stated for CIFAR-100 (R = 20 on
                                                 TinyImageNet and WikiText-2): ours
local batch                 64                   not stated (the pretraining batch is
                                                 128): ours
==========================  ===================  ========================================

Measured on CPU (this project's 2-core machine, no GPU, 2026-12-01; other agents' studies
shared the two cores the whole time, load average 8–13, so these are upper-end figures):

    .venv/bin/python benchmarks/flite_cifar100_timing.py --steps 4 --eval-samples 1000 \\
        --rounds 2 --local-steps 2      # -> benchmarks/results/flite_study/cifar100_timing.json

on a full-size CIFAR-100 in torchvision's on-disk format written by
``tests/cifar_fixture.py`` (random pixels; no download here), ResNet-18 with GN 32 at full
width (11,220,132 parameters), 32×32×3, 2 torch threads:

* pretraining: 21.3 s per SGD step of batch 128 with crop+flip (mean of 4 measured steps,
  17.3–28.6 s) and 552 s for the per-epoch evaluation on the 10,000 test images (timed on
  1,000): one epoch = 391 steps + evaluation ≈ 8,900 s ≈ 2.5 h (extrapolated from the 4
  steps), the paper's 100 epochs ≈ 10 days. In the job, pretraining is a Ray task with one
  CPU, so expect it slower still.
* federated round (FLITE d = 64, r = 32, K = 8 on one executor of 2 CPUs, clients one after
  the other): measured 105 s and 77 s for rounds of 2 local steps per client (batch 64;
  evaluation off), i.e. 4.9 s per client step and 4.9 s for the rest of the round
  (broadcast, aggregation, identity check); a full round of one local epoch (8 × ⌈5,000/64⌉
  = 632 steps) ≈ 3,100 s, plus the job's per-round evaluation of the global model on the
  test set and on the clients' test splits (2 × 552 s) ≈ 4,200 s ≈ 70 min per round
  (extrapolated). The first round took 28 s longer than the second (warm-up).

So the paper's setting is a GPU job; on this CPU only ``--smoke`` and timing runs are
practical.
"""

from __future__ import annotations

import argparse

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity


def build_parser() -> argparse.ArgumentParser:
    p = JobParser(description=__doc__)
    p.add_argument("--data-root", help="directory holding torchvision's cifar-100-python")
    p.add_argument("--download", action="store_true", help="let torchvision download it")
    p.add_argument("--run-dir", default="runs/flite-cifar100", help="path or pyarrow.fs URI")
    p.add_argument("--pretrain-epochs", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clients", type=int, default=8, help="K")
    p.add_argument("--alpha", type=float, default=None, help="Dirichlet α (default IID)")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--r", type=int, default=32)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--codec", default="fp32", choices=["fp32", "int8", "int4"])
    p.add_argument("--gpus-per-executor", type=float, default=0.5,
                   help="0: run on CPUs only (executors and the pretraining task)")
    p.add_argument("--executors", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the same path")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override (repeatable)")
    add_output_args(p)
    return p


def main(argv: list[str] | None = None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    set_verbosity(args.verbose)

    import ray

    from fedray.core.config import load_config
    from fedray.front.cli import summary_text
    from fedray.models.pretrain import pretrain
    from fedray.observe.progress import Progress
    from fedray.runtime import init_ray, resumable, run_experiment

    common, gpus = stage_overrides(args, p)
    base_dir = f"{args.run_dir}/base"
    pcfg = load_config(None, common + args.set)
    init_ray(pcfg)
    from fedray.core.storage import Storage

    progress = Progress(2, enabled=not args.no_progress)
    with progress.stage("pretrain base", pcfg.pretrain.epochs, "epochs") as stage:
        if not Storage(base_dir).exists("base.npz"):
            resume = Storage(base_dir).exists("checkpoints/LATEST")
            task = ray.remote(num_gpus=gpus, num_cpus=1)(pretrain)
            ray.get(task.remote(pcfg, base_dir, resume=resume, progress=False,
                                on_epoch=epoch_reporter(stage.relay(), pcfg.pretrain.epochs)))
        stage.report(pcfg.pretrain.epochs)
    cfg = load_config(None, common + federated_overrides(args, base_dir) + args.set)
    fl_dir = f"{args.run_dir}/federated"
    resume = resumable(fl_dir, cfg)  # the same run continues; another is refused
    summary = run_experiment(cfg, fl_dir, resume=resume, progress=progress)
    emit(summary, args.json, summary_text(summary) + f"\npretrained base: {base_dir}")
    return summary


def stage_overrides(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None
                    ) -> tuple[list[str], float]:
    """The overrides both stages share (data, model, sizes, partition, pretraining recipe)
    and the GPUs of the pretraining task."""
    model_common = ["model.groups=32", "pretrain.augment=true"]  # App. 0.C
    if args.smoke:
        data = ["data.dataset=digits", "data.image_size=32", "data.channels=3"]
        model = ["model.name=resnet18", "model.width=8"]
        sizes = ["pretrain.epochs=2", "pretrain.batch_size=64", "pretrain.warmup_epochs=1",
                 "rounds=2", "clients.num_clients=4", "local.batch_size=32",
                 "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]
        gpus = 0.0
    else:
        if not args.data_root:
            if parser is None:
                raise ValueError("--data-root is required (or --smoke)")
            parser.error("--data-root is required (or --smoke)")
        data = ["data.dataset=cifar100", f"data.root={args.data_root}",
                f"data.download={str(args.download).lower()}"]
        model = ["model.name=resnet18"]
        gpu = f", num_gpus: {args.gpus_per_executor}" if args.gpus_per_executor > 0 else ""
        sizes = [f"pretrain.epochs={args.pretrain_epochs}", f"rounds={args.rounds}",
                 f"clients.num_clients={args.clients}", "local.batch_size=64",
                 f"runtime.tiers=[{{name: gpu, executors: {args.executors}, num_cpus: 2"
                 f"{gpu}}}]"]
        gpus = 1.0 if args.gpus_per_executor > 0 else 0.0
    part = ["data.partition=iid"] if args.alpha is None else [
        "data.partition=dirichlet", f"data.alpha={args.alpha}"]
    common = data + model + model_common + sizes + part + [f"seed={args.seed}",
                                                           "name=flite-cifar100"]
    return common, gpus


def federated_overrides(args: argparse.Namespace, base_dir: str) -> list[str]:
    """The federated stage's own overrides: FLITE on the pretrained base, scored on the
    global test set as the paper reports (the base was pretrained on the whole train split,
    so the clients' local test splits hold nothing it has not seen)."""
    return ["algorithm.name=flite", f"algorithm.base={base_dir}", f"algorithm.d={args.d}",
            f"algorithm.r={args.r}", f"payload.upload={args.codec}",
            f"local.epochs={args.local_epochs}", "eval.clients=none"]


def epoch_reporter(report, epochs: int):
    """pretrain's ``on_epoch(history row)`` as a stage's ``(done, total)`` callback."""
    return lambda row: report(row["epoch"], epochs)


if __name__ == "__main__":
    raise SystemExit(guarded(main))
