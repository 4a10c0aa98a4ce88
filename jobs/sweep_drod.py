"""Sweep DROD's θ ∈ {0, 0.25, 0.5, 0.75, 1} on Split-digits (`configs/drod_split_digits.yaml`;
``-s`` overrides move it to Split-CIFAR-100, e.g. the settings of drod_split_cifar100.py).

    ray job submit --working-dir . -- python jobs/sweep_drod.py --max-concurrent 5
"""

import os

import _bootstrap  # noqa: F401
from sweep import main

from fedray.observe.console import guarded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["rounds=2", "continual.tasks=5", "continual.rounds_per_task=1", "eval.every=1",
         "local.epochs=1", "model.width=4", "data.image_size=8",
         "runtime.tiers=[{name: t100, executors: 1, num_cpus: 0.25, capacity: 1.0}, "
         "{name: t006, executors: 1, num_cpus: 0.25, capacity: 0.064}]"]


def run() -> None:
    main(config=os.path.join(ROOT, "fedray", "configs", "drod_split_digits.yaml"),
         preset="drod", smoke=SMOKE, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(guarded(run))
