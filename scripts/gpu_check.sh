#!/usr/bin/env bash
# The device check (scripts/gpu_check.py): a 20 s preflight, then compiled and eager lookahead, the
# job path under torchrun, float32 exactness, profiled rounds and LP with 2 and 4 ranks on one GPU,
# on random-weight models it builds and saves itself; runs lp from this source tree (no install, no
# model file, no network) and writes one JSON file, rewritten after every stage. On one CUDA GPU it
# stays inside --budget-s (default 420 s; 40 s past it a watchdog ends it: under 8 minutes in all);
# `--small` runs tiny shapes (on the CPU with --device cpu, as the tests do, in under 2 minutes).
#   bash scripts/gpu_check.sh --out gpu_check.json
# Needs python3 only (PYTHON overrides it); torchrun is started as `python3 -m torch.distributed.run`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$root/scripts/gpu_check.py" "$@"
