"""scripts/bench_index.py on a small index: both variants' quarters (the bounded one keeps at most its
bound, the unbounded one every token), their times and the ratios."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_index.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_bench_index_prints_both_variants_and_their_ratios():
    proc = bench("--completions", "40", "--tokens", "50", "--most", "600", "--drafts", "20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = {name: [int(k.replace(",", "")) for k in re.findall(rf"^ *{name}: +\d+ completions, +([\d,]+) tokens kept",
                                                               proc.stdout, re.M)]
            for name in ("unbounded", "bounded")}
    assert kept["unbounded"] == [500, 1000, 1500, 2000]
    assert kept["bounded"] == [500, 600, 600, 600]          # the latest 12 completions of 50 tokens
    assert len(re.findall(r"added in [\d.]+ s .* 20 drafts and lookups in \d+ ms", proc.stdout)) == 2
    assert re.search(r"^bounded / unbounded: memory [\d.]+x, adding [\d.]+x, drafts [\d.]+x$", proc.stdout, re.M)


def test_bench_index_refuses_a_bound_below_one():
    proc = bench("--most", "0")
    assert proc.returncode == 2 and "must be >= 1" in proc.stderr
