#!/usr/bin/env bash
# The CUDA paths in one short run (see benchmarks/gpu_check.py for the checks):
#   bash benchmarks/gpu_check.sh --out runs/gpu_check             # on a GPU machine
#   bash benchmarks/gpu_check.sh --dry-run --out /tmp/gpu_check   # anywhere: the script only
# Exit 0 when every check passed; results in OUT/gpu_check.json and OUT/GPU_CHECK.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "$PY" benchmarks/gpu_check.py "$@"
