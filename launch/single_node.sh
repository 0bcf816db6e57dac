#!/usr/bin/env bash
# One node, P workers (one per GPU; on a CPU-only machine, P gloo workers).
#   launch/single_node.sh [P] --config configs/humaneval-smollm2.yaml [--set k=v ...]
# P defaults to the number of visible GPUs, or 2 without GPUs. The job is checked (lp.run --check) before
# torchrun starts any worker.
set -euo pipefail
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then nproc=$1; shift
  if (( nproc < 1 )); then echo "error: launch/single_node.sh: P must be >= 1 (workers), got $nproc" >&2; exit 2; fi
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then nproc=$(nvidia-smi -L | wc -l)
else nproc=2; fi
usage="usage: launch/single_node.sh [P] --config JOB.yaml [--set SECTION.KEY=VALUE ...]  (P workers: default the visible GPUs, else 2)"
for arg in "$@"; do
  if [[ $arg == -h || $arg == --help ]]; then echo "$usage"; echo; echo "lp.run's options:"; exec python -m lp.run --help; fi
done
if [[ $# -eq 0 ]]; then echo "$usage" >&2; exit 2; fi
if [[ $1 != -* ]]; then echo "error: launch/single_node.sh: P must be a whole number of workers, got '$1'" >&2
  echo "$usage" >&2; exit 2; fi
# the job's checks first, in this process: a bad config, prompt file, output directory or model name is one error
# line and its status (2 or 1), not that line followed by torchrun's traceback for the failed workers
WORLD_SIZE=$nproc python -m lp.run --check "$@" >/dev/null
# torchrun as a module of this python: the `torchrun` on PATH may belong to another Python (a venv's shim)
exec python -m torch.distributed.run --standalone --nproc-per-node="$nproc" -m lp.run "$@"
