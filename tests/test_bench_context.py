"""scripts/bench_context.py on the embedded model at two short contexts: a row per context, lp's ids
equal generate's, tokens/s of both printed."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_context_prints_a_row_per_context():
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_context.py"), "--contexts", "48,96", "--max-new-tokens", "6",
           "--repeats", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["48", "96"]
    for _, plain, ours, ratio, s, same in rows:
        plain, ours, ratio = float(plain), float(ours), float(ratio)
        # the ratio of the unrounded rates; each printed with 2 decimals, so their quotient is off by up to
        # ratio * (0.005 / plain + 0.005 / ours), the ratio's own rounding 0.005 more (a slow run's rates are small)
        assert plain > 0 and ours > 0 and abs(ratio - ours / plain) <= ratio * (0.005 / plain + 0.005 / ours) + 0.006
        assert float(s) >= 1 and same == "yes"


@pytest.mark.parametrize("args,needle", [(["--contexts", "abc"], "expected comma-separated token counts"),
                                         (["--contexts", "0"], "each context must be >= 1 token"),
                                         (["--contexts", "9000"], "in the model's 8192 positions"),
                                         (["--repeats", "0"], "--repeats"),
                                         (["--max-new-tokens", "0"], "--max-new-tokens"),
                                         (["--threads", "-1"], "--threads")])
def test_bench_context_refuses_bad_arguments(args, needle):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_context.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
