"""scripts/half_precision.py on the tiny model: the job runs with its in-run baseline in half precision,
every prompt is counted identical or not, and each difference gets its position and generate's top-2
logit margin there (recomputed from generate's own logits)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from half_precision import first_difference, step_margins  # noqa: E402

from lp.models import tiny_random_llama  # noqa: E402


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_step_margins_are_generates_own():
    model = tiny_random_llama(vocab=64, seed=0).model
    prompt = [5, 9, 12, 5, 9]
    margins = step_margins(model, prompt, 6, [])
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=6, pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True)
    want = [float(l[0].topk(2).values[0] - l[0].topk(2).values[1]) for l in out.logits]
    assert len(margins) == 6 and margins == want and all(m >= 0 for m in margins)


def test_half_precision_script_on_a_tiny_job(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": p}) + "\n"
                               for i, p in enumerate(["abcabcab", "hello world, hello", "xyzzy xyzzy x"])))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "tiny-random-llama?vocab=98&seed=3", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 4, "guesses": 4, "lookup_candidates": 2},
        "data": {"source": "jsonl", "path": str(prompts)},
    }))
    out = tmp_path / "half.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "half_precision.py"), "--config", str(config), "--limit", "3",
           "--max-new-tokens", "40", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16" and report["prompts"] == 3
    assert report["identical"] == sum(r["identical"] for r in report["rows"])
    assert f"identical to generate in bfloat16: {report['identical']}/3" in proc.stdout
    for row in report["rows"]:
        if not row["identical"] and "margin" in row:
            assert 0 <= row["position"] < row["tokens"] and row["margin"] >= 0 and 0 <= row["as_small"] <= 1
            assert row["reference"] != row["ours"] and row["task_id"] in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--limit", "0"], "'--limit': 0 is not in the range x>=1"),
    (["--threads", "0"], "'--threads': 0 is not in the range x>=1"),
    (["--config", "nothere.yaml"], "config file not found: nothere.yaml"),
    (["--set", "lookahead.windw=3"], "did you mean lookahead.window?"),
    (["--json", "/nonexistent/x.json"], "/nonexistent is not a directory this process can write in"),
])
def test_bad_options_are_refused_before_the_job_runs(monkeypatch, args, message):
    """A bad option was a traceback (a config error, threads 0), or, for an unwritable --json, an error
    after the whole job had run and its figures were printed: now a usage line and exit 2, first."""
    from click.testing import CliRunner

    import half_precision

    monkeypatch.setattr(half_precision, "run_job", lambda *a, **k: pytest.fail("the job ran"))
    result = CliRunner().invoke(half_precision.main, args)
    assert result.exit_code == 2 and message in result.output, result.output
