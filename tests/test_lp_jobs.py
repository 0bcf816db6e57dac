"""Jobs under torchrun (2 gloo workers): a bad prompt is known to rank 0 only and is never sent,
the baseline and the autoregressive method keep the ranks in step, and a startup refusal on
rank 0 ends the other rank at once, with rank 0's exit status, instead of at the collective timeout."""
import json
import time

import pytest
from click.testing import CliRunner
from multiproc import start_ranks, write_job

from lp.run import main

TIMEOUT_S = 120   # a rank left waiting would take this long: the tests finish far sooner


def bad_prompts_job(tmp_path):
    lines = [json.dumps({"task_id": "a", "prompt": "abcabcxyz"}), json.dumps({"task_id": "empty", "prompt": ""}),
             "{broken", json.dumps({"task_id": "long", "prompt": "q" * 2100}),
             json.dumps({"task_id": "b", "prompt": "xyzxyzab"}), json.dumps({"task_id": "c", "prompt": "hello hello"})]
    return write_job(tmp_path, lines, model={"dtype": "float64"}, distributed={"timeout_s": TIMEOUT_S},
                     baseline={"enabled": True})


def launch(config, *args, world=2, quiet=True, timeout_s=TIMEOUT_S):
    procs = start_ranks(config, *args, world=world, quiet=quiet)
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bad_prompts_and_baseline_under_two_workers(tmp_path):
    config = bad_prompts_job(tmp_path)
    one = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", f"output.dir={tmp_path / 'one'}"])
    assert one.exit_code == 0, one.output
    codes, outs = launch(config)
    assert codes == [0, 0], outs
    assert "world size 2 (gloo)" in outs[0][0] and outs[1][0] == ""
    single, multi = records(tmp_path / "one" / "results.jsonl"), records(tmp_path / "out" / "results.jsonl")
    assert [r["task_id"] for r in multi] == ["a", "empty", "<line 3>", "long", "b", "c"]
    assert [r["finish_reason"] == "error" for r in multi] == [False, True, True, True, False, False]
    assert [r["token_ids"] for r in multi] == [r["token_ids"] for r in single]
    assert all(r["baseline_ids_equal"] for r in multi if r["finish_reason"] != "error")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["errors"] == 3 and summary["baseline_ids_equal_fraction"] == 1.0


@pytest.mark.slow
def test_refusal_on_rank_0_ends_every_rank_and_autoregressive_runs_in_step(tmp_path):
    config = bad_prompts_job(tmp_path)
    assert launch(config)[0] == [0, 0]
    start = time.time()
    codes, outs = launch(config, "--set", "generation.max_new_tokens=8")
    assert codes == [2, 2], outs                                  # rank 0 refuses, rank 1 stops with it
    assert time.time() - start < TIMEOUT_S / 2
    assert "different config" in outs[0][1] and "rank 1: global rank 0 refused the job at startup" in outs[1][1]
    codes, outs = launch(config, "--fresh", "--set", "generation.method=autoregressive")
    assert codes == [0, 0], outs
    got = records(tmp_path / "out" / "results.jsonl")
    assert [r["method"] for r in got] == ["autoregressive"] * 6
    assert all(r["baseline_ids_equal"] for r in got if r["finish_reason"] != "error")


@pytest.mark.parametrize("lp_size", [2, 1])
def test_a_startup_refusal_fails_every_rank_of_every_group(tmp_path, lp_size):
    """One LP group of two, or two groups of one: rank 0 refuses a resume with another config (exit 2)
    and every other rank exits 2 too, saying so in one line (it used to end 0 as if the job had run)."""
    lines = [json.dumps({"task_id": t, "prompt": p}) for t, p in [("a", "abcabc"), ("b", "xyzxyz")]]
    config = write_job(tmp_path, lines, distributed={"timeout_s": TIMEOUT_S, "lp_size": lp_size})
    first = CliRunner().invoke(main, ["--config", str(config), "--quiet", "--set", "distributed.lp_size=null"])
    assert first.exit_code == 0, first.output
    start = time.time()
    codes, outs = launch(config, "--set", "generation.max_new_tokens=3")
    assert codes == [2, 2], outs
    assert time.time() - start < TIMEOUT_S / 2
    assert "different config" in outs[0][1]
    errors = [line for line in outs[1][1].splitlines() if line.startswith("error:")]
    assert errors == ["error: rank 1: global rank 0 refused the job at startup (exit 2): its error line says why"]


def test_progress_counts_every_groups_records(tmp_path):
    """Two LP groups of one: the job-wide count each leader's progress line (and global rank 0's bar)
    shows runs 1..N over both groups, each number once (it used to count each group's own records)."""
    import re

    lines = [json.dumps({"task_id": f"t{i}", "prompt": p}) for i, p in enumerate(["abcabc", "xyzxyz", "hello", "abab"])]
    config = write_job(tmp_path, lines, distributed={"timeout_s": TIMEOUT_S, "lp_size": 1},
                       generation={"max_new_tokens": 6})
    codes, outs = launch(config, quiet=False)
    assert codes == [0, 0], outs
    counts = [int(m) for _, err in outs for m in re.findall(r"\[(\d+)/4\] t\d", err)]
    assert sorted(counts) == [1, 2, 3, 4], outs


def test_the_bar_follows_the_other_groups(capsys):
    """Global rank 0's bar on a shared store: another group's records move it, while rank 0 decodes and
    while it waits for the others."""
    from torch.distributed import HashStore

    from lp.jobs.handout import Handout
    from lp.jobs.runner import Progress, _count

    store = HashStore()
    mine, other = Handout(store, 5, 2), Handout(store, 5, 2)
    bar = Progress(5, kept=1, enabled=True)
    try:
        other.finish_one(), other.finish_one()                   # group 1 wrote two records
        bar.advance(done=_count(bar, mine))                      # rank 0 writes its first
        assert bar.done == bar.bar.n == 4
        mine.done()
        other.finish_one()
        other.done()
        mine.wait_all(poll=lambda: bar.advance(done=bar.kept + mine.finished()))
        assert bar.done == bar.bar.n == 5
    finally:
        bar.close()


def test_the_bars_latency_figures_are_the_records_percentiles():
    """The bar sorted every latency at each record (quadratic over a long job); it keeps them sorted, and
    its p50 and p95 are still those of the records, whatever order they end in."""
    import random
    from types import SimpleNamespace

    from lp.jobs.runner import Progress
    from lp.jobs.summary import percentile

    rng = random.Random(0)
    seconds = [rng.uniform(0.1, 9.0) for _ in range(200)]
    bar = Progress(len(seconds), kept=0, enabled=True)
    try:
        for s in seconds:
            bar.advance(SimpleNamespace(new_tokens=4, forwards=2, decode_seconds=s, batch_per_round=None,
                                        fed_rows_per_round=None, rows_per_round=[3, 3]))
        assert bar.latency == sorted(seconds)
        assert f"p50 {percentile(seconds, 50):.1f} s, p95 {percentile(seconds, 95):.1f} s" in bar.bar.postfix
    finally:
        bar.close()
