"""Does a change leave results bitwise alone? Run eight modes with the fedray on the path
and store their final global states and metrics tables; compare two such stores.

    .venv/bin/python benchmarks/bitwise_vs.py run OUT_NEW
    (cd OLD_CHECKOUT && PYTHONPATH=$PWD ../main/.venv/bin/python \\
        ../main/benchmarks/bitwise_vs.py run OUT_OLD)
    .venv/bin/python benchmarks/bitwise_vs.py compare OUT_OLD OUT_NEW

Modes: plain FedAvg with local evaluation; ``runtime.reduce=executors`` on 24 clients with
kept optimizer state; a fleet (availability trace, over-commitment, dropout, deadline);
FedBuff on an availability trace with dropout and client state; Poisson-sampled central DP
with adaptive clipping; top-k + int8 transforms with error feedback; ORDERS with
fine-tuned evaluation; FedAvgM. Wall-clock columns (``seconds``, ``executor``) are left
out of the comparison. A checkout from before the server optimizers spells FedAvgM's β
``algorithm.momentum``; it is translated for older checkouts.
"""

from __future__ import annotations

import os
import sys

import numpy as np

POP = ["data.dataset=synthetic", "data.synthetic_per_client=20", "data.synthetic_features=16",
       "model.hidden=[16]", "seed=3",
       "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]
TINY = ["rounds=3", "seed=7", "clients.num_clients=6", "clients.fraction=1.0",
        "model.hidden=[32]", "local.batch_size=16", "local.epochs=1",
        "data.partition=dirichlet", "data.alpha=1.0",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]


def cases(avail: str, new_keys: bool) -> dict[str, list[str]]:
    momentum = "server.momentum=0.5" if new_keys else "algorithm.momentum=0.5"
    return {
        "plain": TINY + ["eval.clients=sampled"],
        "reduce": TINY + ["clients.num_clients=24", "runtime.reduce=executors",
                          "local.momentum=0.5", "local.keep_optimizer_state=true"],
        "fleet": POP + ["clients.num_clients=30", "clients.per_round=6", "rounds=4",
                        "fleet.overcommit=0.5", f"fleet.availability={avail}",
                        "fleet.dropout=0.2", "fleet.deadline_s=30", "fleet.min_reports=1",
                        "eval.every=2"],
        "fedbuff": POP + ["algorithm.name=fedbuff", "algorithm.concurrency=5",
                          "algorithm.buffer_size=3", "clients.num_clients=30", "rounds=4",
                          "fleet.dropout=0.1", "local.momentum=0.9",
                          "local.keep_optimizer_state=true", f"fleet.availability={avail}"],
        "dp": TINY + ["clients.num_clients=12", "clients.fraction=0.5", "dp.enabled=true",
                      "dp.noise_multiplier=0.8", "dp.clip_norm=0.5", "dp.adaptive_clip=true",
                      "dp.count_noise=1", "dp.sampling=poisson"],
        "topk": TINY + ["payload.transforms=[{name: topk, density: 0.2}, int8]",
                        "clients.fraction=0.5"],
        "orders": TINY + ["algorithm.name=orders", "eval.finetune_epochs=1"],
        "fedavgm": TINY + ["algorithm.name=fedavgm", momentum],
    }


def run(out: str) -> None:
    import pyarrow.parquet as pq

    try:  # today's layout
        from fedray.core.config import load_config
        from fedray.core.storage import Storage
        new_keys = True
    except ImportError:  # a checkout from before the subpackages
        from fedray.config import load_config
        from fedray.storage import Storage
        try:
            import fedray.server_opt  # noqa: F401
            new_keys = True
        except ImportError:
            new_keys = False
    from fedray.runtime import run_experiment

    os.makedirs(out, exist_ok=True)
    avail = os.path.join(out, "avail.csv")
    with open(avail, "w") as f:
        f.write("client_id,start_s,end_s\n" + "".join(
            f"{c},{(c % 3) * 5},{(c % 3) * 5 + 40}\n" for c in range(30)))
    for name, overrides in cases(avail, new_keys).items():
        run_dir = os.path.join(out, name)
        run_experiment(load_config(None, overrides), run_dir, progress=False)
        ck = Storage(run_dir).read_checkpoint()
        params = ck["parts"]["server"]["params"] if "parts" in ck else ck["global_state"]
        np.savez(os.path.join(out, f"{name}.npz"), **params)
        for kind in ("rounds", "clients"):
            t = pq.read_table(os.path.join(run_dir, f"{kind}.parquet")).to_pandas()
            t = t.drop(columns=[c for c in ("seconds", "executor") if c in t.columns])
            t.to_parquet(os.path.join(out, f"{name}.{kind}.parquet"))
        print(name, "done", flush=True)


def compare(a: str, b: str) -> int:
    import pandas as pd

    worst = 0
    for name in cases("", True):
        x, y = np.load(f"{a}/{name}.npz"), np.load(f"{b}/{name}.npz")
        same = set(x) == set(y) and all(np.array_equal(x[k], y[k]) for k in x)
        notes = []
        for kind in ("rounds", "clients"):
            p = pd.read_parquet(f"{a}/{name}.{kind}.parquet")
            q = pd.read_parquet(f"{b}/{name}.{kind}.parquet")
            extra = sorted(set(p.columns) ^ set(q.columns))
            if extra:
                notes.append(f"{kind}: columns in one only {extra}")
            common = [c for c in p.columns if c in q.columns]
            diff = [c for c in common if not p[c].equals(q[c])]
            if diff:
                notes.append(f"{kind}: values differ in {diff}")
                worst = 1
        worst |= not same
        print(f"{name:<8} {'params bitwise' if same else 'PARAMS DIFFER'}; "
              f"{'; '.join(notes) or 'rows equal'}")
    return worst


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(sys.argv[2])
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
