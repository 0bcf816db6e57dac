"""Results survive failures: a job killed with SIGKILL and rerun ends with exactly one record per
task id and the records and summary of an uninterrupted run (greedy, and sampling with the in-run
baseline); torn and corrupt results files; one run per dir."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lp.decode import propose
from lp.jobs.config import load_config
from lp.jobs.results import JobDir, JobDirError
from lp.run import main
from lp.jobs.summary import TIMING_KEYS

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny-random-llama?vocab=64&seed=0"
PROMPTS = 12


def write_job(tmp_path, max_new_tokens=24, baseline=False, sampling=None):
    data = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"task_id": f"t{i}", "prompt": "abcabc" + "xyz"[i % 3] * (i % 5 + 1) + "q" * i})
             for i in range(PROMPTS)]
    lines.insert(5, "{a broken line")  # an error record resumes like any other
    data.write_text("".join(line + "\n" for line in lines))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 4, "guesses": 4},
        "generation": {"max_new_tokens": max_new_tokens, "batch_size": 1, **(sampling or {})},
        "data": {"source": "jsonl", "path": str(data), "limit": None},
        "output": {"dir": str(tmp_path / "out")},
        "baseline": {"enabled": baseline},
    }))
    return config


def lines_of(path):
    return path.read_text().splitlines() if path.exists() else []


def run(config, *args):
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *args])
    assert result.exit_code == 0, result.output
    return result


def comparable(summary):
    """A summary without what varies between runs: timing and the output directory."""
    out = {k: v for k, v in summary.items() if k not in TIMING_KEYS}
    out["config"] = {**out["config"], "output": {**out["config"]["output"], "dir": None}}
    return out


def kill_after(config, records, out, sig=signal.SIGKILL):
    """Start the job as a real process, send it `sig` once results.jsonl has `records` lines; returns
    the lines it left and the process (ended)."""
    results = out / "results.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "lp.run", "--config", str(config), "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while len(lines_of(results)) < records:
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the job made no progress"
            time.sleep(0.005)
        proc.send_signal(sig)
        proc.stdout_text, proc.stderr_text = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines_of(results), proc


def comparable_record(record):
    """A record without its timing figures."""
    return {k: v for k, v in record.items() if k not in ("decode_seconds", "host_seconds", "baseline_decode_seconds")}


@pytest.mark.parametrize("sampling,baseline", [(None, False), ({"temperature": 0.8, "top_k": 20, "seed": 3}, True)],
                         ids=["greedy", "sampling"])
def test_killed_job_resumes_to_the_uninterrupted_summary(tmp_path, sampling, baseline):
    config = write_job(tmp_path, baseline=baseline, sampling=sampling)
    whole = tmp_path / "whole"
    run(config, "--set", f"output.dir={whole}")
    reference = json.loads((whole / "summary.json").read_text())
    assert reference["prompts"] == PROMPTS + 1 and reference["errors"] == 1

    out = tmp_path / "out"
    kept, proc = kill_after(config, 3, out)
    assert proc.returncode == -signal.SIGKILL
    assert 3 <= len(kept) < PROMPTS + 1, "the job finished before it could be killed"
    assert not (out / "summary.json").exists()

    result = run(config)
    records = [json.loads(line) for line in lines_of(out / "results.jsonl")]
    ids = [r["task_id"] for r in records]
    assert len(ids) == len(set(ids)) == PROMPTS + 1                  # exactly one record per task id
    assert lines_of(out / "results.jsonl")[:len(kept)] == kept        # the earlier records are untouched
    assert ids == [json.loads(line)["task_id"] for line in lines_of(whole / "results.jsonl")]
    uninterrupted = [json.loads(line) for line in lines_of(whole / "results.jsonl")]
    assert [comparable_record(r) for r in records] == [comparable_record(r) for r in uninterrupted]
    assert comparable(json.loads((out / "summary.json").read_text())) == comparable(reference)
    assert "13 prompts" in result.stdout
    assert lines_of(out / "samples.jsonl") == lines_of(whole / "samples.jsonl")


def test_sigterm_ends_the_job_as_ctrl_c_does(tmp_path):
    """SIGTERM (docker stop, scancel): exit 143 with one line saying the results are kept, the
    directory unlocked and nothing written twice, so the same command resumes at once."""
    config = write_job(tmp_path)
    out = tmp_path / "out"
    kept, proc = kill_after(config, 2, out, signal.SIGTERM)
    assert proc.returncode == 143, (proc.returncode, proc.stderr_text)
    assert "terminated (SIGTERM)" in proc.stderr_text and "resume" in proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    assert 2 <= len(kept) < PROMPTS + 1, "the job finished before it could be stopped"
    assert not (out / "summary.json").exists()
    run(config)                                                       # not refused as still running
    ids = [json.loads(line)["task_id"] for line in lines_of(out / "results.jsonl")]
    assert len(ids) == len(set(ids)) == PROMPTS + 1
    assert lines_of(out / "results.jsonl")[:len(kept)] == kept


def test_torn_last_line_is_cut_off(tmp_path):
    config = write_job(tmp_path, max_new_tokens=8, baseline=True)
    whole = tmp_path / "whole"
    run(config, "--set", f"output.dir={whole}")
    reference = json.loads((whole / "summary.json").read_text())

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.yaml").write_text(load_config(config).to_yaml())
    done = lines_of(whole / "results.jsonl")[:4]
    torn = lines_of(whole / "results.jsonl")[4][:37]  # the start of the 5th record, no newline
    (out / "results.jsonl").write_text("\n".join(done) + "\n" + torn)
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "torn last line" in result.stderr
    got = lines_of(out / "results.jsonl")
    assert got[:4] == done and len(got) == PROMPTS + 1
    assert all(json.loads(line) for line in got)
    assert len({json.loads(line)["task_id"] for line in got}) == PROMPTS + 1
    assert comparable(json.loads((out / "summary.json").read_text())) == comparable(reference)


# an error record as lp.jobs.summary.error_record writes it: every field a resume and the summary read
ERROR_RECORD = {"task_id": "t0", "line": 1, "prompt_hash": None, "prompt_tokens": None, "response": None,
                "completion": None, "token_ids": [], "new_tokens": 0, "forwards": 0, "compression": None,
                "decode_seconds": 0.0, "finish_reason": "error", "error": "bad", "method": "lookahead"}


def test_a_kept_line_without_a_field_the_summary_reads_is_no_record():
    """Each field of the job's records (a decoded one with the baseline's figures, an error one): a line
    without it is either no record to _parse (a resume names it) or one the summary and its report
    read whole. Before, a record without max_rows_per_round passed and crashed the summary (KeyError)."""
    from lp.engine import GenerationResult
    from lp.jobs.config import load_config_dict
    from lp.jobs.data import Prompt
    from lp.jobs.results import _parse
    from lp.jobs.summary import RunFacts, error_record, report, result_record, summarize
    from lp.parallel.dist import Comm
    cfg = load_config_dict({"data": {"source": "jsonl", "path": "x.jsonl"}, "baseline": {"enabled": True}})
    result = GenerationResult(token_ids=[3, 4], text="x", finish_reason="eos", forwards=1, emitted_per_round=[2],
                              rows_per_round=[2], max_rows_per_round=[2])
    decoded = result_record(Prompt("t0", "abc", line=1), [1, 2], result, baseline=result)
    error = error_record(Prompt("t1", "abd", line=2), "bad", None, "lookahead")
    assert set(ERROR_RECORD) == set(error)          # the constant above is an error record as written
    for record in (decoded, error):
        for key in record:
            line = json.dumps({k: v for k, v in record.items() if k != key}).encode()
            if _parse(line) is None:
                continue
            records = [_parse(line), decoded if record is error else error]
            report(summarize(records, cfg, "m", Comm(), run=RunFacts(1.0, frozenset({"t0", "t1"}))), cfg)


@pytest.mark.parametrize("line", ["not json", '{"task_id": "t1"}', '["t1"]',
                                  json.dumps(dict(ERROR_RECORD, task_id="t1", finish_reason="eos"))],
                         ids=["not-json", "task-id-only", "not-an-object", "decoded-without-its-counts"])
def test_unreadable_line_before_the_end_is_an_error(tmp_path, line):
    """A line that is not a record (JSON or not) before the last: the run and --check name it, the
    file is left as it was. Before, valid JSON without a record's fields crashed the resume (KeyError)."""
    config = write_job(tmp_path, max_new_tokens=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.yaml").write_text(load_config(config).to_yaml())
    (out / "results.jsonl").write_text(f"{json.dumps(ERROR_RECORD)}\n{line}\n{json.dumps(ERROR_RECORD)}\n")
    for check in (["--check"], []):
        result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *check])
        assert result.exit_code == 1
        assert result.stderr.strip() == f"error: {out / 'results.jsonl'}:2 is not a result record; fix or remove " \
                                        f"that line, or rerun with --fresh"
    assert (out / "results.jsonl").read_text().count("\n") == 3  # left as it was


