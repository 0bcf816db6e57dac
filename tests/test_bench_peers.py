"""scripts/bench_peers.py on the tiny model: four systems in the CSV with sane figures, the
Markdown table written, and lp (one worker and two under torchrun) identical to autoregressive, in the
same forwards."""
import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_peers_tiny(tmp_path):
    out = tmp_path / "peers"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--model", "tiny-random-llama?vocab=64&seed=0",
           "--dtype", "float64", "--limit", "2", "--max-new-tokens", "24", "--world-size", "2", "--threads", "1",
           "--out-dir", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    with open(out / "peers.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["system"] for r in rows] == ["autoregressive", "prompt lookup (k=10)", "lp P=1 (15,5,15)",
                                           "lp P=2 (15,5,15)"]
    ar = rows[0]
    assert int(ar["tokens"]) == int(ar["forwards"]) > 0  # one forward per token
    assert float(ar["ratio_to_ar"]) == 1.0 and int(ar["ids_equal_ar"]) == 2
    for r in rows:
        tokens, forwards = int(r["tokens"]), int(r["forwards"])
        assert int(r["prompts"]) == 2
        assert 0 < tokens <= 2 * 24
        assert 0 < forwards <= tokens
        assert abs(float(r["S"]) - tokens / forwards) < 1e-9
        assert float(r["decode_seconds"]) > 0 and float(r["tokens_per_s"]) > 0 and float(r["ratio_to_ar"]) > 0
    for r in rows[2:]:  # lp is exact: the autoregressive ids, with one worker and with two
        assert int(r["ids_equal_ar"]) == 2
        assert int(r["tokens"]) == int(ar["tokens"])
    # the two lp rows run the same settings, one request per forward, and LP splits each round as it is:
    # the same forwards (the P-worker job once ran a job's own defaults: drafts from a suffix cache, batched)
    assert rows[3]["forwards"] == rows[2]["forwards"]
    table = (out / "peers.md").read_text()
    assert table.count("\n| ") == 5 and "| lp P=2 (15,5,15) |" in table
    assert "| lp P=2 (15,5,15) |" in proc.stdout
