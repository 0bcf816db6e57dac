"""configs/classeval-smollm2.yaml on the embedded model and the real ClassEval file (slow; skipped
where ../shared/data/ClassEval_data.json is absent): the chat-mode job runs, its output equals the
in-run generate baseline, its answers are whole classes and the unittest classes run on them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lp.jobs.code import chat_completion
from lp.jobs.data import read_classeval

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "ClassEval_data.json"


@pytest.mark.skipif(not SHARED.is_file(), reason="../shared/data/ClassEval_data.json is not in this checkout")
def test_classeval_job_on_the_embedded_model(tmp_path):
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "lp.run", "--config", str(ROOT / "configs" / "classeval-smollm2.yaml"), "--quiet",
           "--set", f"data.path={SHARED}", "--set", "data.limit=2", "--set", "generation.max_new_tokens=64",
           "--set", "output.evaluate=true", "--set", f"output.dir={out}"]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=1800, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = read_classeval(SHARED)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["ClassEval_0", "ClassEval_1"]
    for r in records:
        assert r["baseline_ids_equal"] is True
        assert r["response"].startswith("```python\n")
        assert r["completion"] == chat_completion(r["response"], tasks[r["task_id"]]["skeleton"])
        assert f"class {tasks[r['task_id']]['class_name']}" in r["completion"]  # it writes the class
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluated"] == 2 and summary["baseline_ids_equal_fraction"] == 1.0
    outcomes = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [o["task_id"] for o in outcomes] == ["ClassEval_0", "ClassEval_1"]
