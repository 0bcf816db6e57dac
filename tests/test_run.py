"""End to end: `python -m lp.run` on the tiny random model writes consistent results and summary."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import yaml
from click.testing import CliRunner

import lp.jobs.runner
from lp.jobs.summary import RUN_KEYS
import lp.run
from pathlib import Path

from lp.engine import LookaheadParams
from lp.jobs.code import CHAT_CODE_STOP, chat_completion, chat_message, parses
from lp.jobs.config import CODE_COMPLETION_STOP, JOB_LOOKAHEAD, load_config
from lp.models import LoadedModel, TinyTokenizer, load_model
from lp.jobs.data import prompt_digest
from lp.jobs.results import JobDir
from lp.run import main
from reference import full_forward_greedy

TINY = "tiny-random-llama?vocab=64&seed=0"
PROMPTS = [
    {"task_id": "t/0", "prompt": "def add(a, b):\n    return"},
    {"task_id": "t/1", "prompt": "abc abc abc abc"},
    {"task_id": "t/2", "prompt": "Once upon a time"},
]
RECORD_KEYS = {"task_id", "line", "prompt_hash", "prompt_tokens", "response", "completion", "token_ids", "new_tokens", "forwards",
               "compression", "decode_seconds", "finish_reason", "error", "method"}
BASELINE_KEYS = {"baseline_token_ids", "baseline_new_tokens", "baseline_decode_seconds", "baseline_finish_reason",
                 "baseline_ids_equal"}


@pytest.fixture
def job(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 3, "guesses": 4, "pool_seeding": True},
        "generation": {"max_new_tokens": 16, "batch_size": 1},
        "data": {"source": "jsonl", "path": str(prompts)},
        "output": {"dir": str(tmp_path / "out")},
    }))
    return config, tmp_path / "out"


def read_results(out):
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_end_to_end(job):
    config, out = job
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert str(out / "results.jsonl") in result.stdout and "S = " in result.stdout

    records = read_results(out)
    assert [r["task_id"] for r in records] == [p["task_id"] for p in PROMPTS]
    loaded = load_model(TINY, dtype="float64", device="cpu")
    for record, prompt in zip(records, PROMPTS):
        assert RECORD_KEYS <= record.keys() and not BASELINE_KEYS & record.keys()
        assert record["error"] is None and record["method"] == "lookahead"
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
        assert record["response"] == record["completion"]  # not the chat mode: nothing is extracted
        # the wiring is exact: same tokens as plain greedy decoding of the same prompt ids
        assert record["token_ids"] == full_forward_greedy(loaded.model, ids, 16, set(loaded.eos_token_ids))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 3 and summary["errors"] == 0 and summary["method"] == "lookahead"
    assert "speedup" not in summary and "pass_at_1" not in summary and "parsed" not in summary  # jsonl: not code
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples == [{"task_id": r["task_id"], "completion": r["completion"]} for r in records]
    assert summary["model"] == loaded.name
    assert summary["linear_kernels"] == "torch"     # float64: oneDNN packs float32 and bfloat16 only
    assert summary["new_tokens"] == sum(r["new_tokens"] for r in records)
    assert summary["forwards"] == sum(r["forwards"] for r in records)
    assert summary["compression"] == pytest.approx(summary["new_tokens"] / summary["forwards"])
    assert summary["decode_seconds"] == pytest.approx(sum(r["decode_seconds"] for r in records))
    assert summary["tokens_per_second"] == pytest.approx(summary["new_tokens"] / summary["decode_seconds"])
    assert sum(summary["finish_reasons"].values()) == 3
    assert summary["lookahead"] == dataclasses.asdict(
        LookaheadParams(**{**JOB_LOOKAHEAD, "window": 4, "ngram": 3, "guesses": 4, "pool_seeding": True}))
    assert summary["host_ms_per_round"] >= 0 and summary["rounds"] == sum(r["rounds"] for r in records)
    # the resolved config is saved and loads back to the same job
    assert load_config(out / "config.yaml") == load_config(config)
    assert summary["config"] == load_config(config).to_dict()
    assert not list(out.glob(".*.tmp"))


def test_rerun_with_another_config_is_refused_unless_forced(job):
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    before = (out / "results.jsonl").read_text()
    changed = ["--set", "data.limit=2", "--set", "generation.max_new_tokens=5"]
    result = runner.invoke(main, ["--config", str(config), "--quiet", *changed])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "different config" in lines[0] and "--force" in lines[0]
    assert "generation.max_new_tokens: 16 -> 5" in lines[0]
    assert "data.limit" not in lines[0]        # which prompts run changes no record
    assert (out / "results.jsonl").read_text() == before  # nothing touched
    assert yaml.safe_load((out / "config.yaml").read_text())["generation"]["max_new_tokens"] == 16

    # --force resumes: the records stay, the job (2 prompts, all done) writes its summary over them
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--force", *changed])
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text() == before
    assert json.loads((out / "summary.json").read_text())["prompts"] == 2
    assert yaml.safe_load((out / "config.yaml").read_text())["generation"]["max_new_tokens"] == 5


def test_resume_with_another_prompt_selection(job):
    """data.limit and data.offset change no record: a job tried on its first prompt resumes on all of
    them (decoding only the new ones), and one narrowed to a prompt sums only that prompt's record."""
    config, out = job
    runner = CliRunner()
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=1"])
    assert result.exit_code == 0, result.output
    first = (out / "results.jsonl").read_text()
    assert [r["task_id"] for r in read_results(out)] == ["t/0"]
    result = runner.invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text().startswith(first)     # the kept record, then the new ones
    records = read_results(out)
    assert [r["task_id"] for r in records] == ["t/0", "t/1", "t/2"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 3 and summary["job_prompts"] == 2
    whole = (out / "results.jsonl").read_text()
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--set", "data.offset=1", "--set",
                                  "data.limit=1"])
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text() == whole    # nothing decoded again
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 1 and summary["job_prompts"] == 0
    assert summary["new_tokens"] == records[1]["new_tokens"]
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["offset"] == 1


