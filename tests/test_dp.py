"""A dp x lp mesh (distributed.lp_size): world size 4 as 1 x 4, 2 x 2 and 4 x 1 gloo workers
(started by hand, as tests/multiproc.py does) decode every task of a JSONL job exactly once, with
the tokens and per-round counts of the one-worker run (float64, no job_cache); a SIGKILLed worker
of one group ends every group non-zero within distributed.timeout_s with the records intact, and a
rerun resumes to exactly one record per task. The pure parts (mesh, hand-out, percentiles, the
lp_size checks) are tested in process."""
import json
import signal
import threading
import time

import pytest
import torch.distributed as dist
import yaml
from click.testing import CliRunner

from lp.jobs.handout import Handout
from lp.jobs.summary import job_figures, percentile, RunFacts
from lp.parallel.dist import mesh
from lp.run import main
from multiproc import prompt_lines, start_ranks, wait_for_records, write_job, written_lines

TIMEOUT_S = 20
MARGIN_S = 60     # process exits after the failure, on a loaded machine (45 s seen)
TASKS = 10
BROKEN_AT = 4       # a bad JSONL line: an error record, written by whichever group claims it


def job(tmp_path, job_cache=False, **distributed):
    """The job: no job cache unless asked (with one, a group's candidates depend on which prompts
    it drew, so only the tokens are the one-worker run's)."""
    lines = prompt_lines([(f"t{i}", "abcabc" + "xyz"[i % 3] * (i % 5 + 1) + "q" * (i % 4)) for i in range(TASKS)])
    lines.insert(BROKEN_AT, "{broken")
    return write_job(tmp_path, lines, model={"dtype": "float64"}, generation={"max_new_tokens": 40},
                     lookahead={"job_cache": job_cache}, distributed={"timeout_s": TIMEOUT_S, **distributed})


def raw_records(out):
    """Every line of every results file (not deduplicated), and which file it was in."""
    found = []
    for path in sorted(out.glob("results*.jsonl")):
        found += [(path.name, json.loads(line)) for line in path.read_text().splitlines()]
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-worker run (no torchrun) of the same job: task id -> record."""
    tmp = tmp_path_factory.mktemp("one")
    result = CliRunner().invoke(main, ["--config", str(job(tmp)), "--quiet"])
    assert result.exit_code == 0, result.output
    return {r["task_id"]: r for _, r in raw_records(tmp / "out")}


def assert_like_reference(out, reference, dp, rounds=True):
    found = raw_records(out)
    ids = [r["task_id"] for _, r in found]
    assert sorted(ids) == sorted(reference) and len(ids) == len(set(ids))    # every task exactly once
    for name, r in found:
        ref = reference[r["task_id"]]
        assert r["token_ids"] == ref["token_ids"], r["task_id"]
        assert r["finish_reason"] == ref["finish_reason"]
        if rounds:
            assert r.get("emitted_per_round") == ref.get("emitted_per_round"), r["task_id"]
            assert r["forwards"] == ref["forwards"]
        assert name == ("results.jsonl" if r["group"] == 0 else f"results.group{r['group']}.jsonl")
        assert 0 <= r["group"] < dp
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["dp_size"], summary["lp_size"], summary["world_size"]) == (dp, 4 // dp, 4)
    assert summary["prompts"] == TASKS + 1 and summary["errors"] == 1
    assert [g["group"] for g in summary["groups"]] == list(range(dp))       # this run's records, per group
    assert sum(g["prompts"] for g in summary["groups"]) == summary["job_prompts"]
    assert sum(g["new_tokens"] for g in summary["groups"]) == summary["job_new_tokens"]
    # a group of two runs its two collectives per round; a group of one exchanges nothing
    assert summary["collectives_per_round"] == (2 if dp < 4 else 0)
    samples = (out / "samples.jsonl").read_text().splitlines()
    assert [json.loads(s)["task_id"] for s in samples] == [t for t in reference if reference[t]["error"] is None]
    return summary


@pytest.mark.parametrize("lp_size", [4, 2])
def test_splits_decode_every_task_once_like_one_worker(lp_size, reference, tmp_path):
    procs = start_ranks(job(tmp_path, lp_size=lp_size), world=4)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    summary = assert_like_reference(tmp_path / "out", reference, 4 // lp_size)
    assert (summary["job_prompts"], summary["job_errors"]) == (TASKS + 1, 1) and summary["wall_seconds"] > 0
    assert summary["job_tokens_per_second"] > 0 and summary["latency_max_s"] >= summary["latency_p50_s"] > 0
    assert f"{4 // lp_size} LP group" in outs[0][0] and f"{TASKS + 1} prompts (1 error) in" in outs[0][0]
    assert all(o[0] == "" for o in outs[1:])


def test_groups_with_their_own_job_cache_give_the_one_worker_tokens(reference, tmp_path):
    """2 x 2 with lookahead.job_cache on: each group drafts from the completions it decoded
    itself, so forwards may differ from one worker's, never the greedy tokens."""
    procs = start_ranks(job(tmp_path, job_cache=True, lp_size=2), world=4)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert_like_reference(tmp_path / "out", reference, 2, rounds=False)