def test_a_last_line_that_is_json_but_no_record_is_named_not_cut(tmp_path):
    """A torn write leaves a last line that is not JSON, and a resume cuts it off; a last line that is
    JSON without a record's fields is no torn write: it is named, and the file kept as it was."""
    config = write_job(tmp_path, max_new_tokens=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.yaml").write_text(load_config(config).to_yaml())
    incomplete = {k: v for k, v in ERROR_RECORD.items() if k != "decode_seconds"} | {"task_id": "t1"}
    text = f"{json.dumps(ERROR_RECORD)}\n{json.dumps(incomplete)}\n"
    (out / "results.jsonl").write_text(text)
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet"])
    assert result.exit_code == 1 and f"{out / 'results.jsonl'}:2 is not a result record" in result.stderr
    assert (out / "results.jsonl").read_text() == text


def test_a_run_that_evaluates_nothing_leaves_no_earlier_evaluation(tmp_path):
    """eval.jsonl is the finished run's own: a resume with output.evaluate false (a key a resume may
    change) removes an earlier run's, which graded other records than the new summary counts."""
    cfg = load_config(write_job(tmp_path))
    job = JobDir(cfg.output.dir)
    job.open(cfg)
    job.finish({"prompts": 3}, [], [{"task_id": "t0", "passed": True, "result": "passed"}])
    job.close()
    assert job.eval_path.exists()
    again = JobDir(cfg.output.dir)
    again.open(cfg)
    again.finish({"prompts": 2}, [])
    again.close()
    assert not again.eval_path.exists() and again.summary_path.exists()


def test_one_run_per_directory(tmp_path):
    cfg = load_config(write_job(tmp_path))
    first = JobDir(cfg.output.dir)
    first.open(cfg)
    try:
        with pytest.raises(JobDirError, match="in use by another run"):
            JobDir(cfg.output.dir).open(cfg)
    finally:
        first.close()
    again = JobDir(cfg.output.dir)
    again.open(cfg)  # free once the first run is gone
    again.close()


@pytest.mark.parametrize("where, message", [
    ("file", "output.dir {out} is a file, not a directory"),
    ("under-a-file", "output.dir {out} cannot be used: Not a directory"),
    ("dangling-results", "output.dir {out} cannot be used: No such file or directory ({out}/results.jsonl)"),
    ("looping-results", "output.dir {out} cannot be used: Too many levels of symbolic links ({out}/results.jsonl)"),
    ("under-a-dangling-link", "output.dir {out} cannot be used: File exists ({link})"),
])
def test_an_unusable_output_dir_is_named(tmp_path, where, message):
    """An output.dir that is a file, lies under a file or a link to nowhere, or holds a results.jsonl link
    to nowhere or to itself: one line naming output.dir, exit 1, nothing decoded; and the same line from
    --check."""
    config = write_job(tmp_path)
    spec = yaml.safe_load(config.read_text())
    out = tmp_path / "out"
    if where == "file":
        out.write_text("")
    elif where == "under-a-file":
        (tmp_path / "f").write_text("")
        out = tmp_path / "f" / "out"
    elif where == "under-a-dangling-link":
        (tmp_path / "link").symlink_to(tmp_path / "nowhere")
        out = tmp_path / "link" / "out"
    else:
        out.mkdir()
        target = "results.jsonl" if where == "looping-results" else tmp_path / "missing" / "results.jsonl"
        (out / "results.jsonl").symlink_to(target)
    spec["output"]["dir"] = str(out)
    config.write_text(yaml.safe_dump(spec))
    for check in (["--check"], []):      # --check says what the run will, and the run says it
        result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *check])
        assert result.exit_code == 1 and result.stderr.strip() == "error: " + message.format(
            out=out, link=tmp_path / "link"), (check, result.output)