def test_a_moved_prompt_file_resumes(job, tmp_path):
    """data.path changes no record: a job whose prompt file moved resumes from the new path, decoding only
    the prompts without a record; an edit under the new path is still caught by the prompt hashes."""
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=2"]).exit_code == 0
    kept = (out / "results.jsonl").read_text()
    moved = tmp_path / "moved" / "prompts.jsonl"
    moved.parent.mkdir()
    moved.write_text((tmp_path / "prompts.jsonl").read_text())
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--set", f"data.path={moved}"])
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text().startswith(kept)
    assert [r["task_id"] for r in read_results(out)] == ["t/0", "t/1", "t/2"]
    assert json.loads((out / "summary.json").read_text())["job_prompts"] == 1
    moved.write_text(moved.read_text().replace("Once upon a time", "Once upon a midnight"))
    edited = runner.invoke(main, ["--config", str(config), "--quiet", "--set", f"data.path={moved}"])
    assert edited.exit_code == 2 and "t/2" in edited.stderr and "prompt has changed" in edited.stderr


def test_resume_after_a_prompt_changed_is_refused_unless_forced(job, tmp_path):
    """An edited prompt file under an unchanged config: the kept record of the edited task is stale, so
    the resume is refused (exit 2, naming the task); --force keeps the old record."""
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=2"]).exit_code == 0
    before = (out / "results.jsonl").read_text()
    assert [r["prompt_hash"] for r in read_results(out)] == [prompt_digest(p["prompt"]) for p in PROMPTS[:2]]
    edited = [PROMPTS[0], {**PROMPTS[1], "prompt": "xyz xyz xyz"}, PROMPTS[2]]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in edited))
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=2"])
    assert result.exit_code == 2, result.output
    assert "1 task whose prompt has changed since (t/1)" in result.stderr and "--force" in result.stderr
    assert (out / "results.jsonl").read_text() == before
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--force", "--set", "data.limit=2"])
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text() == before


def test_fresh_starts_over_and_set_applies(job):
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--fresh",
                                  "--set", "data.limit=2", "--set", "generation.max_new_tokens=5"])
    assert result.exit_code == 0, result.output
    assert "INFO" not in result.stderr  # --quiet: no progress messages
    records = read_results(out)
    assert [r["task_id"] for r in records] == ["t/0", "t/1"]
    assert all(r["new_tokens"] <= 5 for r in records)
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["limit"] == 2


def test_float32_job_runs_on_onednn_linears_unless_told_not_to(job):
    """model.cpu_linear auto: a float32 CPU job runs oneDNN's packed linears, and still decodes what
    plain greedy decoding on that model decodes; cpu_linear torch keeps the stock kernels."""
    config, out = job
    runner = CliRunner()
    result = runner.invoke(main, ["--config", str(config), "--set", "model.dtype=float32"])
    assert result.exit_code == 0, result.output
    assert "(onednn linear kernels)" in result.stderr
    assert json.loads((out / "summary.json").read_text())["linear_kernels"] == "onednn"
    fast = load_model(TINY, dtype="float32", device="cpu", cpu_linear="onednn")
    for record, prompt in zip(read_results(out), PROMPTS):
        ids = fast.tokenizer.encode(prompt["prompt"])
        assert record["token_ids"] == full_forward_greedy(fast.model, ids, 16, set(fast.eos_token_ids))
    result = runner.invoke(main, ["--config", str(config), "--fresh", "--set", "model.dtype=float32",
                                  "--set", "model.cpu_linear=torch"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["linear_kernels"] == "torch"


def test_neutral_keys_do_not_block_a_resume(job):
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--set", "distributed.timeout_s=9",
                                  "--set", "output.evaluate_timeout_s=3"])
    assert result.exit_code == 0, result.output


