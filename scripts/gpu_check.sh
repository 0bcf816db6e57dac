#!/usr/bin/env bash
# The device check (scripts/gpu_check.py): lp's job path under torchrun, eager and compiled, on
# random-weight models it builds and saves itself; runs lp from this source tree (no install, no
# model file, no network) and writes one JSON file. On one CUDA GPU it stays inside --budget-s
# (default 420 s); `--small` runs tiny shapes (on the CPU with --device cpu, as the tests do).
#   bash scripts/gpu_check.sh --out gpu_check.json
# Needs python3 only (PYTHON overrides it); torchrun is started as `python3 -m torch.distributed.run`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$root/scripts/gpu_check.py" "$@"
