"""Sampling through the job (`python -m lp.run` with temperature > 0): the draws of a task are
addressed by a hash of its task id (the documented request id), so its record does not depend
on its position in the prompt file, and two or three workers write the one-worker records;
the in-run baseline samples with the same request. (A killed and resumed sampled job:
tests/test_resume.py.)"""
import hashlib
import json

import pytest
from click.testing import CliRunner
from multiproc import prompt_lines, start_ranks, write_job

from lp.baseline import autoregressive_generate
from lp.engine import GenerationParams, lookahead_generate
from lp.jobs.config import load_config
from lp.jobs.data import request_id
from lp.models import load_model
from lp.run import main

SAMPLING = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_new_tokens": 16}
TASKS = [("s/0", "abcabcabxy"), ("s/1", "hello hello hel"), ("s/2", "xyzzyxyzzy"), ("s/3", "def f(a):\n  return a")]
SAME = ("task_id", "token_ids", "completion", "finish_reason", "new_tokens", "forwards", "emitted_per_round",
        "baseline_token_ids", "baseline_finish_reason", "baseline_ids_equal")


def sampled_job(tmp_path, tasks=TASKS, **sections):
    """No job cache: with one, a task's candidates, and so its rounds (forwards, emitted_per_round,
    compared here), also depend on the completions of the tasks before it; its tokens do not."""
    return write_job(tmp_path, prompt_lines(tasks), model={"dtype": "float64"}, generation=SAMPLING,
                     lookahead={"job_cache": False}, baseline={"enabled": True}, distributed={"timeout_s": 60},
                     **sections)


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def same(record):
    return {k: record[k] for k in SAME}


def run_one(config, out):
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", f"output.dir={out}"])
    assert result.exit_code == 0, result.output
    return records(out)


def test_request_id_is_the_documented_hash():
    """docs/how-it-works.md: the first 8 bytes of SHA-256(task id, UTF-8), big-endian, shifted right by one bit."""
    for task in ("HumanEval/0", "s/1", "<line 3>", "naïve ✓"):
        digest = hashlib.sha256(task.encode("utf-8")).digest()
        assert request_id(task) == int.from_bytes(digest[:8], "big") // 2
        assert 0 <= request_id(task) < 2 ** 63     # fits the int64 tensor that carries it to the followers
    assert len({request_id(t) for t, _ in TASKS}) == len(TASKS)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampled")
    config = sampled_job(tmp)
    return tmp, config, run_one(config, tmp / "one")


def test_sampled_records_are_drawn_with_the_task_ids_request(one_worker):
    """Each record is lookahead sampling of its prompt with request = request_id(task id), the
    baseline is generate's sampling with the same request, and baseline_ids_equal compares them."""
    tmp, config, got = one_worker
    cfg = load_config(config)
    loaded = load_model(cfg.model.name, dtype=cfg.model.dtype, device="cpu")
    differ_from_greedy = 0
    for record, (task, prompt) in zip(got, TASKS):
        ids = loaded.tokenizer.encode(prompt)
        kw = dict(eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer)
        mine = lookahead_generate(loaded.model, ids, cfg.lookahead, cfg.generation, request=request_id(task), **kw)
        base = autoregressive_generate(loaded.model, ids, cfg.generation, request=request_id(task), **kw)
        assert record["task_id"] == task and record["token_ids"] == mine.token_ids
        assert record["emitted_per_round"] == mine.emitted_per_round
        assert record["baseline_token_ids"] == base.token_ids
        assert record["baseline_ids_equal"] == (base.token_ids == mine.token_ids)
        greedy = autoregressive_generate(loaded.model, ids, GenerationParams(16), **kw)
        differ_from_greedy += base.token_ids != greedy.token_ids
    assert differ_from_greedy >= 2           # the baseline really samples
    assert any(max(r["emitted_per_round"]) > 1 for r in got)   # and lookahead accepts several tokens a round
    summary = json.loads((tmp / "one" / "summary.json").read_text())
    assert summary["baseline_ids_equal_fraction"] == sum(r["baseline_ids_equal"] for r in got) / len(got)


