#!/usr/bin/env bash
# One node, P workers (one per GPU; on a CPU-only machine, P gloo workers).
#   launch/single_node.sh [P] --config configs/humaneval-smollm2.yaml [--set k=v ...]
# P defaults to the number of visible GPUs, or 2 without GPUs.
set -euo pipefail
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then nproc=$1; shift
  if (( nproc < 1 )); then echo "error: launch/single_node.sh: P must be >= 1 (workers), got $nproc" >&2; exit 2; fi
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then nproc=$(nvidia-smi -L | wc -l)
else nproc=2; fi
exec torchrun --standalone --nproc-per-node="$nproc" -m lp.run "$@"
