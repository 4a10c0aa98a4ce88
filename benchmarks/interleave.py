"""Two fedray trees on the same workload, run alternately: the measurement of a change.

This machine's speed drifts by up to 1.5× over an hour, more than most changes move a
round, so a before/after pair measured minutes apart says little. Here each repeat runs
tree A and tree B (A first in odd repeats, B first in even ones), each in a fresh process
with its own local Ray, stepping an ``Experiment`` and timing every ``exp.step()``; a
run's number is the median step of rounds 3 and later, and the report gives every run's
number and the median of each side.
The workload's overrides come from *this* tree's ``benchmarks/scale.py`` (``--workload
scale``: N clients, K a round, cohorts of ``--cohort`` with ``vectorize=on``, sequential
with ``--cohort 0``, each tree's default cohort size with ``--cohort default``) or
``benchmarks/sim_overhead.py`` (``--workload sim_overhead``: the 784-256-10 MLP, every one
of ``--per-round`` clients every round), so both sides run the
same configuration. A side is a directory holding a fedray tree or a git revision of this
repository (checked out in a temporary worktree, removed afterwards)::

    .venv/bin/python benchmarks/interleave.py --a HEAD~1 --b . --per-round 10000 \\
        --rounds 12 --repeats 3 --reduce executors
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from fedray.core.config import load_config
from fedray.runtime.experiment import Experiment
exp = Experiment(load_config(None, json.loads(sys.argv[2])), sys.argv[3], overwrite=True)
exp.start()
steps = []
try:
    while not exp.done:
        t = time.perf_counter()
        exp.step()
        steps.append(time.perf_counter() - t)
finally:
    exp.close()
    exp.release()
print(json.dumps(steps))
"""


def overrides(args: argparse.Namespace) -> list[str]:
    """The workload's fedray overrides, from this tree's benchmark scripts."""
    if args.workload == "sim_overhead":
        from sim_overhead import workload

        ov = workload(args.per_round, args.rounds, args.seed)
        return ov + [f"runtime.reduce={args.reduce}"]
    from scale import fedray_overrides

    default = args.cohort == "default"  # vectorize=on, each tree its own default size
    return fedray_overrides(args.population, args.per_round, args.rounds, args.seed,
                            args.executors, True, args.reduce,
                            None if default else int(args.cohort) or None, vectorize=default)


def checkout(side: str, keep: list[str]) -> str:
    """A fedray tree for ``side``: the directory itself, or a temporary worktree of the git
    revision it names (appended to ``keep`` for removal)."""
    if os.path.isdir(os.path.join(side, "fedray")):
        return os.path.abspath(side)
    where = tempfile.mkdtemp(prefix="fedray-interleave-")
    out = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", where, side],
                         capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        raise SystemExit(f"interleave: {side!r} is neither a fedray tree nor a revision of "
                         f"this repository: {out.stderr.strip()}")
    keep.append(where)
    return where


def describe(tree: str) -> str:
    """The commit a tree is at, with ``+changes`` when it differs from it (a working tree)."""
    from provenance import git

    head = git("-C", tree, "rev-parse", "--short", "HEAD")
    if not head:
        return "not a git tree"
    dirty = git("-C", tree, "status", "--porcelain", "--untracked-files=no")
    return head + (" +changes" if dirty else "")


def run_side(tree: str, ov: list[str], timeout: float) -> list[float]:
    """One run of the workload on ``tree`` in a fresh process with its own local Ray (never
    a cluster named by ``RAY_ADDRESS``, whose workers would import another tree), in its
    own session, so that a run past ``timeout`` is killed with its Ray processes: every
    step's seconds."""
    with tempfile.TemporaryDirectory(prefix="fedray-interleave-run-") as tmp:
        env = dict(os.environ, PYTHONPATH=tree)
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, tree, json.dumps(ov),
                                 os.path.join(tmp, "run")], cwd=tree, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"the run on {tree} ran past {timeout:g} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the run on {tree} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def steady(steps: list[float]) -> float:
    """The median step of rounds 3 and later (the first two pay for warm-up)."""
    return statistics.median(steps[2:] if len(steps) > 2 else steps)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="before: a fedray tree or a git revision")
    p.add_argument("--b", required=True, help="after: a fedray tree or a git revision")
    p.add_argument("--workload", choices=["scale", "sim_overhead"], default="scale")
    p.add_argument("--population", type=int, default=100_000,
                   help="clients in the population (scale workload)")
    p.add_argument("--per-round", type=int, default=10_000, help="clients a round")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3, help="runs of each side")
    p.add_argument("--reduce", choices=["driver", "executors"], default="executors")
    p.add_argument("--cohort", default="256",
                   help="cohort size with vectorize=on (scale workload; 256 if not given); "
                        "0: sequential; 'default': vectorize=on with runtime.cohort_size "
                        "unset, each tree's own default")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--out", default=None, help="write the runs' JSON here")
    args = p.parse_args(argv)
    for name in ("per_round", "rounds", "repeats", "population", "executors"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got "
                    f"{getattr(args, name)}")
    if args.cohort != "default" and not args.cohort.isdigit():
        p.error(f"--cohort must be 0 or more, or 'default', got {args.cohort!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ov, keep = overrides(args), []
    try:
        trees = {"A": checkout(args.a, keep), "B": checkout(args.b, keep)}
        commits = {side: describe(tree) for side, tree in trees.items()}
        runs: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(args.repeats):  # A B, then B A: drift favours neither side
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                runs[side].append(steady(run_side(trees[side], ov, args.timeout)))
                print(f"repeat {i + 1} {side}: {runs[side][-1]:.4f} s/step", flush=True)
    finally:
        for where in keep:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", where],
                           capture_output=True)
            shutil.rmtree(where, ignore_errors=True)
    med = {side: statistics.median(v) for side, v in runs.items()}
    report = {"a": args.a, "b": args.b, "a_tree": commits["A"], "b_tree": commits["B"],
              "overrides": ov, "runs": runs, "median": med, "b_over_a": med["B"] / med["A"]}
    for side, name in (("A", args.a), ("B", args.b)):
        print(f"{side} {name} ({commits[side]}): "
              f"{' / '.join(f'{v:.3f}' for v in runs[side])} s (median {med[side]:.3f})")
    print(f"B / A = {report['b_over_a']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