def test_fresh_with_a_model_name_that_finds_nothing_keeps_the_results(tmp_path):
    """--fresh cleared the directory, then the model's name found nothing (exit 1): the finished run's
    results, summary and samples were gone, config.yaml named the typo. The name is now looked up first."""
    config = write_job(tmp_path)
    run(config)
    out = Path(load_config(config).output.dir)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"results.jsonl", "summary.json", "samples.jsonl", "config.yaml"} <= set(before)
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--fresh", "--set",
                                       "model.name=smollm2-135m-typo"])
    assert result.exit_code == 1 and "cannot load model 'smollm2-135m-typo'" in result.stderr, result.output
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("where", ["existing", "missing"])
def test_check_refuses_an_output_dir_no_file_can_be_made_in(tmp_path, where):
    """An existing directory that cannot be written to (a 555 one; as root, where permissions do not bind,
    /proc/1), or a missing one under /proc: --check said "ok" for the first and for /proc paths, and the
    run then failed at its lock file. Now both say the directory cannot be used, exit 1."""
    if where == "missing":
        out = Path("/proc") / f"lp-test-{os.getpid()}"
    elif os.geteuid() == 0:
        out = Path("/proc/1")
    else:
        out = tmp_path / "read-only"
        out.mkdir()
        out.chmod(0o555)
    config = write_job(tmp_path)
    for check in (["--check"], []):
        result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", f"output.dir={out}", *check])
        assert result.exit_code == 1 and result.stderr.startswith(f"error: output.dir {out} cannot be used: "), \
            (check, result.output)


