"""Jobs with generation.batch_size > 1 (continuous batching): the records of a batched job equal the
batch-1 job's (float64), bad prompts get their error records and the others go on, a killed batched job
resumes to one record per task with the uninterrupted run's tokens, LP groups (P = 2, dp x lp) decode
batches with the same tokens, the summary carries requests and rows per forward, and bad settings fail
as config errors."""
import json
import re
import signal

import pytest
from click.testing import CliRunner
from multiproc import prompt_lines, start_python, write_job

from lp.run import main
from test_lp_jobs import TIMEOUT_S, launch
from test_resume import kill_after, lines_of

TEXTS = [("a", "abcabcxyz"), ("b", "qrsqrs"), ("c", "abcabcxyz abc"), ("d", "mnomno" * 6), ("e", "zz"),
         ("f", "hello hello hello"), ("g", "xyzxyzab" * 3), ("h", "q")]


def job(tmp_path, texts=TEXTS, **sections):
    lines = prompt_lines(texts[:3]) + ["{broken", json.dumps({"task_id": "empty", "prompt": ""})] \
        + prompt_lines(texts[3:])
    sections = {"model": {"dtype": "float64"}, "generation": {"max_new_tokens": 20},
                "lookahead": {"window": 4, "ngram": 4, "guesses": 4, "suffix_factor": 4, "job_cache": True}, **sections}
    return write_job(tmp_path, lines, **sections)


def run(config, *args):
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *args])
    assert result.exit_code == 0, result.output
    return result


def records(out):
    return [json.loads(line) for line in lines_of(out / "results.jsonl")]


def by_task(recs):
    return {r["task_id"]: r for r in recs}