def test_rerun_of_a_finished_job_decodes_nothing(job, monkeypatch):
    config, out = job
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    first = json.loads((out / "summary.json").read_text())
    before = (out / "results.jsonl").read_text()

    def no_decoding(*args, **kwargs):
        raise AssertionError("a finished prompt was decoded again")
    monkeypatch.setattr(lp.jobs.runner, "lookahead_generate", no_decoding)
    result = runner.invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "3 of 3 prompts already have a record" in result.stderr
    assert (out / "results.jsonl").read_text() == before
    again = json.loads((out / "summary.json").read_text())
    assert again["job_prompts"] == 0 and first["job_prompts"] == 3        # this run's own figures
    drop = lambda summary: {k: v for k, v in summary.items() if k not in RUN_KEYS}  # noqa: E731
    assert drop(again) == drop(first)  # timing sums (and latency) come from the records too


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


def test_check_stops_before_the_model_and_writes_nothing(job, tmp_path, monkeypatch):
    """--check: the config, the prompts, the output directory and the model's source as a run would find
    them, one line, no model loaded and nothing written; what a run would refuse it refuses with the run's status."""
    config, out = job
    check = lambda *more: CliRunner().invoke(main, ["--config", str(config), "--check", *more])  # noqa: E731
    loads = []
    monkeypatch.setattr(lp.jobs.runner, "load_model", lambda *a, **k: loads.append(a))
    result = check()
    assert result.exit_code == 0 and result.stdout == f"ok: {config}: 3 of 3 prompts to decode into {out}\n"
    assert not out.exists() and not loads
    monkeypatch.undo()
    assert CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=2"]).exit_code == 0
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    assert check().stdout.endswith("1 of 3 prompts to decode into " + str(out) + "\n")
    refused = check("--set", "generation.max_new_tokens=9")
    assert refused.exit_code == 2 and "holds 2 results made with a different config" in refused.stderr
    assert check("--set", "generation.max_new_tokens=9", "--fresh").stdout.endswith("3 of 3 prompts to decode "
                                                                                      f"into {out}\n")
    assert check("--set", "generation.max_new_tokens=9", "--force").exit_code == 0
    missing = check("--set", f"data.path={tmp_path}/none.jsonl")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: prompt file not found")
    assert check("--set", "lookahead.ngram=2").exit_code == 2
    for name, says in ((f"{tmp_path}/none.gguf", "GGUF file not found"), (f"{tmp_path}/none", "model directory not "
                       "found"), ("nobody/no-such-model", "it is not in the cache"), ("tiny-random-nofamily",
                       "unknown model 'tiny-random-nofamily'")):
        unfound = check("--fresh", "--set", f"model.name={name}")    # a run finds it after its workers start
        assert unfound.exit_code == 1 and unfound.stderr.startswith("error: ") and says in unfound.stderr, name
    holder = JobDir(out)
    holder._take_lock()                     # a run in progress
    busy = check()
    assert busy.exit_code == 1 and busy.stderr == f"error: {out} is in use by another run\n"
    holder.close()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written       # --fresh discarded nothing either


def test_check_counts_the_bad_lines_it_will_record_as_errors(job, tmp_path):
    """Bad lines are among the prompts --check counts (a run records each as an error): it says how many."""
    config, out = job
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(prompts.read_text() + "{broken\n" + json.dumps({"task_id": "e", "prompt": ""}) + "\n")
    result = CliRunner().invoke(main, ["--config", str(config), "--check"])
    assert result.exit_code == 0
    assert result.stdout == f"ok: {config}: 5 of 5 prompts to decode into {out} (2 of them bad lines, to be " \
                            f"recorded as errors)\n"


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 171798691920 bytes. Error code 12 (Cannot allocate memory)\nframes..."),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), MemoryError()])
def test_running_out_of_memory_is_one_line_that_says_what_to_lower(job, monkeypatch, error):
    def run_job(*args, **kwargs):
        raise error
    monkeypatch.setattr(lp.run, "run_job", run_job)
    result = CliRunner().invoke(main, ["--config", str(job[0]), "--quiet"])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert result.stderr.startswith("error: out of memory (") and "lower generation.batch_size" in result.stderr


