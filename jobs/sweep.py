"""Sweep any config keys of any experiment with Ray Tune (see ``fedray tune --help``).

    ray job submit --working-dir . -- python jobs/sweep.py configs/orders_digits.yaml \\
        --preset orders --num-samples 8 --max-concurrent 4 --storage s3://bucket/sweeps
    python jobs/sweep.py configs/fedavg_digits.yaml --space local.lr=loguniform:1e-3,0.3

Each trial is one experiment whose driver and executors share one placement group; ASHA
stops weak trials after ``--grace-period`` rounds; ``--resume`` continues an interrupted
sweep of the same ``--name``. The per-method jobs (``sweep_drod.py``, ``sweep_orders.py``,
``sweep_flite.py``) call :func:`main` with their paper setting and ready-made space. Shows
the rounds over all trials on stderr and ends with the table of trials and where the files
are (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity


def parser(description: str = __doc__, config: str | None = None) -> argparse.ArgumentParser:
    p = JobParser(description=description)
    if config is None:
        p.add_argument("config", help="experiment config (may hold a `sweep:` block)")
    p.add_argument("--space", action="append", default=[], metavar="KEY=KIND:V1,V2",
                   help="KIND: choice, grid, uniform, loguniform, randint (repeatable)")
    p.add_argument("--preset", help="drod, orders, flite or favor")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every trial (repeatable)")
    p.add_argument("--metric")
    p.add_argument("--mode", choices=["max", "min"])
    p.add_argument("--num-samples", type=int)
    p.add_argument("--max-concurrent", type=int)
    p.add_argument("--scheduler", choices=["asha", "none"])
    p.add_argument("--grace-period", type=int)
    p.add_argument("--storage", default="runs/sweeps", help="path or URI (s3://...)")
    p.add_argument("--name", help="sweep name (default sweep-NAME)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("--smoke", action="store_true", help="a tiny sweep of the same path")
    add_output_args(p)
    return p


def main(argv: list[str] | None = None, *, config: str | None = None,
         preset: str | None = None, smoke: list[str] = (), description: str = __doc__,
         prepare=None, prepare_stages: int = 0) -> dict:
    """Parse the arguments and sweep. ``prepare(args, overrides, progress)`` runs first and
    returns more overrides (e.g. a base built once for every trial); it opens
    ``prepare_stages`` stages of ``progress``."""
    args = parser(description, config).parse_args(argv)
    set_verbosity(args.verbose)

    from fedray.front.cli import sweep_text
    from fedray.front.tune import parse_space_arg, sweep
    from fedray.observe.progress import Progress

    overrides = list(args.set)
    options = {k: getattr(args, k) for k in ("metric", "mode", "num_samples",
                                               "max_concurrent", "scheduler", "grace_period")}
    if args.smoke:
        overrides = list(smoke) + overrides
        options["num_samples"] = options["num_samples"] or 1
    progress = Progress(prepare_stages + 1, enabled=not args.no_progress)
    if prepare is not None:
        overrides += prepare(args, overrides, progress)
    res = sweep(config or args.config, dict(parse_space_arg(t) for t in args.space),
                overrides=overrides, preset=args.preset or preset, storage_path=args.storage,
                name=args.name, resume=args.resume, progress=progress, **options)
    out = {"path": res.path, "best_config": res.best_config, "best_metric": res.best_metric,
           "trials": len(res.table), "table": res.markdown}
    emit(out, args.json, sweep_text(res))
    return out


if __name__ == "__main__":
    raise SystemExit(guarded(main))
