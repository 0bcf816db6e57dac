"""scripts/bench_core.py on the tiny model: every system in the JSON report, lookahead with and
without lookup candidates and token trees identical to plain greedy, prompt lookup counted by its
forwards, SuffixDecoding simulated on the greedy ids."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_core_tiny(tmp_path):
    out = tmp_path / "core.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "tiny-random-llama?vocab=64&seed=0",
           "--dtype", "float64", "--limit", "3", "--max-new-tokens", "24", "--threads", "1", "--seeding", "on",
           "--prompt-lookup", "6", "--suffix-peer", "16,4;16,8", "--json-out", str(out), "--configs",
           "3,4,3;0,3,0,2,8,2;3,4,3,2,8,2;0,3,0,suffix_factor=4,suffix_tokens=16;"
           "0,3,0,suffix_factor=4,suffix_tokens=16,job_cache=true"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    systems = {s["system"]: s for s in report["systems"]}
    suffix, job = "0,3,0 S4x16", "0,3,0 S4x16+job"
    peers = ["SuffixDecoding B16 F4", "SuffixDecoding B16 F4 +global", "SuffixDecoding B16 F8",
             "SuffixDecoding B16 F8 +global"]
    assert list(systems) == ["plain greedy", "prompt lookup k=6", "3,4,3", "0,3,0 L2k8m2", "3,4,3 L2k8m2",
                             suffix, job] + peers
    plain = systems["plain greedy"]
    assert plain["tokens"] == plain["forwards"] == report["plain_tokens"] > 0
    assert plain["rows_per_decode_round"] == 1      # one row per decoding step, prefill left out
    for s in systems.values():
        assert s["same_as_plain"] == 3 and s["tokens"] == plain["tokens"]
        assert 1 <= s["compression"] == s["tokens"] / s["forwards"]
        assert s["rows_per_decode_round"] >= 1
        if s["system"] not in peers:
            assert s["rows_per_round"] > s["rows_per_decode_round"] and s["tokens_per_s"] > 0
    for peer in peers:                              # simulated: no forwards, no time
        assert systems[peer]["tokens_per_s"] is None and systems[peer]["simulated"]
    assert systems["prompt lookup k=6"]["host_ms_per_round"] is None
    for name in ("3,4,3", "0,3,0 L2k8m2", "3,4,3 L2k8m2", suffix, job):
        assert systems[name]["host_ms_per_round"] > 0
        assert 10 <= systems[name]["ops_per_round"] <= 30        # a round's own ops: tests/test_round_ops.py
    assert systems["plain greedy"]["ops_per_round"] is None
    # the tiny model's completions share n-grams from prompt to prompt: the job cache finds them
    assert systems[job]["forwards"] < systems[suffix]["forwards"]
    # a lookup-only round feeds the ordinary row plus at most 2 candidates of 8 tokens
    assert systems["0,3,0 L2k8m2"]["rows_per_round"] < systems["3,4,3 L2k8m2"]["rows_per_round"]
    assert "0,3,0 L2k8m2" in proc.stdout


def test_bench_core_float32_shares_onednn_linears_and_times_a_stock_copy(tmp_path):
    """float32: every system runs on the oneDNN-packed model (the ratio compares decoders); plain greedy
    also runs on a stock copy, with the same ids."""
    out = tmp_path / "core.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "tiny-random-llama?vocab=64&seed=0",
           "--limit", "2", "--max-new-tokens", "16", "--threads", "1", "--seeding", "on", "--json-out", str(out),
           "--configs", "0,3,0,suffix_factor=4,suffix_tokens=16"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["cpu_linear"] == "onednn" and "onednn linear kernels" in proc.stdout
    systems = {s["system"]: s for s in report["systems"]}
    assert list(systems) == ["plain greedy", "plain greedy, torch linear", "0,3,0 S4x16"]
    for s in systems.values():
        assert s["same_as_plain"] == 2 and s["tokens"] == report["plain_tokens"] and s["tokens_per_s"] > 0


def test_bench_core_applies_the_processors_to_every_system(tmp_path):
    """--repetition-penalty, --min-new-tokens, --no-repeat-ngram-size and --ban-chars reach plain greedy and
    lookahead alike (float64: the same ids), and change them; the processors' ops per round stay within their bound."""
    def run(*extra):
        out = tmp_path / "core.json"
        cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "tiny-random-llama?vocab=64&seed=0",
               "--dtype", "float64", "--limit", "2", "--max-new-tokens", "24", "--threads", "1", "--seeding", "on",
               "--json-out", str(out), "--configs", "3,4,3,2,8,2", *extra]
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text()), proc.stdout
    free, _ = run()
    report, stdout = run("--repetition-penalty", "1.5", "--min-new-tokens", "4", "--no-repeat-ngram-size", "2")
    assert report["repetition_penalty"] == 1.5 and "repetition_penalty 1.5, min_new_tokens 4" in stdout
    assert report["no_repeat_ngram_size"] == 2 and "no_repeat_ngram_size 2" in stdout
    assert all(s["same_as_plain"] == 2 for s in report["systems"])
    assert report["plain_tokens"] == report["systems"][1]["tokens"]
    assert report["systems"][1]["ops_per_round"] <= 60       # tests/test_round_ops.py: 30 + 30
    assert [s["tokens"] for s in report["systems"]] != [s["tokens"] for s in free["systems"]] or \
        report["systems"][1]["forwards"] != free["systems"][1]["forwards"]
    # a prefix_allowed_tokens_fn (plain decoding's) called row by row (lookahead's): the same ids, and changed
    banned, stdout = run("--ban-chars", "ABCDEFGHIJ")
    assert banned["ban_chars"] == "ABCDEFGHIJ" and "prefix_allowed_tokens_fn banning 'ABCDEFGHIJ'" in stdout
    assert all(s["same_as_plain"] == 2 for s in banned["systems"])
    assert [s["tokens"] for s in banned["systems"]] != [s["tokens"] for s in free["systems"]] or \
        banned["systems"][1]["forwards"] != free["systems"][1]["forwards"]