def test_a_cache_larger_than_free_memory_is_refused_before_allocating(job, monkeypatch):
    """The K/V cache is sized for prompt + max_new_tokens up front: one that would not fit in the free
    memory (CPU: MemAvailable) is refused with its size before torch allocates it (a CPU process would be
    killed mid-allocation instead), as one out-of-memory line that says what to lower."""
    import lp.decode.kv_cache as kv_cache

    assert kv_cache.free_bytes(torch.device("cpu")) is None or kv_cache.free_bytes(torch.device("cpu")) > 2**20
    monkeypatch.setattr(kv_cache, "free_bytes", lambda device: 1000)
    result = CliRunner().invoke(main, ["--config", str(job[0]), "--quiet", "--fresh"])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert result.stderr.startswith("error: out of memory (MemoryError: the K/V cache of 1 request row(s) x 256 "
                                    "slots needs ")
    assert " MiB and cpu has 0.0 MiB free: lower max_new_tokens" in result.stderr
    assert "lower generation.batch_size, generation.max_new_tokens or" in result.stderr


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


def write_job(tmp_path, lines, **sections):
    """A tiny-model job over a JSONL file written from `lines` (dicts are dumped, strings kept)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    cfg = {
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 3, "guesses": 4},
        "generation": {"max_new_tokens": 12, "batch_size": 1},   # one request at a time
        "data": {"source": "jsonl", "path": str(prompts), "limit": None},
        "output": {"dir": str(tmp_path / "out")},
    }
    for name, values in sections.items():
        cfg[name] = cfg.get(name, {}) | values
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, tmp_path / "out"


def test_bad_inputs_become_error_records_and_the_job_goes_on(tmp_path):
    config, out = write_job(tmp_path, [
        {"task_id": "empty", "prompt": ""},
        {"task_id": "long", "prompt": "x" * 2100},     # the tiny model has 2048 positions
        '{"task_id": "broken", "prompt": ',            # not JSON
        {"task_id": "good", "prompt": "abc abc abc"},
    ])
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    records = read_results(out)
    assert [r["task_id"] for r in records] == ["empty", "long", "<line 3>", "good"]
    errors = [r for r in records if r["finish_reason"] == "error"]
    assert len(errors) == 3 and all(r["error"] and r["completion"] is None and r["new_tokens"] == 0 for r in errors)
    assert [r["line"] for r in errors] == [1, 2, 3]
    assert "prompt is empty" in errors[0]["error"]
    assert "2100 tokens" in errors[1]["error"] and "2048" in errors[1]["error"]
    assert errors[1]["prompt_tokens"] == 2100
    assert errors[2]["error"].startswith("prompts.jsonl:3: not valid JSON")
    good = records[3]
    assert good["error"] is None and good["finish_reason"] in {"eos", "length"} and good["new_tokens"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 4 and summary["errors"] == 3 and summary["finish_reasons"]["error"] == 3
    assert summary["new_tokens"] == good["new_tokens"] and summary["forwards"] == good["forwards"]
    assert [json.loads(line)["task_id"] for line in (out / "samples.jsonl").read_text().splitlines()] == ["good"]
    assert "3 errors" in result.stdout
    assert "prompts.jsonl:3" in result.stderr  # logged as it happens


def test_a_job_whose_every_prompt_is_an_error_exits_1(tmp_path):
    """The records and the summary are written as for any job, but the exit status says nothing was
    decoded (a pipeline must not take it for a finished job)."""
    config, out = write_job(tmp_path, [{"task_id": "empty", "prompt": ""}, '{"task_id": "broken", "prompt": '])
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 1, result.output
    assert "no prompt could be decoded: all 2 are error records" in result.stderr
    assert "Traceback" not in result.output
    assert [r["finish_reason"] for r in read_results(out)] == ["error", "error"]
    assert json.loads((out / "summary.json").read_text())["errors"] == 2


def test_prompt_that_leaves_no_room_for_max_new_tokens_is_an_error(tmp_path):
    config, out = write_job(tmp_path, [{"task_id": "fits", "prompt": "a" * 2040},
                                       {"task_id": "too-long", "prompt": "a" * 2041}],
                            generation={"max_new_tokens": 8})
    assert CliRunner().invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    fits, too_long = read_results(out)
    assert fits["error"] is None and too_long["finish_reason"] == "error"
    # where the prompt is, as a bad line's error says: the file and the line
    assert too_long["error"].startswith("prompts.jsonl:2: prompt has 2041 tokens, more than the model's context "
                                        "of 2048 positions minus generation.max_new_tokens=8 allows (2040)")
    assert too_long["line"] == 2


def test_max_new_tokens_past_the_models_positions_is_one_line_before_any_prompt(tmp_path):
    """No prompt can fit when generation.max_new_tokens alone fills the model's 2048 positions: one line
    naming the key, exit 1, no record (before, every prompt became an error record)."""
    config, out = write_job(tmp_path, [{"task_id": "a", "prompt": "abc"}], generation={"max_new_tokens": 2048})
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 1 and result.stderr.startswith(
        "error: generation.max_new_tokens=2048 leaves no room for a prompt in the 2048 positions of "), result.output
    assert "set it below 2048" in result.stderr and read_results(out) == []


@pytest.mark.parametrize("method", ["lookahead", "autoregressive"])
@pytest.mark.parametrize("key,value", [("forced_eos_token_id", [100000]), ("bad_words_ids", [[5], [7, 100000]]),
                                       ("sequence_bias", [[[100000], 1.0]])])
def test_token_ids_past_the_models_logits_are_one_line_before_any_prompt(tmp_path, method, key, value):
    """A processor key's token id past the model's logits: one line naming the key, exit 1, no record. Before,
    lookahead forced token 0 for an unknown forced EOS id and ignored an unknown bad word, while generate
    (the autoregressive method) failed on both with a traceback."""
    config, out = write_job(tmp_path, [{"task_id": "a", "prompt": "abc"}],
                            generation={key: value, "method": method})
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 1 and result.stderr.startswith(
        f"error: generation.{key}: token ids [100000] are past the model's "), result.output
    assert "Traceback" not in result.output and read_results(out) == []


def test_baseline_in_the_same_run(tmp_path):
    config, out = write_job(tmp_path, PROMPTS, baseline={"enabled": True})
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_results(out)
    for r in records:
        assert BASELINE_KEYS <= r.keys()
        assert r["baseline_ids_equal"] is True and r["baseline_token_ids"] == r["token_ids"]  # float64: exact
        assert r["baseline_new_tokens"] == r["new_tokens"] and r["baseline_finish_reason"] == r["finish_reason"]
        assert r["baseline_decode_seconds"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline_ids_equal_fraction"] == 1.0 and summary["baseline_prompts"] == 3
    assert summary["baseline_new_tokens"] == summary["new_tokens"]
    assert summary["baseline_tokens_per_second"] == pytest.approx(
        summary["baseline_new_tokens"] / summary["baseline_decode_seconds"])
    assert summary["speedup"] == pytest.approx(summary["tokens_per_second"] / summary["baseline_tokens_per_second"])
    assert "speedup" in result.stdout and "100.0% of 3 prompts" in result.stdout


def test_speedup_compares_the_records_that_have_a_baseline(tmp_path):
    """A --force resume that turns the baseline on: 2 records without its figures, 1 with. speedup is
    lookahead's tokens/s over the baseline's on that one record (it took the rate of all three)."""
    config, out = write_job(tmp_path, PROMPTS)
    assert CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=2"]).exit_code == 0
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--force", "--set", "baseline=true"])
    assert result.exit_code == 0, result.output
    (compared,) = [r for r in read_results(out) if "baseline_token_ids" in r]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline_prompts"] == 1 and summary["prompts"] == 3
    assert summary["speedup"] == pytest.approx((compared["new_tokens"] / compared["decode_seconds"])
                                               / (compared["baseline_new_tokens"] / compared["baseline_decode_seconds"]))


def test_a_jobs_processors_match_generates(tmp_path):
    """generation.repetition_penalty, min_new_tokens, no_repeat_ngram_size and bad_words_ids reach both
    lookahead and the in-run baseline
    (transformers' generate with the same knobs): float64, the ids are equal, and the knobs change them
    (in a batched job too)."""
    knobs = {"repetition_penalty": 1.5, "min_new_tokens": 10, "max_new_tokens": 24, "no_repeat_ngram_size": 3,
             "bad_words_ids": [[40, 40], [13]]}
    config, out = write_job(tmp_path, PROMPTS, baseline={"enabled": True}, generation=knobs)
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_results(out)
    assert all(r["baseline_ids_equal"] is True for r in records), [(r["token_ids"], r["baseline_token_ids"])
                                                                    for r in records]
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--fresh", "--set", "baseline.enabled=false",
                                       "--set", "generation.batch_size=3"])
    assert result.exit_code == 0, result.output
    assert [r["token_ids"] for r in read_results(out)] == [r["token_ids"] for r in records]
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--fresh", "--set", "baseline.enabled=false",
                                       "--set", "generation.repetition_penalty=1.0"])
    assert result.exit_code == 0, result.output
    assert [r["token_ids"] for r in read_results(out)] != [r["token_ids"] for r in records]


def test_autoregressive_method(tmp_path):
    config, out = write_job(tmp_path, PROMPTS)
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    lookahead = read_results(out)
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--fresh",
                                  "--set", "generation.method=autoregressive"])
    assert result.exit_code == 0, result.output
    plain = read_results(out)
    assert [r["token_ids"] for r in plain] == [r["token_ids"] for r in lookahead]
    assert [r["completion"] for r in plain] == [r["completion"] for r in lookahead]
    for r in plain:
        assert r["method"] == "autoregressive" and r["forwards"] == r["new_tokens"] and r["compression"] == 1.0
        assert r["host_seconds"] is None and r["collectives"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "autoregressive" and summary["compression"] == 1.0
    assert summary["host_ms_per_round"] is None


def test_stop_strings_cut_both_methods_alike(tmp_path):
    config, out = write_job(tmp_path, PROMPTS, baseline={"enabled": True})
    runner = CliRunner()
    assert runner.invoke(main, ["--config", str(config), "--quiet"]).exit_code == 0
    text = read_results(out)[0]["completion"]
    stop = text[5:7]  # occurs in the first prompt's output, after its 5th character
    result = runner.invoke(main, ["--config", str(config), "--quiet", "--fresh",
                                  "--set", f"generation.stop={json.dumps([stop])}"])
    assert result.exit_code == 0, result.output
    first = read_results(out)[0]
    assert first["finish_reason"] == "stop" and first["completion"] == text[:text.index(stop)]
    assert first["baseline_ids_equal"] and first["baseline_finish_reason"] == "stop"


def test_progress_bar_is_off_when_stderr_is_not_a_terminal(job):
    config, _ = job
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0
    assert "decoding" not in result.stderr and "prompt/s" not in result.stderr and "tok/s, S=" not in result.stderr


def test_progress_bar_on_a_terminal_shows_tokens_per_second_and_s(job, monkeypatch):
    config, _ = job
    monkeypatch.setattr(lp.run, "_stderr_is_terminal", lambda: True)
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "decoding" in result.stderr and "3/3" in result.stderr
    assert "tok/s, S=" in result.stderr
    quiet = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--fresh"])
    assert quiet.exit_code == 0 and quiet.stderr == ""  # --quiet: no bar even on a terminal


def test_chat_template_needs_a_tokenizer_that_has_one(job):
    config, out = job
    result = CliRunner().invoke(main, ["--config", str(config), "--set", "data.chat_template=true"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: data.chat_template is true")
    assert "no chat template" in result.stderr and "Traceback" not in result.output
    assert "data.chat_template: false" in result.stderr  # what to do about it


class ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt is True and tokenize is False
        (message,) = messages
        return f"<u>{message['role']}:{message['content']}</u><a>"

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def test_chat_template_wraps_the_instruction_and_opens_the_answer():
    from lp.jobs.config import load_config_dict
    from lp.jobs.data import Prompt
    from lp.models import LoadedModel
    from lp.jobs.runner import encode_prompt

    loaded = LoadedModel(None, ChatTokenizer(), "fake", [2])
    cfg = load_config_dict({"data": {"chat_template": True}})
    ids, error = encode_prompt(Prompt("t", "x = 1\n\n"), loaded, cfg, None)
    text = "<u>user:Complete the body of the following Python code:\n```python\nx = 1\n```</u><a>```python"
    assert error is None and ids == [ord(c) for c in text]  # no second BOS
    mine = load_config_dict({"data": {"instruction": "Q: {prompt}", "response_prefix": "A:"}})
    assert encode_prompt(Prompt("t", "hi"), loaded, mine, None)[0] == [ord(c) for c in "<u>user:Q: hi</u><a>A:"]
    plain, _ = encode_prompt(Prompt("t", "hi"), loaded, load_config_dict({"data": {"chat_template": False}}), None)
    assert plain == [1, ord("h"), ord("i")]


def test_evaluate_adds_pass_at_1(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 3, "guesses": 4},
        "generation": {"max_new_tokens": 4},
        "data": {"source": "humaneval", "limit": 2, "chat_template": False},  # the tiny model has no chat template
        "output": {"dir": str(tmp_path / "out"), "evaluate": True, "evaluate_timeout_s": 20},
    }))
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["evaluated"] == 2 and summary["passed"] == 0 and summary["pass_at_1"] == 0.0  # random weights
    outcomes = [json.loads(line) for line in (tmp_path / "out" / "eval.jsonl").read_text().splitlines()]
    assert [o["task_id"] for o in outcomes] == ["HumanEval/0", "HumanEval/1"]
    assert all(o["passed"] is False and o["result"].startswith("failed") for o in outcomes)
    assert "pass@1 = 0.000 (0/2 passed" in result.stdout


# ---- the chat code-completion mode and ClassEval on the tiny model ----------------------------------------

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "data" / "classeval_mini.json"
TINY_ASCII = "tiny-random-llama?vocab=128&seed=0"  # printable ASCII round-trips through its tokenizer


class TinyChatTokenizer(TinyTokenizer):
    """The tiny model's tokenizer with a chat template, as an instruct model's has."""
    chat_template = "<user>{{ content }}</user><assistant>"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        (message,) = messages
        return f"<user>{message['content']}</user><assistant>"

    def encode(self, text, add_special_tokens=True):
        return super().encode(text)


@pytest.fixture
def chat_model(monkeypatch):
    """Jobs in this test load the tiny model with a chat template."""
    real = lp.jobs.runner.load_model

    def load(name, dtype, device, **kwargs):
        loaded = real(name, dtype=dtype, device=device, **kwargs)
        return LoadedModel(loaded.model, TinyChatTokenizer(loaded.tokenizer.vocab_size, loaded.tokenizer.eos_token_id),
                           loaded.name, loaded.eos_token_ids, loaded.linear_kernels)
    monkeypatch.setattr(lp.jobs.runner, "load_model", load)


def test_chat_job_records_the_answer_and_the_code_taken_from_it(tmp_path, chat_model):
    config, out = write_job(tmp_path, PROMPTS, model={"name": TINY_ASCII},
                            data={"chat_template": True, "response_prefix": "```py"}, baseline={"enabled": True},
                            generation={"max_new_tokens": 24})
    assert load_config(config).generation.stop == CHAT_CODE_STOP  # the closing fence, left out in the file
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_results(out)
    loaded = load_model(TINY_ASCII, dtype="float64", device="cpu")
    for record, prompt in zip(records, PROMPTS):
        text = loaded.tokenizer.decode(record["token_ids"], skip_special_tokens=True)
        assert record["response"] == "```py" + text[:len(record["response"]) - 5]
        assert record["completion"] == chat_completion(record["response"], prompt["prompt"])
        assert record["baseline_ids_equal"] is True
        message = chat_message(prompt["prompt"])
        assert record["prompt_tokens"] == len(f"<user>{message}</user><assistant>```py")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples == [{"task_id": r["task_id"], "completion": r["completion"]} for r in records]


def test_classeval_job_evaluates_with_the_unittest_classes(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "generation": {"max_new_tokens": 6},
        "data": {"source": "classeval", "path": str(MINI), "limit": 2, "chat_template": False},
        "output": {"dir": str(tmp_path / "out"), "evaluate": True, "evaluate_timeout_s": 30},
    }))
    assert load_config(config).generation.stop == CODE_COMPLETION_STOP  # raw class skeletons
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_results(out := tmp_path / "out")
    assert [r["task_id"] for r in records] == ["ClassEvalMini_0", "ClassEvalMini_1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluated"] == 2 and summary["passed"] == 0  # random weights do not write the methods
    outcomes = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert all(o["result"].startswith("failed") for o in outcomes)
    programs = [r["completion"] for r in records]
    skeletons = [t["skeleton"] for t in json.loads(MINI.read_text())[:2]]
    assert summary["parsed"] == sum(bool(c.strip()) and parses(s + c) for s, c in zip(skeletons, programs))
    assert "completions that parse as Python" in result.stdout and "pass@1 = 0.000 (0/2" in result.stdout


def test_classeval_job_without_the_file_fails_with_one_line(tmp_path):
    config, out = write_job(tmp_path, PROMPTS, data={"source": "classeval", "path": str(tmp_path / "nope.json")})
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ClassEval file not found") and "FudanSELab/ClassEval" in line
    assert not out.exists()


@pytest.mark.parametrize("where", ["check", "setup"])
def test_ctrl_c_before_the_job_is_the_interrupted_line_and_130(tmp_path, monkeypatch, where):
    """Ctrl-C during --check or the distributed setup (a multi-node rendezvous can wait minutes) gave
    click's 'Aborted!' and exit 1; only run_job's own interrupt had the documented line and 130."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(lp.run, "check_job" if where == "check" else "init_distributed", interrupted)
    config, _ = write_job(tmp_path, [{"task_id": "t0", "prompt": "abc"}])
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *(["--check"] if where == "check" else [])])
    line = "interrupted; --check writes nothing" if where == "check" else lp.run.INTERRUPTED
    assert result.exit_code == 130 and result.stderr.strip() == f"error: {line}", result.output


