"""Which code a benchmark's outputs came from: the benchmark scripts' one way to ask git."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    """``git *args`` in the repository, its stripped stdout ("" when git fails)."""
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def changed(*exclude: str) -> bool:
    """Whether a tracked file differs from HEAD (untracked files do not count), the paths
    in ``exclude`` aside."""
    return bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                    *[f":!{p}" for p in exclude]))
