"""The README's main command on the embedded model (shortened with --set): it runs,
writes the job files and prints where they are and the summary figures."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_main_command_on_the_embedded_model(tmp_path):
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "lp.run", "--config", str(ROOT / "configs" / "humaneval-smollm2.yaml"),
           "--set", "data.limit=2", "--set", "generation.max_new_tokens=24", "--set", f"output.dir={out}"]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out / "results.jsonl") in proc.stdout and str(out / "summary.json") in proc.stdout
    assert "S = " in proc.stdout and "tokens/s" in proc.stdout
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["HumanEval/0", "HumanEval/1"]
    assert all(1 <= r["new_tokens"] <= 24 and r["finish_reason"] in ("eos", "length", "stop") for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["new_tokens"] == sum(r["new_tokens"] for r in records)
    assert (out / "samples.jsonl").exists()