def test_every_rank_names_itself_in_a_job_failure_line(capsys):
    """Under several workers each failure line says whose it is; a refused resume's did not (rank 0's
    'holds results made with a different config' stood beside rank 1's 'rank 1: global rank 0 refused')."""
    from types import SimpleNamespace

    from lp.jobs.data import DataError
    from lp.jobs.results import ResumeRefused

    comm = SimpleNamespace(job_rank=0, job_world=2)
    for error, status in ((ResumeRefused("out holds 3 results made with a different config"), 2),
                          (DataError("prompt file not found: x.jsonl"), 1)):
        with pytest.raises(SystemExit) as exit_:
            lp.run._exit_for(error, comm)
        assert exit_.value.code == status and capsys.readouterr().err == f"error: rank 0: {error}\n"


@pytest.mark.parametrize("method, batch_size", [("lookahead", 1), ("lookahead", 2), ("autoregressive", 1)])
def test_a_tokenizer_with_more_ids_than_the_model_gives_that_prompt_an_error_record(tmp_path, method, batch_size):
    """A checkpoint whose tokenizer holds more ids than its embedding: at batch 1 the engine's refusal of
    the prompt was a traceback that ended the job (the autoregressive method: torch's IndexError), at
    batch 2 an error record. Every method and batch size gives the prompt its error record now."""
    from test_models import word_tokenizer
    model = tmp_path / "model"
    loaded = lp.models.tiny_random_llama(vocab=32, eos=5)
    loaded.model.save_pretrained(model)
    word_tokenizer(40).save_pretrained(model)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"task_id": t, "prompt": p}) + "\n"
                               for t, p in (("in", "w3 w4 w3 w4"), ("out", "w3 w35 w4"))))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": str(model), "dtype": "float64", "device": "cpu"},
        "generation": {"max_new_tokens": 8, "batch_size": batch_size, "method": method},
        "data": {"source": "jsonl", "path": str(prompts)},
        "output": {"dir": str(tmp_path / "out")},
    }))
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0 and result.exception is None, result.output
    records = {r["task_id"]: r for r in read_results(tmp_path / "out")}
    assert records["out"]["finish_reason"] == "error" and "prompt token id 35 is outside the model's vocabulary " \
        "(ids 0 to 31): the tokenizer holds more ids than the model" in records["out"]["error"]
    want = loaded.model.double().generate(torch.tensor([[3, 4, 3, 4]]), max_new_tokens=8, do_sample=False,
                                          eos_token_id=5, pad_token_id=0)[0, 4:].tolist()
    assert records["in"]["token_ids"] == want


