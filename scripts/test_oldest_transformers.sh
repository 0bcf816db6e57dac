#!/usr/bin/env bash
# The lower end of the transformers range lp declares (pyproject.toml: "transformers>=X.Y"): a
# virtual environment over the current Python's packages (lp, torch and the rest as installed)
# with only transformers X.Y.* in it, running the tests that touch transformers' cache, attention
# and generate (every call lives in lp/decode/kv_cache.py, lp/decode/arch.py and lp/library.py; the
# processors lp applies as generate does, lp/decode/processors.py):
# batched and single rounds against generate in float64, the architecture matrix, op and sync
# counts, the library entry, batched jobs under torchrun and the fuzzer's cases (the GPU machine has
# the lower end).
#   bash scripts/test_oldest_transformers.sh          # after scripts/install.sh; about 5 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
low=$(sed -n 's/^ *"transformers>=\([0-9]*\.[0-9]*\)[,"].*/\1/p' pyproject.toml)
[ -n "$low" ] || { echo "pyproject.toml: no \"transformers>=X.Y\" dependency to test" >&2; exit 2; }
venv=${LP_OLDEST_VENV:-"${TMPDIR:-/tmp}/lp-transformers-$low"}
[ -x "$venv/bin/python" ] || python -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q "transformers==$low.*"
"$venv/bin/python" - "$low" <<'EOF'
import sys, transformers
assert transformers.__version__.startswith(sys.argv[1] + "."), (transformers.__version__, sys.argv[1])
print(f"transformers {transformers.__version__} from {transformers.__file__}")
EOF
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_batch.py tests/test_prefix.py tests/test_architectures.py tests/test_exactness.py \
    tests/test_round_ops.py tests/test_syncs.py tests/test_library.py tests/test_batch_jobs.py tests/test_processors.py \
    tests/test_baseline.py tests/test_sampling.py::test_warpers_are_generates tests/test_fuzz_exact.py \
    tests/test_arch_sweep.py
