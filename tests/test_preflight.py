"""``make demo`` / ``make test`` on a machine missing a prerequisite stop at once with one
line naming what is missing and how to get it (issue #33): ``scripts/preflight.sh`` run
with a PATH of stand-in tools — no make, a Python older than 3.10, a full disk, no
chromium — before anything is downloaded or created."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "preflight.sh"
REAL = ("sh", "awk", "cat", "dirname")


def tools(tmp: Path, *, make=True, python="3.11.7", free_kb=50_000_000, chromium=True) -> Path:
    """A bin directory holding the real basics and stand-ins for the checked tools."""
    bin_ = tmp / "bin"
    bin_.mkdir()
    for name in REAL:
        os.symlink(shutil.which(name), bin_ / name)

    def fake(name: str, body: str) -> None:
        (bin_ / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_ / name).chmod(0o755)

    if make:
        fake("make", "exit 0")
    major, minor = (int(p) for p in python.split(".")[:2])
    fake("python3", f"""case "$*" in
  *version_info*) [ {major} -gt 3 ] || {{ [ {major} -eq 3 ] && [ {minor} -ge 10 ]; }} ;;
  *python_version*) echo {python} ;;
  *) exit 0 ;;
esac""")
    fake("df", f'echo "Filesystem 1024-blocks Used Available Capacity Mounted"; '
               f'echo "/dev/x 100000000 1 {free_kb} 1% /"')
    if chromium:
        fake("chromium", "exit 0")
    return bin_


def preflight(tmp: Path, target: str, **kw) -> subprocess.CompletedProcess:
    bin_ = tools(tmp, **kw)
    env = {"PATH": str(bin_), "VENV": str(tmp / "no-venv-yet"), "HOME": str(tmp)}
    return subprocess.run(["sh", str(SCRIPT), target], cwd=tmp, env=env, text=True,
                          capture_output=True, timeout=60)


def one_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1 and res.stdout == "", res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_all_present_passes(tmp_path):
    res = preflight(tmp_path, "test")
    assert res.returncode == 0 and res.stderr == "", res


@pytest.mark.parametrize("target", ["demo", "test"])
def test_no_make(tmp_path, target):
    line = one_line(preflight(tmp_path, target, make=False))
    assert "'make' is missing" in line and "apt-get install make" in line


def test_python_too_old(tmp_path):
    line = one_line(preflight(tmp_path, "demo", python="3.8.10"))
    assert "Python 3.10 or newer" in line and "3.8.10" in line and "PYTHON=" in line


def test_no_disk_for_the_venv(tmp_path):
    line = one_line(preflight(tmp_path, "demo", free_kb=3 * 1024 * 1024))
    assert "not enough disk space" in line and "3 GB free" in line and "8 GB" in line


def test_no_chromium_only_matters_for_test(tmp_path):
    (tmp_path / "a").mkdir()
    line = one_line(preflight(tmp_path / "a", "test", chromium=False))
    assert "'chromium' is missing" in line and "apt-get install chromium" in line
    (tmp_path / "b").mkdir()
    assert preflight(tmp_path / "b", "demo", chromium=False).returncode == 0


def test_make_runs_preflight_before_the_venv():
    """Each target that installs names its preflight first (nothing downloads before)."""
    text = (ROOT / "Makefile").read_text()
    for target, check in (("demo", "preflight-demo"), ("tour", "preflight-demo"),
                          ("test", "preflight-test"), ("docs", "preflight-demo")):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{target}:"))
        deps = line.split(":", 1)[1].split()
        assert deps[0] == check, line