def test_a_checkpoints_generation_defaults_the_job_does_not_apply_are_named(tmp_path):
    """A checkpoint's generation_config.json with repetition_penalty (Qwen2.5-Instruct ships 1.05) or
    do_sample: model.generate applies them by default, a job reads its own keys only, and said nothing, so
    its output silently differed from `generate`'s. It warns now, naming each one the job does not apply."""
    model = tmp_path / "model"
    loaded = lp.models.tiny_random_llama(vocab=32, eos=5)
    loaded.model.generation_config.update(repetition_penalty=1.3, do_sample=True, temperature=0.7, top_k=20,
                                          suppress_tokens=[7], min_length=5)
    loaded.model.save_pretrained(model)
    from test_models import word_tokenizer
    word_tokenizer(32).save_pretrained(model)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"task_id": "a", "prompt": "w3 w4 w3"}) + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": str(model), "device": "cpu"}, "generation": {"max_new_tokens": 4, "batch_size": 1},
        "data": {"source": "jsonl", "path": str(prompts)}, "output": {"dir": str(tmp_path / "out")}}))
    warned = []
    own = ["--set", "generation.repetition_penalty=1.3", "--set", "generation.suppress_tokens=[7]",
           "--set", "generation.temperature=0.7"]
    for k, keys in enumerate(([], own, [*own, "--set", "generation.top_k=20"])):
        result = CliRunner().invoke(main, ["--config", str(config), *keys, "--set", f"output.dir={tmp_path / str(k)}"])
        assert result.exit_code == 0, result.output
        warned.append([line for line in result.output.splitlines() if "generation_config" in line])
    assert len(warned[0]) == 1 and "sets repetition_penalty=1.3, suppress_tokens=[7], min_length=5, do_sample=True, " \
        "which model.generate applies by default" in warned[0][0]
    assert len(warned[1]) == 1 and "sets top_k=20, min_length=5, which" in warned[1][0]   # sampling: its warpers too
    assert len(warned[2]) == 1 and "sets min_length=5, which" in warned[2][0]           # a job has no min_length
