#!/bin/sh
# What `make demo`, `make test` and `make docs` need, checked before any download: each
# missing prerequisite stops with one line naming it and how to get it (issue #33).
# Usage: sh scripts/preflight.sh [demo|test|docs]   (POSIX sh: runs where bash or make lack)
target="${1:-demo}"
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"
fail() { echo "fedray: cannot run 'make $target': $*" >&2; exit 1; }

command -v make >/dev/null 2>&1 || fail "'make' is missing: install it (Debian/Ubuntu: apt-get install make; macOS: xcode-select --install)"
command -v "$python" >/dev/null 2>&1 || fail "'$python' is missing: install Python 3.10 or newer (python.org, or apt-get install python3 python3-venv), or pass PYTHON=/path/to/python3"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || \
  fail "Python 3.10 or newer is needed, '$python' is $("$python" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo unknown): install a newer one and pass PYTHON=/path/to/python3.x"
if [ ! -f "$venv/.fedray-installed" ]; then
  "$python" -c 'import venv, ensurepip' 2>/dev/null || \
    fail "Python's venv module is missing: apt-get install python3-venv (or the python3.x-venv of your version)"
  need_kb=$((8 * 1024 * 1024))  # the venv is about 7 GB with torch's CUDA build
  free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
  [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ] && \
    fail "not enough disk space: $((free_kb / 1024 / 1024)) GB free here, the .venv needs about 8 GB (free some space or set VENV=/a/bigger/disk/venv)"
fi
if [ "$target" = test ]; then
  chromium="${FEDRAY_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
  [ -n "$chromium" ] && [ -x "$chromium" ] || \
    fail "'chromium' is missing (the browser checks open the reports and the docs in it): apt-get install chromium, or set FEDRAY_CHROMIUM=/path/to/chromium"
fi
exit 0
