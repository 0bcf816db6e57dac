#!/usr/bin/env bash
# The device check: runs lp from this source tree (no install, no gguf, no model
# file, no network) and writes one JSON file. On one CUDA GPU it takes a few
# minutes; `--small` runs tiny shapes on the CPU (the test suite does).
#   bash scripts/gpu_check.sh --out gpu_check.json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec python "$root/scripts/gpu_check.py" "$@"
