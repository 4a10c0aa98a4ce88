"""ORDERS under the text's four non-IID settings (label, quantity, feature skew, concept
drift) with an MLP, CNN or LSTM, against FedAvg and FedProx — personalized accuracy.

    ray job submit --working-dir . -- python jobs/orders_noniid.py --skew drift --model cnn
    python jobs/orders_noniid.py --method fedprox --skew label      # local Ray

Defaults to the embedded dataset (scikit-learn's digits, 20 clients, half sampled per
round); ``--dataset cifar10 --data-root DIR`` runs the same settings on CIFAR-10. ``--smoke``
is a 3-round, 6-client version of the same path (CI). Shows the rounds on stderr and ends
with the run summary and where the files are (``--json``: the summary as one JSON object).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity

BASE = ["rounds=20", "clients.num_clients=20", "clients.fraction=0.5", "local.epochs=2",
        "local.batch_size=16", "local.lr=0.05", "eval.every=2", "eval.finetune_epochs=1",
        "eval.local_before_after=true",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
NONIID = {
    "label": ["data.partition=dirichlet", "data.alpha=0.3"],
    "quantity": ["data.partition=quantity", "data.quantity_alpha=0.3"],
    "feature": ["data.partition=iid", "data.feature_skew=1.0"],
    "drift": ["data.partition=dirichlet", "data.alpha=0.5", "data.drift_round=11",
              "data.drift_fraction=0.5"],
}
MODELS = {
    "mlp": ["model.name=mlp", "model.hidden=[64]"],
    "cnn": ["model.name=cnn", "model.channels=[8,16]", "model.hidden=32"],
    "lstm": ["model.name=lstm", "model.hidden=32"],
}
METHODS = {
    "orders": ["algorithm.name=orders", "algorithm.weighting=sigmoid"],
    "orders_rank_mean": ["algorithm.name=orders", "algorithm.combine=rank_mean"],
    "fedavg": ["algorithm.name=fedavg"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.1"],
}


def main(argv: list[str] | None = None) -> dict:
    p = JobParser(description=__doc__)
    p.add_argument("--skew", choices=list(NONIID), default="label")
    p.add_argument("--model", choices=list(MODELS), default="mlp")
    p.add_argument("--method", choices=list(METHODS), default="orders")
    p.add_argument("--dataset", choices=["digits", "cifar10"], default="digits")
    p.add_argument("--data-root", help="torchvision CIFAR-10 directory (--dataset cifar10)")
    p.add_argument("--run-dir", help="local path or pyarrow.fs URI (default runs/NAME-TIME)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="3 rounds, 6 clients")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override (repeatable)")
    add_output_args(p)
    args = p.parse_args(argv)
    set_verbosity(args.verbose)

    from fedray.core.config import load_config
    from fedray.front.cli import summary_text
    from fedray.runtime import run_experiment

    data = [f"data.dataset={args.dataset}"]
    if args.dataset == "cifar10":
        if not args.data_root:
            p.error("--data-root is required with --dataset cifar10")
        data.append(f"data.root={args.data_root}")
    smoke = ["rounds=3", "clients.num_clients=6", "data.drift_round=2",
             "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"] if args.smoke \
        else []
    if args.smoke and args.skew != "drift":
        smoke.remove("data.drift_round=2")
    cfg = load_config(None, BASE + data + NONIID[args.skew] + MODELS[args.model]
                      + METHODS[args.method] + smoke
                      + [f"seed={args.seed}", f"name=orders-noniid-{args.method}-"
                         f"{args.skew}-{args.model}"] + args.set)
    summary = run_experiment(cfg, args.run_dir, progress=not args.no_progress)
    emit(summary, args.json, summary_text(summary))
    return summary


if __name__ == "__main__":
    raise SystemExit(guarded(main))
