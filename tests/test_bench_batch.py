"""scripts/bench_batch.py on the embedded default job, 2 prompts of 16 tokens: every system in the JSON
report with its ids-equal count, lp's rows per decoding round without the prefills, and lp's batched decoding (without and with drafts, at batch 1 and 2)
token-identical to transformers generate at batch 1, the reference (greedy, float32)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_batch_on_the_default_job(tmp_path):
    out = tmp_path / "batch.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_batch.py"), "--config",
           str(ROOT / "configs" / "humaneval-smollm2.yaml"), "--limit", "2", "--set", "generation.max_new_tokens=16",
           "--batches", "1,2", "--generate-batches", "1,2", "--set", "generation.batch_size=2",
           "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["prompts"] == 2 and report["max_new_tokens"] == 16 and report["reference"] == "generate 1"
    assert report["limit"] == 2        # the --limit given (once the model's position count)
    systems = {s["system"]: s for s in report["systems"]}
    lp = ["lp no drafts 1", "lp no drafts 2", "lp lookahead 1", "lp lookahead 2"]
    cb = [] if report["transformers_cb_error"] else ["transformers CB 1", "transformers CB 2"]
    assert list(systems) == ["generate 1", "generate 2", *cb, *lp]
    if report["transformers_cb_error"]:
        assert "transformers continuous batching: n/a (" in proc.stdout
    reference = systems["generate 1"]["ids"]
    assert list(reference) == report["task_ids"] and all(reference.values())
    for s in systems.values():
        assert s["tokens"] > 0 and s["tokens_per_s"] > 0 and s["latency_p50"] > 0
        assert isinstance(s["ids_equal"], int) and 0 <= s["ids_equal"] <= 2
        assert s["tokens"] == sum(len(ids) for ids in s["ids"].values() if ids)
        assert s["latency_p50"] <= max(s["latencies"]) and s["latency_mean"] == sum(s["latencies"]) / 2
    assert systems["generate 1"]["ids_equal"] == 2
    for name in lp:                             # exact greedy: lp's ids are generate's, batched or not
        assert systems[name]["ids"] == reference and systems[name]["ids_equal"] == 2, name
        assert systems[name]["errors"] == [] and systems[name]["mean_batch"] >= 1
    for b in (1, 2):
        assert systems[f"lp no drafts {b}"]["compression"] == 1.0            # one token per request-forward
        assert systems[f"lp lookahead {b}"]["compression"] >= 1.0
    assert systems["lp no drafts 1"]["mean_batch"] == 1.0 and systems["lp no drafts 2"]["mean_batch"] > 1.0
    # rows per decoding round leave the prefills out: no drafts feed one row per request and round
    assert systems["lp no drafts 1"]["rows_per_decoding_round"] == 1.0
    assert 1.0 < systems["lp no drafts 2"]["rows_per_decoding_round"] <= 2.0
    assert systems["lp no drafts 2"]["rows_per_forward"] > systems["lp no drafts 2"]["rows_per_decoding_round"]
    ratios = report["ratios"]
    assert ratios["lp_lookahead_best_over_generate_best"] > 0 and ratios["latency_p50_base_batch"] == 1
    assert set(ratios["lp_lookahead_over_no_drafts"]) == {"1", "2"}
    means = ratios["lp_lookahead_mean_over_base_mean"]       # mean latency, what Little's law ties to tok/s
    assert means["1"] == 1.0 and means["2"] == systems["lp lookahead 2"]["latency_mean"] / systems[
        "lp lookahead 1"]["latency_mean"]
    assert "lp lookahead mean latency / its B=1 mean: B=1 1.00, B=2" in proc.stdout
    one, two = systems["lp lookahead 1"], systems["lp lookahead 2"]    # Little's law, with the admitted column
    assert two["admitted"] == sum(two["latencies"]) / two["seconds"] and 0 < one["admitted"] <= 1.0 + 1e-9
    assert means["2"] == pytest.approx(two["admitted"] / one["admitted"] * one["tokens_per_s"] / two["tokens_per_s"])
    assert "best lp lookahead / best transformers generate:" in proc.stdout
    assert "lp lookahead / lp no drafts, tok/s: B=1" in proc.stdout
    assert ratios["job_batch"] == 2 and ratios["job_batch_over_generate_best"] > 0   # the config's own batch size
    assert "the config's batch size B=2:" in proc.stdout


def test_bench_batch_can_leave_the_no_drafts_columns_out(tmp_path):
    """--no-drafts-batches none: lp with drafts and generate only (the 164-prompt run's shape)."""
    out = tmp_path / "batch.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_batch.py"), "--limit", "1", "--set",
           "generation.max_new_tokens=8", "--batches", "1", "--generate-batches", "1", "--cb-batches", "none",
           "--no-drafts-batches", "none", "--json", str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [s["system"] for s in report["systems"]] == ["generate 1", "lp lookahead 1"]
    assert report["ratios"]["lp_lookahead_over_no_drafts"] == {} and "lp no drafts" not in proc.stdout
    assert report["systems"][1]["ids_equal"] == 1


def test_bench_batch_leaves_out_prompts_a_job_could_not_decode(tmp_path):
    """A prompt a job would record as an error (here an empty one) is left out with its reason; with
    nothing left the command is a usage error, not a traceback from generate."""
    data = tmp_path / "p.jsonl"
    data.write_text('{"task_id": "e", "prompt": ""}\n{"task_id": "a", "prompt": "abcabc"}\n')
    base = [sys.executable, str(ROOT / "scripts" / "bench_batch.py"), "--set", "model.name=tiny-random-llama?vocab=64",
            "--set", "data.source=jsonl", "--set", "data.chat_template=false", "--set", "generation.max_new_tokens=4",
            "--set", "generation.stop=[]", "--batches", "1", "--generate-batches", "1", "--cb-batches", "none",
            "--no-drafts-batches", "none"]
    run = lambda *more: subprocess.run([*base, *more], env=dict(os.environ, PYTHONPATH=str(ROOT)),  # noqa: E731
                                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    proc = run("--set", f"data.path={data}")
    assert proc.returncode == 0 and "left out e: p.jsonl:1: prompt is empty" in proc.stderr, proc.stderr[-3000:]
    only_empty = tmp_path / "e.jsonl"
    only_empty.write_text('{"task_id": "e", "prompt": ""}\n')
    proc = run("--set", f"data.path={only_empty}")
    assert proc.returncode == 2 and "none of the 1 selected prompts can be decoded" in proc.stderr
    assert "Traceback" not in proc.stderr
    # stop strings on a tokenizer generate cannot match them with (the tiny model's): a usage line, not
    # generate's AttributeError after the warm-up
    proc = run("--set", f"data.path={data}", "--set", 'generation.stop=["cab"]')
    assert proc.returncode == 2 and "generate cannot take stop strings with the tokenizer" in proc.stderr
    assert "Traceback" not in proc.stderr
