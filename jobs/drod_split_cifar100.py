"""DROD on Split-CIFAR-100 — the paper's setting (DROD §3, table 3), for a GPU cluster.

Ten clients in three capacity tiers on the shared budget ladder ρ = 1.000 / 0.251 / 0.064
(round-robin 4/3/3), each tier's executors pinned to a GPU fraction (0.5 / 0.25 / 0.125 by
default); a sliceable ResNet-18 with GroupNorm and a CIFAR stem trained from scratch;
10 tasks × 10 classes in a fixed order, class-incremental with one head; Dirichlet(0.5)
redrawn per task; 25 rounds × 4 local epochs per task, SGD lr 0.1, batch 32, random crop +
flip; experience replay with 6,400 exemplars fleet-wide (640 per client).

    ray job submit --working-dir . -- python jobs/drod_split_cifar100.py \\
        --data-root /mnt/data/cifar --run-dir s3://bucket/runs/drod-c100 --theta 0.5

Any arm of the paper's grid (``--algorithm fjord|heterofl|fedrolex|shortcut_fjord|
shortcut_fedavg|depth_fedavg|depth_fjord|fiarse|scalefl``, ``--kd`` for the "w/ KD" rows,
``--axis`` for FIARSE's structural axis) and objective (``--method er|derpp|bic|ewc|none``)
runs on the same harness.
``--smoke`` runs the same path tiny on CPU (digits upsampled to 32×32×3 as a 5-task
stream, a narrow network, 1 round per task): what CI runs. Shows the rounds on stderr and
ends with the run summary, the continual table (class-IL / task-IL ACC and forgetting per
tier and for the fleet) and where the files are; ``--json`` prints the summary as one JSON
object instead (``continual`` holds that table).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity


def main(argv: list[str] | None = None) -> dict:
    p = JobParser(description=__doc__)
    p.add_argument("--data-root", help="directory holding torchvision's cifar-100-python")
    p.add_argument("--download", action="store_true", help="let torchvision download it")
    p.add_argument("--run-dir", default="runs/drod-split-cifar100",
                   help="local path or pyarrow.fs URI (resumes when it holds a run)")
    p.add_argument("--algorithm", default="drod",
                   choices=["drod", "fjord", "heterofl", "fedrolex", "shortcut_fjord",
                            "shortcut_fedavg", "depth_fedavg", "depth_fjord", "fiarse",
                            "scalefl"])
    p.add_argument("--kd", action="store_true",
                   help="FjORD's self-distillation (the 'w/ KD' rows; Ordered-Dropout arms)")
    p.add_argument("--axis", default=None, choices=["width", "shortcut", "depth"],
                   help="FIARSE's structural axis (default width)")
    p.add_argument("--theta", type=float, default=0.5, help="DROD's θ in [0, 1]")
    p.add_argument("--match", default="params", choices=["params", "flops"])
    p.add_argument("--method", default="er", choices=["er", "derpp", "bic", "ewc", "none"])
    p.add_argument("--buffer", type=int, default=6400, help="fleet-wide replay exemplars")
    p.add_argument("--rounds-per-task", type=int, default=25)
    p.add_argument("--local-epochs", type=int, default=4)
    p.add_argument("--budgets", type=float, nargs=3, default=[1.0, 0.251, 0.064],
                   metavar=("HIGH", "MID", "LOW"))
    p.add_argument("--gpus", type=float, nargs=3, default=[0.5, 0.25, 0.125],
                   metavar=("HIGH", "MID", "LOW"), help="GPU fraction per executor, per tier")
    p.add_argument("--executors", type=int, nargs=3, default=[2, 2, 2],
                   metavar=("HIGH", "MID", "LOW"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the same path")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override (repeatable)")
    add_output_args(p)
    args = p.parse_args(argv)
    set_verbosity(args.verbose)

    from fedray.core.config import load_config
    from fedray.front.cli import summary_text
    from fedray.runtime import resumable, run_experiment

    names = ("t100", "t025", "t006")
    if args.smoke:
        data = ["data.dataset=digits", "data.image_size=32", "data.channels=3"]
        sizes = ["model.width=4", "continual.tasks=5", "continual.rounds_per_task=1",
                 "local.epochs=1", "continual.buffer_total=50", "rounds=5"]
        tiers = [f"{{name: {n}, executors: 1, num_cpus: 0.25, capacity: {b}}}"
                 for n, b in zip(names, args.budgets, strict=True)]
    else:
        if not args.data_root:
            p.error("--data-root is required (or --smoke)")
        data = ["data.dataset=cifar100", f"data.root={args.data_root}",
                f"data.download={str(args.download).lower()}"]
        sizes = ["continual.tasks=10", f"continual.rounds_per_task={args.rounds_per_task}",
                 f"local.epochs={args.local_epochs}",
                 f"continual.buffer_total={args.buffer}",
                 f"rounds={10 * args.rounds_per_task}"]
        tiers = [f"{{name: {n}, executors: {e}, num_cpus: 1, num_gpus: {g}, capacity: {b}}}"
                 for n, e, g, b in zip(names, args.executors, args.gpus, args.budgets,
                                       strict=True)]
    overrides = data + sizes + [
        "name=drod-split-cifar100", f"seed={args.seed}", "clients.num_clients=10",
        "data.partition=dirichlet", "data.alpha=0.5", "data.local_test_fraction=0.1",
        "model.name=sliceable_resnet18", f"algorithm.name={args.algorithm}",
        f"algorithm.match={args.match}", "algorithm.augment=true",
        "local.lr=0.1", "local.batch_size=32", f"continual.method={args.method}",
        "eval.clients=none", f"runtime.tiers=[{', '.join(tiers)}]"]
    if args.algorithm == "drod":
        overrides.append(f"algorithm.theta={args.theta}")
    if args.kd:
        overrides.append("algorithm.kd=true")
    if args.axis:
        overrides.append(f"algorithm.axis={args.axis}")
    if args.algorithm in ("depth_fedavg", "depth_fjord", "scalefl") or args.axis == "depth":
        overrides.append("model.exits=true")
    rpt = 1 if args.smoke else args.rounds_per_task
    cfg = load_config(None, overrides + [f"eval.every={rpt}"] + args.set)
    resume = resumable(args.run_dir, cfg)  # the same run continues; another is refused
    summary = run_experiment(cfg, args.run_dir, resume=resume, progress=not args.no_progress)
    emit(summary, args.json, continual_text(summary.get("continual")) + summary_text(summary))
    return summary


def continual_text(continual: dict | None) -> str:
    """The per-tier continual-learning table (one row per tier and the fleet)."""
    if not continual:
        return ""
    cols = list(next(iter(continual.values())))
    rows = [f"{'tier':<8}" + "".join(f"{c:>18}" for c in cols)]
    for tier, vals in continual.items():
        rows.append(f"{tier:<8}" + "".join(
            f"{v:>18.4f}" if isinstance(v, float) else f"{v!s:>18}" for v in vals.values()))
    return "\n".join(rows) + "\n\n"


if __name__ == "__main__":
    raise SystemExit(guarded(main))
