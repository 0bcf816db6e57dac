"""A worker that dies mid-job ends the job: the survivors exit non-zero within
the configured timeout, and the results already written stay intact."""
import json
import os
import signal
import subprocess
import sys
import time

from multiproc import ROOT, prompt_lines, start_ranks, write_job

TIMEOUT_S = 20


def fault_job(tmp_path, prompts=40):
    lines = prompt_lines([(f"t{i}", "abcabc" + "xyz"[i % 3] * (i % 5 + 1)) for i in range(prompts)])
    return write_job(tmp_path, lines, generation={"max_new_tokens": 48}, distributed={"timeout_s": TIMEOUT_S})


def read_results(path):
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def test_dead_worker_ends_the_job(tmp_path):
    config = fault_job(tmp_path)
    results = tmp_path / "out" / "results.jsonl"
    procs = start_ranks(config)
    try:
        deadline = time.time() + 180
        while len(read_results(results)) < 3:
            assert time.time() < deadline, "job made no progress"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.time()
        procs[0].wait(timeout=TIMEOUT_S + 30)
        took = time.time() - killed_at
        _, err = procs[0].communicate()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode not in (0, None)
    assert took < TIMEOUT_S + 30
    assert "rank 0" in err and "Traceback" not in err
    records = read_results(results)             # every line parses: nothing torn
    ids = [r["task_id"] for r in records]
    assert len(ids) >= 3 and len(ids) == len(set(ids)) and len(ids) < 40
    assert not (tmp_path / "out" / "summary.json").exists()


def test_two_workers_finish_the_job_like_one(tmp_path):
    """The same job without torchrun (P = 1) and with two workers writes the same records."""
    config = fault_job(tmp_path, prompts=4)
    one = subprocess.run([sys.executable, "-m", "lp.run", "--config", str(config), "--quiet",
                          "--set", f"output.dir={tmp_path / 'one'}"],
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    procs = start_ranks(config)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "world size 2 (gloo)" in outs[0][0] and outs[1][0] == ""   # only rank 0 prints
    single = read_results(tmp_path / "one" / "results.jsonl")
    multi = read_results(tmp_path / "out" / "results.jsonl")
    assert [r["token_ids"] for r in multi] == [r["token_ids"] for r in single]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["collectives_per_round"] == 2
    assert summary["bytes_per_round"] > 0 and summary["max_rows_per_round"] > 0
