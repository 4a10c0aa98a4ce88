"""Sweep FAVoR's λ_align on the embedded default (prepared once: synthetic authors, tiny LM,
ASCE), optimising the global adapter's held-out next-token accuracy by default; pass
``--metric`` for another per-round metric.

    ray job submit --working-dir . -- python jobs/sweep_favor.py --num-samples 6
"""

import os

import _bootstrap  # noqa: F401
from sweep import main

from fedray.observe.console import guarded

WORK = os.path.join("runs", "favor-embedded-cache")
BASE = {"name": "favor-sweep", "rounds": 6, "clients": {"num_clients": 50, "per_round": 12},
        "eval": {"clients": "none", "every": 1},
        "runtime": {"tiers": [{"name": "lm", "executors": 1, "num_cpus": 0.5}]}}
SMOKE = ["rounds=1", "clients.num_clients=6", "clients.per_round=2", "algorithm.max_steps=1"]


def prepare(args, overrides: list[str], progress) -> list[str]:
    """The corpus, tiny LM and ASCE, prepared once (three stages of ``progress``)."""
    from fedray.methods.favor.prepare import embedded_overrides, prepare_embedded

    if args.smoke:
        from fedray.methods.favor.lm import TinyLM

        spec = TinyLM(vocab_size=400, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, steps=40, batch_size=8, max_length=64)
        prep = prepare_embedded(WORK + "-smoke", 6, 0, pretrain_authors=4, lm=spec,
                                roster_posts=(12, 16), progress=progress)
    else:
        prep = prepare_embedded(WORK, 50, 0, progress=progress)
    return embedded_overrides(prep)


def run() -> None:
    main(config=BASE, preset="favor", smoke=SMOKE, description=__doc__, prepare=prepare,
         prepare_stages=3)


if __name__ == "__main__":
    raise SystemExit(guarded(run))