def test_a_tasks_draws_do_not_depend_on_its_position(one_worker, tmp_path):
    """Prompts inserted before the tasks and data.offset skipping them: every task writes the record it
    wrote as the first lines of the file (a position in the file would change its draws)."""
    _, _, got = one_worker
    moved = [("new/0", "zzz top"), ("new/1", "qq rr qq")] + TASKS[::-1]
    again = run_one(sampled_job(tmp_path, moved, data={"offset": 1}), tmp_path / "moved")
    by_task = {r["task_id"]: same(r) for r in again}
    assert "new/0" not in by_task
    assert [by_task[r["task_id"]] for r in got] == [same(r) for r in got]


def test_sampled_tokens_do_not_depend_on_the_batch_or_the_job_cache(one_worker, tmp_path):
    """Batches of 3 with the job cache on (other trees, other rounds): every task samples the tokens
    it sampled alone without the cache (draws are addressed by position, docs/how-it-works.md)."""
    _, _, got = one_worker
    config = write_job(tmp_path, prompt_lines(TASKS), model={"dtype": "float64"}, generation=SAMPLING | {"batch_size": 3},
                       lookahead={"job_cache": True})
    again = run_one(config, tmp_path / "batched")
    assert [(r["task_id"], r["token_ids"]) for r in again] == [(r["task_id"], r["token_ids"]) for r in got]
    assert [r["emitted_per_round"] for r in again] != [r["emitted_per_round"] for r in got]  # other rounds


@pytest.mark.parametrize("world", [2, 3])
def test_sampled_job_with_more_workers_writes_the_one_worker_records(one_worker, world):
    tmp, config, got = one_worker
    out = tmp / f"p{world}"
    procs = start_ranks(config, "--set", f"output.dir={out}", world=world)
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * world, outs
    assert [same(r) for r in records(out)] == [same(r) for r in got]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == world


@pytest.mark.parametrize("sections", [{}, {"generation": {"batch_size": 3}}, {"generation": {"method": "autoregressive"}},
                                      {"baseline": {"enabled": True}}])
def test_a_prompt_with_nothing_to_draw_is_an_error_record_and_the_job_goes_on(tmp_path, sections):
    """Every token banned by new token 11 of one prompt (its 62 distinct characters and 10 new tokens
    under no_repeat_ngram_size=1, EOS held back by min_new_tokens): the job stopped there with a traceback,
    every rerun at the same prompt, and a batch lost all its prompts. Now that prompt alone gets an error
    record (lookahead's, and generate's as the autoregressive method or the baseline), the others decode."""
    import string
    tasks = [("long", string.ascii_letters + string.digits), ("short1", "ab"), ("short2", "cd")]   # baseline first
    generation = {"temperature": 1.0, "no_repeat_ngram_size": 1, "max_new_tokens": 40, "min_new_tokens": 40,
                  **sections.get("generation", {})}
    config = write_job(tmp_path, prompt_lines(tasks), generation=generation,
                       baseline=sections.get("baseline", {"enabled": False}))
    got = {r["task_id"]: r for r in run_one(config, tmp_path / "out")}
    assert sorted(got) == ["long", "short1", "short2"]
    assert "no distribution to draw new token 11 from" in got["long"]["error"] and not got["long"]["token_ids"]
    assert all(got[t]["error"] is None and len(got[t]["token_ids"]) == 40 for t in ("short1", "short2"))


def test_a_baseline_with_nothing_to_draw_leaves_the_record_without_a_baseline(tmp_path, monkeypatch):
    """generate's draws are its own: where the baseline alone finds nothing to draw, the prompt's lookahead
    record stands, without the baseline's fields (it was the prompt's error, and with the baseline first
    lookahead was never tried)."""
    import lp.jobs.runner
    from lp.decode.sampling import NoDistribution

    def no_distribution(*args, **kwargs):
        raise NoDistribution(3)
    monkeypatch.setattr(lp.jobs.runner, "autoregressive_generate", no_distribution)
    config = write_job(tmp_path, prompt_lines(TASKS[:2]), generation=SAMPLING, baseline={"enabled": True})
    got = run_one(config, tmp_path / "out")
    assert [r["task_id"] for r in got] == ["s/0", "s/1"]
    assert all(r["error"] is None and r["token_ids"] and "baseline_token_ids" not in r for r in got)
