#!/usr/bin/env bash
# Create .venv-pfl (repo root) with pfl-research (Apple's `pfl`) and its PyTorch extra.
#
# pfl is kept out of fedray's .venv: it pins its own numpy/packaging/wheel ranges and pulls
# dp-accounting and prv-accountant, none of which fedray needs. torch is the same release
# the main venv uses (2.14.1; pfl 0.6 accepts torch >=2.0.1,<3) unless pip cannot have it,
# then whatever pip resolves for pfl[pytorch].
# Idempotent: does nothing when .venv-pfl already imports pfl and torch.
#
# Usage: bash benchmarks/setup_pfl_venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-pfl"
PY="$VENV/bin/python"
PYTHON_BIN="${PYTHON_BIN:-python3}"
PFL_VERSION="${PFL_VERSION:-0.6.0}"
TORCH_VERSION="${TORCH_VERSION:-2.14.1}"

if [[ -x "$PY" ]] && "$PY" -c "import pfl, torch" >/dev/null 2>&1; then
    echo "[setup_pfl_venv] $VENV already has pfl and torch; nothing to do" >&2
    exit 0
fi

if [[ ! -x "$PY" ]]; then
    echo "[setup_pfl_venv] creating $VENV with $PYTHON_BIN" >&2
    "$PYTHON_BIN" -m venv "$VENV"
fi

"$PY" -m pip install -q --upgrade pip >&2

# torch first, pinned to the main venv's release; fall back to what pfl[pytorch] resolves.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION" >&2 \
        || echo "[setup_pfl_venv] torch==$TORCH_VERSION not installable; letting pip pick" >&2
fi

# pfl with the PyTorch extra; fall back to the newest release pip accepts.
if ! "$PY" -c "import pfl" >/dev/null 2>&1; then
    "$PY" -m pip install -q "pfl[pytorch]==$PFL_VERSION" >&2 \
        || "$PY" -m pip install -q "pfl[pytorch]" >&2
fi

"$PY" -c "import importlib.metadata as m, sys; \
print('[setup_pfl_venv] installed in $VENV: python', sys.version.split()[0], \
*(f'{p} {m.version(p)}' for p in ('pfl', 'torch', 'numpy')))"
