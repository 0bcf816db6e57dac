"""scripts/bench_gc.py on a tiny batched job: a line per run of each variant (same tokens), the
collections that ran while decoding counted, and the frozen / thawed ratios."""
import re
import subprocess
import sys
from pathlib import Path

from multiproc import prompt_lines, write_job

ROOT = Path(__file__).resolve().parents[1]


def test_bench_gc_prints_both_variants_and_their_ratios(tmp_path):
    config = write_job(tmp_path, prompt_lines([(f"t{i}", "abcabc" * (i + 1)) for i in range(4)]),
                       generation={"batch_size": 2, "max_new_tokens": 24})
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gc.py"), "--config", str(config),
                           "--limit", "4", "--repeats", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = re.findall(r"^ *(thawed|frozen) run 1: .* (\d+) tokens; collections while decoding (\d+) \((\d+) full\)",
                      proc.stdout, re.M)
    assert [r[0] for r in runs] == ["thawed", "frozen"] and runs[0][1] == runs[1][1] and int(runs[0][1]) > 0
    assert re.search(r"^frozen / thawed \(medians\): job tok/s [\d.]+x, collector time [\d.]+x", proc.stdout, re.M)


def test_bench_gc_refuses_a_job_that_is_not_batched(tmp_path):
    """Only batched jobs run decode_batch's watched loop: a batch-1 config printed zero collections."""
    config = write_job(tmp_path, prompt_lines([("t0", "abc")]))          # batch_size 1
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gc.py"), "--config", str(config),
                           "--limit", "1", "--repeats", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 2 and "a batched lookahead job (generation.batch_size > 1)" in proc.stderr, proc.stderr