@pytest.fixture(scope="module")
def batch_one(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one")
    config = job(tmp, generation={"max_new_tokens": 20, "batch_size": 1})
    run(config)
    return records(tmp / "out"), json.loads((tmp / "out" / "summary.json").read_text()), tmp / "out"


def test_batched_job_has_the_batch_one_records(tmp_path, batch_one):
    one, one_summary, one_dir = batch_one
    config = job(tmp_path, generation={"max_new_tokens": 20, "batch_size": 3})
    result = run(config)
    many = records(tmp_path / "out")
    assert sorted(r["task_id"] for r in many) == sorted(r["task_id"] for r in one)     # one record per task
    assert len(many) == len(TEXTS) + 2
    a, b = by_task(one), by_task(many)
    for task, r in a.items():
        assert b[task]["token_ids"] == r["token_ids"] and b[task]["finish_reason"] == r["finish_reason"], task
        assert b[task]["error"] == r["error"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["errors"] == 2 and one_summary["mean_batch"] == 1.0
    assert 1.5 < summary["mean_batch"] <= 3 and summary["rows_per_forward"] > one_summary["rows_per_forward"]
    assert summary["batch_forwards"] < one_summary["batch_forwards"]
    assert "requests and" in result.stdout and "rows per forward (generation.batch_size 3)" in result.stdout
    # the start-up (model load, the row budget's grid) is said apart from the wall time it precedes
    assert summary["startup_seconds"] > 0 and one_summary["startup_seconds"] > 0
    assert f"s wall (after {summary['startup_seconds']:.1f} s of start-up)" in result.stdout
    # samples in task order, not in the order requests ended
    assert lines_of(tmp_path / "out" / "samples.jsonl") == lines_of(one_dir / "samples.jsonl")
    assert [r["task_id"] for r in many] != [r["task_id"] for r in one]     # records: as requests ended


def test_killed_batched_job_resumes_to_one_record_per_task(tmp_path):
    texts = [(f"{t}{k}", p) for k in range(3) for t, p in TEXTS]   # time to kill it: TEXTS ended 0.4 s after
    config = job(tmp_path, texts, generation={"max_new_tokens": 20, "batch_size": 2})   # the 3rd record
    whole = tmp_path / "whole"
    run(config, "--set", f"output.dir={whole}")
    out = tmp_path / "out"
    kept, proc = kill_after(config, 3, out)
    assert proc.returncode == -signal.SIGKILL
    assert 3 <= len(kept) < len(texts) + 2, "the job finished before it could be killed"
    costs = (out / "cost_curve.json").read_text()        # the row budget's, measured before the kill
    recorded = json.loads(costs)
    assert recorded["draft_seconds"] > 0 and {p["batch"] for p in recorded["curve"]} == {1, 2}
    run(config)
    assert (out / "cost_curve.json").read_text() == costs             # reused on resume, not measured again
    resumed = records(out)
    assert lines_of(out / "results.jsonl")[:len(kept)] == kept
    assert len(resumed) == len({r["task_id"] for r in resumed}) == len(texts) + 2
    uninterrupted = by_task(records(whole))
    for r in resumed:
        assert r["token_ids"] == uninterrupted[r["task_id"]]["token_ids"], r["task_id"]


def test_a_forced_run_with_another_batch_size_measures_its_costs_again(tmp_path):
    """A run that keeps the records of another batch size (--force) measures the row budget's grid for its
    own: before, it read the first run's cost_curve.json, a grid without its batch size."""
    config = job(tmp_path, generation={"max_new_tokens": 6, "batch_size": 2})
    out = tmp_path / "out"
    run(config, "--set", "data.limit=2")
    assert {p["batch"] for p in json.loads((out / "cost_curve.json").read_text())["curve"]} == {1, 2}
    run(config, "--force", "--set", "generation.batch_size=3")
    recorded = json.loads((out / "cost_curve.json").read_text())
    assert {p["batch"] for p in recorded["curve"]} == {1, 3} and recorded["measured_for"]["batch_size"] == 3


@pytest.mark.parametrize("world,lp_size", [(2, None), (2, 1)], ids=["lp2", "dp2"])
def test_batched_job_under_torchrun(tmp_path, batch_one, world, lp_size):
    """P = 2 splits every batched round's rows; two dp groups each run their own batch."""
    one, _, _ = batch_one
    config = job(tmp_path, generation={"max_new_tokens": 20, "batch_size": 3},
                 distributed={"backend": "gloo", "timeout_s": TIMEOUT_S, "lp_size": lp_size})
    codes, outs = launch(config, world=world)
    assert codes == [0] * world, outs
    got = {}
    for path in sorted((tmp_path / "out").glob("results*.jsonl")):
        got.update(by_task(json.loads(line) for line in path.read_text().splitlines()))
    assert set(got) == set(by_task(one))
    for task, r in by_task(one).items():
        assert got[task]["token_ids"] == r["token_ids"], task
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == world and summary["mean_batch"] > 1
    # P = 2: one broadcast and one all-gather per batched round, counted once per request in it; a
    # dp group of one exchanges nothing
    assert summary["collectives_per_round"] == (2 if lp_size is None else 0)


@pytest.mark.parametrize("sets,message", [
    (["generation.batch_size=0"], "generation.batch_size: 0 must be >= 1"),
    (["generation.batch_size=2", "baseline=true"], "needs generation.batch_size 1"),
    (["generation.batch_size=2", "generation.method=autoregressive"], "needs generation.method lookahead"),
])
def test_bad_batch_settings_are_config_errors(tmp_path, sets, message):
    config = job(tmp_path)
    result = CliRunner().invoke(main, ["--config", str(config), "--quiet", *[x for s in sets for x in ("--set", s)]])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_recorded_costs_are_read_only_for_the_settings_they_were_measured_for(tmp_path):
    """cost_curve.json is the row budget's for one model, batch size and lookahead: other settings (a run
    with --force, or one that changed them before keeping a record) and a file from an lp that did not
    record them read as none, so the run measures again; an unreadable file is named."""
    from lp.jobs.results import JobDir, JobDirError
    job_dir = JobDir(tmp_path)
    measured_for = dict(model=dict(name="m", dtype="float64"), batch_size=4, lookahead=dict(window=4))
    assert job_dir.read_costs(measured_for) is None
    curve = [{"batch": 1, "rows": 1, "seconds": 0.01}]
    job_dir.write_costs({"curve": curve, "draft_seconds": 2e-4}, measured_for)
    assert job_dir.read_costs(measured_for) == {"curve": curve, "draft_seconds": 2e-4}
    assert job_dir.read_costs(dict(measured_for, batch_size=16)) is None
    assert job_dir.read_costs(dict(measured_for, model=dict(name="other", dtype="float64"))) is None
    job_dir.curve_path.write_text(json.dumps({"prefix_tokens": 256, "curve": curve}))     # an older lp's
    assert job_dir.read_costs(measured_for) is None
    job_dir.curve_path.write_text("[1, 2]")
    with pytest.raises(JobDirError, match="cannot be read .*delete it to measure the costs again"):
        job_dir.read_costs(measured_for)


@pytest.mark.parametrize("lp_size", [None, 1], ids=["lp2", "dp2"])
def test_the_others_wait_for_rank_0s_measurement_past_the_collectives_timeout(tmp_path, lp_size):
    """Global rank 0 measures the row budget's costs at startup while the other ranks wait: that wait is
    not bounded by distributed.timeout_s (a short one, to find a dead worker fast, stopped the job at
    startup with gloo's 'Timed out waiting ... for recv'); decoding's collectives still are."""
    timeout_s = 1.0
    config = write_job(tmp_path, prompt_lines(TEXTS[:4]),
                       model={"name": "tiny-random-llama?vocab=64&seed=0&layers=8&hidden=512&intermediate=1024"},
                       generation={"max_new_tokens": 8, "batch_size": 16},
                       distributed={"backend": "gloo", "timeout_s": timeout_s, "lp_size": lp_size})
    codes, outs = launch(config, world=2, quiet=False, timeout_s=300)    # 74-111 s seen on a loaded machine
    assert codes == [0, 0], outs
    measured = float(re.search(r"row budget: .* measured in ([0-9.]+) s", outs[0][1]).group(1))
    assert measured > 1.5 * timeout_s, "the measurement must outlast the timeout for the test to mean anything"
    got = [json.loads(line) for path in (tmp_path / "out").glob("results*.jsonl") for line in lines_of(path)]
    assert sorted(r["task_id"] for r in got) == [t for t, _ in TEXTS[:4]]


RANK_0_ALONE = """
import os, sys, time
from lp.parallel.dist import init_distributed, shutdown
comm = init_distributed("gloo", timeout_s=5.0)
def work():
    how = sys.argv[1]
    if how == "raise":
        raise RuntimeError("rank 0's own error")
    if how == "die":
        os._exit(3)         # gone without a word: no key, and the beat stops
    time.sleep(5)           # longer than timeout_s, beating
    return 7
try:
    print("result", comm.rank_0_alone("lp/test/work", work, timeout_s=float(sys.argv[2])), flush=True)
except RuntimeError as e:
    print("error", e, flush=True)
    sys.exit(1)
finally:
    shutdown(comm)
"""


@pytest.mark.parametrize("how,timeout_s", [("slow", 2.0), ("slow", 0.5), ("raise", 2.0), ("die", 2.0)])
def test_rank_0_alone_waits_while_rank_0_beats_and_no_longer(how, timeout_s):
    """Work of global rank 0 longer than timeout_s (under a second too: the beat comes faster): the other
    rank waits it out (a collective would time out); work that raises, or a rank 0 that dies without a
    word: the other rank ends within timeout_s (a store wait alone hung for an hour)."""
    import time

    t0 = time.monotonic()
    procs = start_python(["-c", RANK_0_ALONE, how, str(timeout_s)])
    outs = [p.communicate(timeout=60)[0] for p in procs]
    took = time.monotonic() - t0
    if how == "slow":
        assert [p.returncode for p in procs] == [0, 0] and outs == ["result 7\n", "result None\n"], outs
    elif how == "raise":
        assert procs[1].returncode == 1 and "global rank 0 failed in its work step" in outs[1], outs
        assert took < 30
    else:
        assert procs[0].returncode == 3 and procs[1].returncode == 1, outs
        assert "global rank 0 gave no sign of life for 2 s" in outs[1] and took < 30, outs