def test_append_never_duplicates(tmp_path):
    cfg = load_config(write_job(tmp_path))
    job = JobDir(cfg.output.dir)
    job.open(cfg)
    try:
        job.append({"task_id": "t0", "finish_reason": "error"})
        with pytest.raises(ValueError, match="already has a record"):
            job.append({"task_id": "t0", "finish_reason": "error"})
    finally:
        job.close()
    assert lines_of(Path(cfg.output.dir) / "results.jsonl") == ['{"task_id": "t0", "finish_reason": "error"}']


@pytest.mark.parametrize("most", [None, 24])
def test_job_cache_is_rebuilt_in_task_order_on_resume(tmp_path, monkeypatch, most):
    """With lookahead.job_cache a prompt drafts from the completions of the tasks before it;
    a resumed job rebuilds that index from results.jsonl in task order, so every prompt
    takes the forwards and per-round counts of the uninterrupted run. t2 and t4 repeat
    earlier prompts: they draft their whole completion from t0's and t1's, unless the cache
    is bounded (`most` tokens) and has forgotten them, as a resumed job forgets them too."""
    if most is not None:
        monkeypatch.setattr(propose, "JOB_CACHE_TOKENS", most)    # the latest completion (24 tokens) only
    data = tmp_path / "prompts.jsonl"
    texts = ["abcabcxyz", "qrsqrs", "abcabcxyz", "mnomno", "qrsqrs", "zzyzzy"]
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": TINY, "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 0, "ngram": 3, "guesses": 0, "lookup_candidates": 0, "suffix_factor": 4,
                      "suffix_tokens": 24, "job_cache": True},
        "generation": {"max_new_tokens": 24, "batch_size": 1},     # a prompt drafts from every task before it
        "data": {"source": "jsonl", "path": str(data), "limit": None},
        "output": {"dir": str(tmp_path / "whole")},
    }))
    run(config)
    whole = [json.loads(line) for line in lines_of(tmp_path / "whole" / "results.jsonl")]
    run(config, "--set", f"output.dir={tmp_path / 'nocache'}", "--set", "lookahead.job_cache=false")
    nocache = [json.loads(line) for line in lines_of(tmp_path / "nocache" / "results.jsonl")]
    assert [r["token_ids"] for r in whole] == [r["token_ids"] for r in nocache]
    drafted = [whole[k]["forwards"] < nocache[k]["forwards"] for k in (2, 4)]
    assert drafted == ([True, True] if most is None else [False, False])

    out = tmp_path / "out"          # an interrupted run: the first two records, then a resume
    out.mkdir()
    (out / "config.yaml").write_text(load_config(config, [f"output.dir={out}"]).to_yaml())
    (out / "results.jsonl").write_text("".join(line + "\n" for line in lines_of(tmp_path / "whole" / "results.jsonl")[:2]))
    run(config, "--set", f"output.dir={out}")
    resumed = [json.loads(line) for line in lines_of(out / "results.jsonl")]
    for a, b in zip(resumed, whole):
        assert (a["task_id"], a["forwards"], a["emitted_per_round"]) == (b["task_id"], b["forwards"],
                                                                         b["emitted_per_round"])


