"""FLITE on CIFAR-100 — the paper's main setting, for a GPU cluster.

ResNet-18 with GroupNorm and a frozen orthogonal head is pretrained centrally (SGD 0.9,
lr 0.05, 3-epoch warmup + cosine, wd 5e-4, batch 128, 100 epochs) as one Ray task on a GPU,
then fine-tuned federatedly with FLITE (K = 8 clients, d = 64, r = 32 → D = 1,280 latents,
Adam 1e-2 / wd 1e-4 / clip 1.0, unweighted mean), executors pinned to fractional GPUs.

    ray job submit --working-dir . -- python jobs/flite_cifar100.py \\
        --data-root /mnt/data/cifar --run-dir s3://bucket/runs/flite-c100

``--smoke`` runs the same path tiny on CPU (digits upsampled to 32×32×3, a narrow ResNet-18,
2 pretraining epochs, 2 rounds, 4 clients) and needs no dataset: what CI runs. Shows the two
stages (pretraining epochs, federated rounds) on stderr and ends with the federated run's
summary and where the files are (``--json``: that summary as one JSON object).
"""

from __future__ import annotations

import argparse

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.console import add_output_args, emit, set_verbosity


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--gpus-per-executor", type=float, default=0.5)
    p.add_argument("--executors", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the same path")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override (repeatable)")
    add_output_args(p)
    args = p.parse_args(argv)
    set_verbosity(args.verbose)

    import ray

    from fedray.cli import summary_text
    from fedray.config import load_config
    from fedray.pretrain import pretrain
    from fedray.progress import Progress
    from fedray.runtime import init_ray, resumable, run_experiment

    if args.smoke:
        data = ["data.dataset=digits", "data.image_size=32", "data.channels=3"]
        model = ["model.name=resnet18", "model.width=8"]
        sizes = ["pretrain.epochs=2", "pretrain.batch_size=64", "pretrain.warmup_epochs=1",
                 "rounds=2", "clients.num_clients=4", "local.batch_size=32",
                 "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]
        gpus = 0.0
    else:
        if not args.data_root:
            p.error("--data-root is required (or --smoke)")
        data = ["data.dataset=cifar100", f"data.root={args.data_root}",
                f"data.download={str(args.download).lower()}"]
        model = ["model.name=resnet18"]
        sizes = [f"pretrain.epochs={args.pretrain_epochs}", f"rounds={args.rounds}",
                 f"clients.num_clients={args.clients}", "local.batch_size=64",
                 f"runtime.tiers=[{{name: gpu, executors: {args.executors}, num_cpus: 2, "
                 f"num_gpus: {args.gpus_per_executor}}}]"]
        gpus = 1.0
    part = ["data.partition=iid"] if args.alpha is None else [
        "data.partition=dirichlet", f"data.alpha={args.alpha}"]
    base_dir = f"{args.run_dir}/base"
    common = data + model + sizes + part + [f"seed={args.seed}", "name=flite-cifar100"]
    pcfg = load_config(None, common + args.set)
    init_ray(pcfg)
    from fedray.storage import Storage

    progress = Progress(2, enabled=not args.no_progress)
    with progress.stage("pretrain base", pcfg.pretrain.epochs, "epochs") as stage:
        if not Storage(base_dir).exists("base.npz"):
            resume = Storage(base_dir).exists("checkpoints/LATEST")
            task = ray.remote(num_gpus=gpus, num_cpus=1)(pretrain)
            ray.get(task.remote(pcfg, base_dir, resume=resume, progress=False,
                                on_epoch=epoch_reporter(stage.relay(), pcfg.pretrain.epochs)))
        stage.report(pcfg.pretrain.epochs)
    cfg = load_config(None, common + [
        "algorithm.name=flite", f"algorithm.base={base_dir}", f"algorithm.d={args.d}",
        f"algorithm.r={args.r}", f"payload.upload={args.codec}",
        f"local.epochs={args.local_epochs}"] + args.set)
    fl_dir = f"{args.run_dir}/federated"
    resume = resumable(fl_dir, cfg)  # the same run continues; another is refused
    summary = run_experiment(cfg, fl_dir, resume=resume, progress=progress)
    emit(summary, args.json, summary_text(summary) + f"\npretrained base: {base_dir}")
    return summary


def epoch_reporter(report, epochs: int):
    """pretrain's ``on_epoch(history row)`` as a stage's ``(done, total)`` callback."""
    return lambda row: report(row["epoch"], epochs)


if __name__ == "__main__":
    main()
