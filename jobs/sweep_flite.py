"""Sweep FLITE's latent size d and factor rank r on `configs/flite_digits.yaml`; the shared
base is pretrained once first (as one Ray task) unless ``-s algorithm.base=DIR`` names one.

    ray job submit --working-dir . -- python jobs/sweep_flite.py --max-concurrent 3
"""

import os

import _bootstrap  # noqa: F401
from sweep import main

from fedray.observe.console import guarded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "fedray", "configs", "flite_digits.yaml")
SMOKE = ["rounds=2", "clients.num_clients=4", "pretrain.epochs=1", "pretrain.warmup_epochs=0",
         "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"]


def pretrain_base(args, overrides: list[str], progress) -> list[str]:
    """Pretrain the base into STORAGE/NAME-base once (a stage of ``progress``); later sweeps
    reuse it."""
    import ray

    from fedray.core.config import load_config
    from fedray.core.storage import Storage
    from fedray.models.pretrain import pretrain
    from fedray.runtime import init_ray

    cfg = load_config(CONFIG, ["algorithm={name: fedavg}", *overrides])
    with progress.stage("pretrain base", cfg.pretrain.epochs, "epochs") as stage:
        if any(o.startswith("algorithm.base=") for o in overrides):
            return []
        storage = args.storage if "://" in args.storage else os.path.abspath(args.storage)
        base = f"{storage}/{args.name or 'sweep-flite'}-base"
        if not Storage(base).exists("base.npz"):
            init_ray(cfg)
            task = ray.remote(num_cpus=1)(pretrain)
            report, epochs = stage.relay(), cfg.pretrain.epochs
            ray.get(task.remote(cfg, base, resume=Storage(base).exists("checkpoints/LATEST"),
                                progress=False,
                                on_epoch=lambda row: report(row["epoch"], epochs)))
        stage.report(cfg.pretrain.epochs)
    return [f"algorithm.base={base}"]


def run() -> None:
    main(config=CONFIG, preset="flite", smoke=SMOKE, description=__doc__, prepare=pretrain_base,
         prepare_stages=1)


if __name__ == "__main__":
    raise SystemExit(guarded(run))