def test_a_resume_removes_the_finished_runs_files_until_it_finishes(tmp_path):
    """samples.jsonl (and eval.jsonl) outlived an interrupted resume: after it, samples.jsonl still held the
    earlier run's completions, fewer than results.jsonl's records. A resume now removes them with
    summary.json when it opens, and its finish writes them again."""
    cfg = load_config(write_job(tmp_path))
    job = JobDir(cfg.output.dir)
    job.open(cfg)
    job.finish({"prompts": 1}, [{"task_id": "t0", "completion": "x"}], [{"task_id": "t0", "passed": True}])
    job.close()
    assert job.samples_path.exists() and job.eval_path.exists() and job.summary_path.exists()
    again = JobDir(cfg.output.dir)
    again.open(cfg)          # a resume that is then interrupted: it never finishes
    again.close()
    assert not (again.samples_path.exists() or again.eval_path.exists() or again.summary_path.exists())


def test_a_resume_refuses_a_local_model_whose_files_changed(tmp_path):
    """A local checkpoint overwritten between two runs: the resume kept the old model's records and decoded
    the prompts left with the new one. It is refused now (exit 2, naming the model), as a changed config
    is; --force keeps the records, --fresh starts over."""
    from lp.models import tiny_random_llama
    from test_models import word_tokenizer

    def save(seed):
        tiny_random_llama(vocab=40, eos=5, seed=seed).model.save_pretrained(tmp_path / "ckpt")
        word_tokenizer(40).save_pretrained(tmp_path / "ckpt")

    save(0)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"w{i + 3} w7 w{i + 3} w9"}) + "\n"
                            for i in range(4)))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": str(tmp_path / "ckpt"), "dtype": "float64", "device": "cpu"},
        "generation": {"max_new_tokens": 8, "batch_size": 1},
        "data": {"source": "jsonl", "path": str(data), "limit": 2},
        "output": {"dir": str(tmp_path / "out")},
    }))
    run(config)
    results = tmp_path / "out" / "results.jsonl"
    kept = results.read_text()
    run(config, "--set", "data.limit=3")             # the same files: resumed
    assert results.read_text().startswith(kept) and len(lines_of(results)) == 3
    kept = results.read_text()
    save(1)
    refused = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", "data.limit=4"])
    assert refused.exit_code == 2, refused.output
    assert f"3 results made with other files at model.name {tmp_path / 'ckpt'}" in refused.stderr
    assert "--force" in refused.stderr and results.read_text() == kept
    checked = CliRunner().invoke(main, ["--config", str(config), "--check", "--set", "data.limit=4"])
    assert checked.exit_code == 2 and "made with other files" in checked.stderr, checked.output
    forced = run(config, "--force", "--set", "data.limit=4")
    assert "keeping 3 results made with other files" in forced.output
    assert results.read_text().startswith(kept) and len(lines_of(results)) == 4
    run(config, "--set", "data.limit=4")               # the digest recorded now is the new files'
    model_json = tmp_path / "out" / "model.json"
    model_json.write_text(json.dumps({"model": str(tmp_path / "ckpt"), "digest": "files0:0123456789abcdef"}))
    run(config, "--set", "data.limit=4")               # a digest of another scheme (another lp's) is no evidence
    assert json.loads(model_json.read_text())["digest"].startswith("files1:")
    run(config, "--fresh")
    assert len(lines_of(results)) == 2
