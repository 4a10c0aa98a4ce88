"""FedAvg on the embedded default (scikit-learn digits, 20 label-skewed clients).

Runs locally (`python jobs/fedavg_digits.py`) or on a cluster
(`ray job submit --working-dir . -- python jobs/fedavg_digits.py`): it joins the cluster in
RAY_ADDRESS when set (Ray sets it for submitted jobs) and starts a local Ray otherwise.
Writes the run directory and draws the report; shows the rounds on stderr and ends with the
run's summary and where its files are (``--json``: the summary as one JSON object).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity


def main(argv: list[str] | None = None) -> dict:
    p = JobParser(description=__doc__)
    p.add_argument("--rounds", type=int, help="rounds (default 30)")
    p.add_argument("--run-dir", help="run directory: a path or a pyarrow.fs URI "
                                     "(default runs/fedavg-digits-TIMESTAMP)")
    p.add_argument("--smoke", action="store_true",
                   help="3 rounds, 6 clients, small executors: proves the path in seconds")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. -s local.lr=0.1 (repeatable)")
    add_output_args(p)
    args = p.parse_args(argv)
    set_verbosity(args.verbose)

    from fedray.core.config import load_config
    from fedray.front.cli import demo_config_path, summary_text
    from fedray.front.report import report
    from fedray.runtime import run_experiment

    overrides = []
    if args.smoke:
        overrides += ["rounds=3", "clients.num_clients=6",
                      "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]
    if args.rounds is not None:  # --rounds 0 is refused by the config, not ignored
        overrides.append(f"rounds={args.rounds}")
    cfg = load_config(demo_config_path(), overrides + args.set)
    summary = run_experiment(cfg, args.run_dir, progress=not args.no_progress)
    if "://" not in summary["run_dir"]:
        summary["report"] = report(summary["run_dir"])["markdown"]
    emit(summary, args.json, summary_text(summary, summary.get("report")))
    return summary


if __name__ == "__main__":
    raise SystemExit(guarded(main))
