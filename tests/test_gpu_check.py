"""The device check script runs on the CPU with --small and writes its JSON report."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_small_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--small", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and set(report["models"]) == {"tiny"}
    tiny = report["models"]["tiny"]
    assert [p["rows"] for p in tiny["forward_curve"]] == [1, 2, 4, 8, 16]
    assert all(p["seconds"] > 0 for p in tiny["forward_curve"])
    decode = tiny["decode"]
    assert decode["autoregressive"]["tokens"] == 16 and decode["autoregressive"]["tokens_per_s"] > 0
    look = decode["lookahead 4,4,4"]
    assert look["tokens"] == 16 and look["rounds"] >= 1 and look["host_ms_per_round"] >= 0
    assert look["same_as_autoregressive"]   # greedy lookahead is exact on random weights too
