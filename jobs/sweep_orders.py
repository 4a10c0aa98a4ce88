"""Sweep ORDERS' sigmoid β ∈ [0.3, 0.7] and γ ∈ [N/3, N/2] (the text's ranges) on
`configs/orders_digits.yaml` (label skew, 20 clients).

    ray job submit --working-dir . -- python jobs/sweep_orders.py --num-samples 16 \\
        --max-concurrent 4 --metric personalized_accuracy
"""

import os

import _bootstrap  # noqa: F401
from sweep import main

from fedray.observe.console import guarded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["rounds=2", "clients.num_clients=6", "eval.finetune_epochs=0",
         "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"]


def run() -> None:
    main(config=os.path.join(ROOT, "fedray", "configs", "orders_digits.yaml"), preset="orders",
         smoke=SMOKE, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(guarded(run))
