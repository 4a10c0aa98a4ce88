#!/usr/bin/env bash
# The CUDA paths in one short run on one GPU, ≤ 8 minutes, nothing downloaded (the checks:
# benchmarks/gpu_check.py, or --help): FAVoR QLoRA on 8 x 0.125 GPU, 12 FAVoR authors
# through one base (sequential vs batched tokens/s and peak memory), the DROD fleet on
# 0.5/0.25/0.125 GPU tiers, FLITE on a ResNet-18, per-executor peak GPU memory, samples/s
# per tier, what must equal a CPU run, and pfl-research's CIFAR-10 setup timed (against pfl
# itself with --pfl-python .venv-pfl/bin/python).
#   bash benchmarks/gpu_check.sh --out runs/gpu_check             # on a GPU machine
#   bash benchmarks/gpu_check.sh --dry-run --out /tmp/gpu_check   # anywhere: the script only
#   bash benchmarks/gpu_check.sh --out runs/gpu_check --skip favor  # leave checks out
# On a lent machine without Ray or bitsandbytes (this project's): build the bundle here
# (.venv/bin/python benchmarks/device_bundle.py build), carry .devbundle, and run
#   bash .devbundle/run.sh --out "$OUT/gpu_check"
# Results are saved after every check, so a call cut off at its limit keeps what finished;
# with --state DIR a second run skips the checks that passed in the first (run.sh does so).
# Exit 0 when every check passed; results in OUT/gpu_check.json and OUT/GPU_CHECK.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1  # nothing downloaded
exec "$PY" benchmarks/gpu_check.py "$@"