def test_configurations_that_share_a_label_keep_a_row_each():
    """Two configurations whose labels are the same (given twice, or differing in a key the label does
    not show) were summed into one row; each now has its own."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_core
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    variants = bench_core.parse_configs("0,4,0;0,4,0,row_budget=false;7,3,7")
    assert bench_core.unique_labels(variants) == ["0,4,0 #1", "0,4,0 #2", "7,3,7"]


def test_bench_core_rejects_a_bad_config():
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--configs", "3,4"]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "expected W,N,G or W,N,G,L,K,M" in proc.stderr


def test_bench_core_on_classeval_prompts(tmp_path):
    """--data classeval: the class skeletons of a ClassEval file, by task id, decoded exactly."""
    out = tmp_path / "core.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "tiny-random-llama?vocab=128&seed=0",
           "--dtype", "float64", "--data", "classeval", "--data-path", str(ROOT / "tests" / "data" / "classeval_mini.json"),
           "--limit", "2", "--max-new-tokens", "12", "--threads", "1", "--seeding", "on", "--configs", "0,3,0,2,8,2",
           "--json-out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["data"] == "classeval" and report["chat"] is False and report["prompts"] == 2
    assert all(s["same_as_plain"] == 2 for s in report["systems"])
    assert "ClassEvalMini_0" in proc.stderr and "ClassEvalMini_1" in proc.stderr and "ClassEvalMini_2" not in proc.stderr
    assert "2 ClassEval prompts" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["--data", "classeval", "--data-path", "nope.json"], "ClassEval file not found"),
    (["--chat"], "no chat template"),                                         # the tiny model is not an instruct model
    (["--configs", "3,3,3,window=5"], "window given by position already"),
    (["--json-out", "missing-dir/core.json"], "cannot write a file there"),  # before the run, not after it
    (["--configs", "0,3,0,tree_budget=abc"], "lookahead.tree_budget: 'abc' must be an integer"),
    (["--configs", "0,3,0,suffix_factor="], "lookahead.suffix_factor: None must be a number"),
    (["--configs", "0,3,0,tree_budget=["], "--configs"),                         # not YAML
    (["--prompt-lookup", "-1"], "--prompt-lookup"),
    (["--threads", "-1"], "--threads"),
    (["--limit", "0"], "Invalid value for '--limit'"),                       # the flag named, not data.limit
])
def test_bench_core_data_errors_are_usage_errors(tmp_path, args, needle):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "tiny-random-llama?vocab=64&seed=0",
           "--limit", "1", "--configs", "0,3,0,2,8,2", *args]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_bench_core_unknown_model_is_one_error_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--model", "no-such-model", "--limit", "1",
           "--configs", "3,3,3"]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "cannot load model 'no-such-model'" in proc.stderr
    assert "Traceback" not in proc.stderr
