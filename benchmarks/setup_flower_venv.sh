#!/usr/bin/env bash
# Create .venv-flower (repo root) with Flower's simulation engine and CPU torch.
#
# flwr[simulation] pins its own ray, so it cannot share fedray's .venv. pyyaml is there so
# that fedray's integration modules (fedray.integrations.flower -> fedray.core.config) import.
# Idempotent: does nothing when .venv-flower already imports flwr, torch and yaml.
#
# Usage: bash benchmarks/setup_flower_venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-flower"
PY="$VENV/bin/python"
PYTHON_BIN="${PYTHON_BIN:-python3.11}"
FLWR_VERSION="${FLWR_VERSION:-1.42.0}"

# One setup at a time (parallel test workers, two terminals): the second waits, then finds
# the venv ready.
exec 9>"$VENV.lock"
flock 9

if [[ -x "$PY" ]] && "$PY" -c "import flwr, torch, yaml" >/dev/null 2>&1; then
    echo "[setup_flower_venv] $VENV already has flwr, torch and yaml; nothing to do" >&2
    exit 0
fi

if [[ ! -x "$PY" ]]; then
    echo "[setup_flower_venv] creating $VENV with $PYTHON_BIN" >&2
    "$PYTHON_BIN" -m venv "$VENV"
fi

"$PY" -m pip install --upgrade pip >&2

# CPU torch: prefer the local wheel (pip find-links), fall back to the index.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install "torch==2.13.0+cpu" >&2 \
        || "$PY" -m pip install "torch==2.14.1" >&2
fi

# Flower with the Ray-based simulation engine; fall back to the newest 1.x.
if ! "$PY" -c "import flwr" >/dev/null 2>&1; then
    "$PY" -m pip install numpy "flwr[simulation]==$FLWR_VERSION" >&2 \
        || "$PY" -m pip install numpy "flwr[simulation]>=1.0,<2" >&2
fi

# pyyaml: fedray.core.config (imported by fedray.integrations.flower) needs it.
"$PY" -m pip install pyyaml >&2

"$PY" -c "import flwr, torch, ray, numpy, yaml; \
print('flwr', flwr.__version__, 'torch', torch.__version__, 'ray', ray.__version__, \
'pyyaml', yaml.__version__)" >&2
