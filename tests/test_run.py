"""End to end: `python -m lp.run` on the tiny random model writes consistent results and summary."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from click.testing import CliRunner

from lp.config import load_config
from lp.models import load_model
from lp.run import main

TINY = "tiny-random-llama?vocab=64&seed=0"
PROMPTS = [
    {"task_id": "t/0", "prompt": "def add(a, b):\n    return"},
    {"task_id": "t/1", "prompt": "abc abc abc abc"},
    {"task_id": "t/2", "prompt": "Once upon a time"},
]
RECORD_KEYS = {"task_id", "prompt_tokens", "completion", "token_ids", "new_tokens", "forwards",
               "compression", "decode_seconds", "finish_reason"}


@pytest.fixture
def job(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 3, "guesses": 4, "pool_seeding": True},
        "generation": {"max_new_tokens": 16},
        "data": {"source": "jsonl", "path": str(prompts)},
        "output": {"dir": str(tmp_path / "out")},
    }))
    return config, tmp_path / "out"


def read_results(out):
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def greedy(model, ids, steps, eos):
    """Plain greedy decoding with full causal forwards: the reference output."""
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids], device=model.device)).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in eos:
                break
    return out


def test_end_to_end(job):
    config, out = job
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert str(out / "results.jsonl") in result.stdout and "S = " in result.stdout

    records = read_results(out)
    assert [r["task_id"] for r in records] == [p["task_id"] for p in PROMPTS]
    loaded = load_model(TINY, dtype="float64", device="cpu")
    for record, prompt in zip(records, PROMPTS):
        assert RECORD_KEYS <= record.keys()
        ids = loaded.tokenizer.encode(prompt["prompt"])
        assert record["prompt_tokens"] == len(ids)
        assert record["new_tokens"] == len(record["token_ids"]) <= 16
        assert record["finish_reason"] in {"eos", "length", "stop"}
        if record["finish_reason"] == "length":
            assert record["new_tokens"] == 16
        assert 1 <= record["forwards"] <= record["new_tokens"] + 1
        assert record["compression"] == pytest.approx(record["new_tokens"] / record["forwards"])
        # no stop strings here: the completion is the whole decoded output, special tokens skipped
        assert record["completion"] == loaded.tokenizer.decode(record["token_ids"], skip_special_tokens=True)
        # the wiring is exact: same tokens as plain greedy decoding of the same prompt ids
        assert record["token_ids"] == greedy(loaded.model, ids, 16, set(loaded.eos_token_ids))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 3
    assert summary["model"] == loaded.name
    assert summary["new_tokens"] == sum(r["new_tokens"] for r in records)
    assert summary["forwards"] == sum(r["forwards"] for r in records)
    assert summary["compression"] == pytest.approx(summary["new_tokens"] / summary["forwards"])
    assert summary["decode_seconds"] == pytest.approx(sum(r["decode_seconds"] for r in records))
    assert summary["tokens_per_second"] == pytest.approx(summary["new_tokens"] / summary["decode_seconds"])
    assert sum(summary["finish_reasons"].values()) == 3
    assert summary["lookahead"] == {"window": 4, "ngram": 3, "guesses": 4, "pool_seeding": True}
    assert summary["host_ms_per_round"] >= 0 and summary["rounds"] == sum(r["rounds"] for r in records)
    # the resolved config is saved and loads back to the same job
    assert load_config(out / "config.yaml") == load_config(config)
    assert summary["config"] == load_config(config).to_dict()
    assert not list(out.glob(".*.tmp"))


def test_rerun_replaces_results_and_set_applies(job):
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["--config", str(config), "--quiet",
                                  "--set", "data.limit=2", "--set", "generation.max_new_tokens=5"])
    assert result.exit_code == 0, result.output
    assert "INFO" not in result.stderr  # --quiet: no progress messages
    records = read_results(out)
    assert [r["task_id"] for r in records] == ["t/0", "t/1"]
    assert all(r["new_tokens"] <= 5 for r in records)
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["limit"] == 2


def test_progress_is_logged(job):
    config, _ = job
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0
    assert "[3/3] t/2" in result.stderr


def test_missing_prompt_file_exits_1_before_model_load(job, tmp_path):
    config, out = job
    result = CliRunner().invoke(main, ["--config", str(config), "--set", f"data.path={tmp_path}/none.jsonl"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: prompt file not found")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_model_load_error_exits_1(job, tmp_path):
    config, _ = job
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set",
                                       f"model.name={tmp_path}/no-such-model.gguf"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "no-such-model.gguf" in result.stderr
    assert "Traceback" not in result.output


def test_python_dash_m_entry_point(job):
    """`python -m lp.run` works as a program: config errors exit 2 with no traceback."""
    config, _ = job
    proc = subprocess.run([sys.executable, "-m", "lp.run", "--config", str(config),
                           "--set", "lookahead.ngram=2"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "lookahead.ngram: 2" in proc.stderr and "Traceback" not in proc.stderr