def kill_and_wait(procs, victim):
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.time()
    took, errs = {}, {}
    try:
        for r, p in enumerate(procs):
            if r != victim:
                p.wait(timeout=TIMEOUT_S + MARGIN_S)
                took[r] = time.time() - killed_at
                errs[r] = p.communicate()[1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    print("exited after", took, errs)
    return took, errs


def intact(out, all_done_ok=False):
    """Records after a failure: every line parses (nothing torn), no task twice, no summary; some
    tasks left unless `all_done_ok` (the surviving groups may finish every prompt before they
    notice a dead group, which then ends the job at the end instead)."""
    found = raw_records(out)
    ids = [r["task_id"] for _, r in found]
    assert len(ids) == len(set(ids)) and len(ids) <= TASKS + 1
    assert all_done_ok or len(ids) < TASKS + 1
    assert not (out / "summary.json").exists()
    return found


def test_killed_follower_ends_every_group(tmp_path):
    """2 x 2: rank 3 (group 1's follower) is killed; group 1's leader fails its collective and says so
    on the store, and group 0 stops at once instead of decoding on."""
    procs = start_ranks(job(tmp_path, lp_size=2), world=4)
    wait_for_records(procs, lambda: written_lines(*(tmp_path / "out").glob("results*.jsonl")), 2)
    took, errs = kill_and_wait(procs, 3)
    assert [procs[r].returncode for r in (0, 1, 2)] == [1, 1, 1], errs
    assert max(took.values()) < TIMEOUT_S + MARGIN_S, took
    # told on the store by group 1's leader, not left to the heartbeat timeout ("rank 3 timed out"): the
    # message says so, where a clock against timeout_s failed once on a loaded machine (20.7 s to exit)
    assert "error: rank 0: worker failed: rank 2" in errs[0] and "timed out" not in errs[0], errs[0]
    assert "Traceback" not in errs[0]
    intact(tmp_path / "out")


def test_killed_group_ends_the_job_and_a_rerun_resumes(reference, tmp_path):
    """4 x 1: rank 2 is a whole group, so no collective notices its death; the others' watchdogs miss
    its heartbeat and end the job within timeout_s. The rerun (same split) decodes the rest: exactly
    one record per task, tokens and per-round counts of the one-worker run."""
    config = job(tmp_path, lp_size=1)
    procs = start_ranks(config, world=4)
    wait_for_records(procs, lambda: written_lines(*(tmp_path / "out").glob("results*.jsonl")), 3)
    took, errs = kill_and_wait(procs, 2)
    assert [procs[r].returncode for r in (0, 1, 3)] == [1, 1, 1], errs
    assert TIMEOUT_S - 1 <= min(took.values()) and max(took.values()) < TIMEOUT_S + MARGIN_S, took
    assert "rank 2 timed out" in errs[0] and "Traceback" not in errs[0]
    kept = intact(tmp_path / "out", all_done_ok=True)
    procs = start_ranks(config, world=4)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    summary = assert_like_reference(tmp_path / "out", reference, 4)
    assert summary["job_prompts"] == TASKS + 1 - len(kept)


# ---- in process ---------------------------------------------------------------------------------------------


def test_mesh_groups_consecutive_ranks():
    assert mesh(4, None) == [[0, 1, 2, 3]] and mesh(4, 4) == [[0, 1, 2, 3]]
    assert mesh(4, 2) == [[0, 1], [2, 3]] and mesh(4, 1) == [[0], [1], [2], [3]]
    assert mesh(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for bad in (3, 0, -1):
        with pytest.raises(ValueError, match="lp_size"):
            mesh(4, bad)


def test_handout_gives_every_index_once_to_concurrent_groups():
    """Three groups claim from one store concurrently (a slow one takes fewer); each index is
    claimed exactly once, and wait_all returns once all three are done."""
    store, total = dist.HashStore(), 60
    claimed = {g: [] for g in range(3)}

    def group(g):
        for i in Handout(store, total, 3):
            claimed[g].append(i)
            time.sleep(0.001 * (g + 1))
        Handout(store, total, 3).done()

    threads = [threading.Thread(target=group, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    Handout(store, total, 3).wait_all()
    for t in threads:
        t.join()
    every = sorted(i for got in claimed.values() for i in got)
    assert every == list(range(total))
    assert len(claimed[0]) > len(claimed[2]) > 0
    assert list(Handout(None, 3, 1)) == [0, 1, 2]


def test_job_figures():
    assert percentile([], 50) is None and percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0 and percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == 4.8

    def rec(t, group, tokens, seconds, error=False):
        return {"task_id": t, "group": group, "new_tokens": tokens, "decode_seconds": seconds,
                "finish_reason": "error" if error else "length"}
    records = [rec("a", 0, 10, 1.0), rec("b", 1, 20, 3.0), rec("c", 1, 0, 0.0, error=True), rec("d", 0, 30, 2.0)]
    f = job_figures(records, RunFacts(4.0, frozenset({"b", "c", "d"})), 2, 2)
    # this run's records only ('a' was written by an earlier run), every group of the run listed
    assert f["groups"] == [{"group": 0, "prompts": 1, "new_tokens": 30}, {"group": 1, "prompts": 2, "new_tokens": 20}]
    assert job_figures(records, RunFacts(4.0, frozenset({"a"})), 3, 1)["groups"] == [
        {"group": 0, "prompts": 1, "new_tokens": 10}, {"group": 1, "prompts": 0, "new_tokens": 0},
        {"group": 2, "prompts": 0, "new_tokens": 0}]
    assert (f["job_prompts"], f["job_errors"]) == (3, 1)
    assert f["job_prompts_per_second"] == 0.75 and f["job_tokens_per_second"] == 12.5
    assert (f["latency_p50_s"], f["latency_max_s"], f["dp_size"], f["lp_size"]) == (2.0, 3.0, 2, 2)


@pytest.mark.parametrize("lp_size, world, message", [
    (3, "4", "distributed.lp_size: 3 must divide the world size 4"),
    (0, "4", "distributed.lp_size: 0 must be >= 1"),
    ("two", "1", "distributed.lp_size: 'two' must be an integer or null"),
])
def test_bad_lp_size_exits_2_naming_the_key(lp_size, world, message, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"distributed": {"lp_size": lp_size}}))
    result = CliRunner().invoke(main, ["--config", str(config)], env={"WORLD_SIZE": world, "RANK": "0"})
    assert result.exit_code == 2 and message in result.output, result.output
