"""A worker that dies or hangs mid-job ends the job: the others exit non-zero within
the configured timeout (plus a margin for the exit itself), and the results already
written stay intact. A killed peer is noticed at once (its sockets close); a stopped
one (SIGSTOP) only by `distributed.timeout_s`; rank 0 killed while the others wait for
the next prompt ends them too."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from multiproc import ROOT, prompt_lines, start_python, start_ranks, wait_for_records, write_job, written_lines

TIMEOUT_S = 20
MARGIN_S = 30     # process exit after the failed collective, on a loaded machine


def fault_job(tmp_path, prompts=40, **sections):
    lines = prompt_lines([(f"t{i}", "abcabc" + "xyz"[i % 3] * (i % 5 + 1)) for i in range(prompts)])
    return write_job(tmp_path, lines, **{"generation": {"max_new_tokens": 48},
                                         "distributed": {"timeout_s": TIMEOUT_S}, **sections})


def read_results(path):
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def intact(results, total):
    """Every line parses (nothing torn), one record per task id, the job unfinished."""
    records = read_results(results)
    ids = [r["task_id"] for r in records]
    assert len(ids) == len(set(ids)) and len(ids) < total
    assert not (results.parent / "summary.json").exists()
    return records


def end_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def kill_and_wait(victim, survivor):
    """SIGKILL `victim`, wait for `survivor` to exit: (seconds it took, its stderr)."""
    victim.send_signal(signal.SIGKILL)
    killed_at = time.time()
    survivor.wait(timeout=TIMEOUT_S + MARGIN_S)
    took = time.time() - killed_at
    return took, survivor.communicate()[1]


def test_dead_worker_ends_the_job(tmp_path):
    config = fault_job(tmp_path)
    results = tmp_path / "out" / "results.jsonl"
    procs = start_ranks(config)
    try:
        wait_for_records(procs, lambda: written_lines(results), 3)
        took, err = kill_and_wait(procs[1], procs[0])
    finally:
        end_all(procs)
    assert procs[0].returncode == 1, err
    assert took < TIMEOUT_S + MARGIN_S
    assert "error: rank 0: worker failed" in err and "Traceback" not in err
    assert len(intact(results, 40)) >= 3


def test_stopped_worker_ends_the_job_at_the_timeout(tmp_path):
    """Rank 2 of 3 is stopped (SIGSTOP): its sockets stay open, so only the collective timeout
    can notice. Ranks 0 and 1 exit non-zero no sooner than timeout_s after it stopped and
    within timeout_s plus the margin; rank 0 says which rank it is and what failed."""
    config = fault_job(tmp_path)
    results = tmp_path / "out" / "results.jsonl"
    procs = start_ranks(config, world=3)
    try:
        wait_for_records(procs, lambda: written_lines(results), 3)
        procs[2].send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        took = []
        for p in procs[:2]:
            p.wait(timeout=TIMEOUT_S + MARGIN_S)
            took.append(time.time() - stopped_at)
        errs = [p.communicate()[1] for p in procs[:2]]
    finally:
        end_all(procs)
    print(f"ranks 0 and 1 exited {took[0]:.1f} s and {took[1]:.1f} s after rank 2 stopped:", errs)
    assert [p.returncode for p in procs[:2]] == [1, 1], errs
    assert TIMEOUT_S - 1 <= min(took) and max(took) < TIMEOUT_S + MARGIN_S, took
    assert "error: rank 0: worker failed" in errs[0] and "Traceback" not in errs[0]
    assert re.search(r"timed? ?out", errs[0], re.IGNORECASE)     # the collective timeout, nothing else
    assert "error: rank 1: worker failed" in errs[1]
    assert len(intact(results, 40)) >= 3


def test_rank_0_killed_between_prompts_ends_the_others(tmp_path):
    """Rank 0 is killed while it writes the error records of bad lines, i.e. while rank 1 waits
    for the next prompt (in the broadcast of its ids): rank 1 exits non-zero at once."""
    bad = 2000      # rank 0 alone handles these, one fsynced error record each
    lines = prompt_lines([("first", "abcabcxyz")]) + ["{broken"] * bad + prompt_lines([("last", "xyzxyz")])
    config = write_job(tmp_path, lines, distributed={"timeout_s": TIMEOUT_S})
    results = tmp_path / "out" / "results.jsonl"
    procs = start_ranks(config)
    try:
        wait_for_records(procs, lambda: written_lines(results), 2)
        procs[0].send_signal(signal.SIGSTOP)         # freeze rank 0 to see where it is
        records = read_results(results)
        assert records[0]["task_id"] == "first" and records[-1]["finish_reason"] == "error"
        assert len(records) < 1 + bad, "rank 0 had already left the bad lines"
        took, err = kill_and_wait(procs[0], procs[1])
    finally:
        end_all(procs)
    print(f"rank 1 exited {took:.1f} s after rank 0 was killed:", err)
    assert procs[1].returncode == 1, err
    assert took < TIMEOUT_S + MARGIN_S
    assert "error: rank 1: worker failed" in err and "Traceback" not in err
    kept = intact(results, 2 + bad)
    assert kept[0]["finish_reason"] != "error" and all(r["finish_reason"] == "error" for r in kept[1:])


def test_two_workers_finish_the_job_like_one(tmp_path):
    """The same job without torchrun (P = 1) and with two workers writes the same records
    (float64, where exactness is promised)."""
    config = fault_job(tmp_path, prompts=4, model={"dtype": "float64"})
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


def test_torchrun_max_restarts_resumes_the_job_after_a_killed_worker(tmp_path):
    """Under `torchrun --max-restarts 1` a worker killed mid-job (SIGKILL) is restarted with the other:
    the restarted workers resume the job and finish it, one record per prompt, torchrun exits 0."""
    from lp.processes import descendants

    config = fault_job(tmp_path)
    results = tmp_path / "out" / "results.jsonl"
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", "--max-restarts", "1", "-m", "lp.run", "--config", str(config), "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    try:
        wait_for_records([launcher], lambda: written_lines(results), 3)
        workers = [pid for pid in descendants(launcher.pid)
                   if b"lp.run" in open(f"/proc/{pid}/cmdline", "rb").read() and pid != launcher.pid]
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    ids = [r["task_id"] for r in read_results(results)]
    assert sorted(ids) == sorted(f"t{i}" for i in range(40)) and (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("sets", [(), ("distributed.lp_size=1",), ("generation.batch_size=3",)],
                         ids=["one-group", "two-groups", "batched"])
def test_two_nodes_of_multi_node_sh_resume_the_job_after_a_killed_worker(tmp_path, sets):
    """launch/multi_node.sh on two nodes (two agents here, one worker each) with MAX_RESTARTS=1: a
    worker killed mid-job restarts the workers of both nodes, which resume and finish the job. A node's
    restart count is its own, so the attempt's store comes from TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    which the script sets; without it every such restart failed. The keys on it (the hand-out of two LP
    groups, the watchdog's beats, the row budget's startup wait) carried each node's count, so after the
    restart the nodes waited on different keys: both groups decoded every prompt, and the job failed."""
    from lp.processes import descendants
    from multiproc import free_port

    config = fault_job(tmp_path)
    sets = [arg for s in sets for arg in ("--set", s)]
    results = tmp_path / "out" / "results.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", NNODES="2", NPROC="1", HEAD_ADDR="127.0.0.1",
               PORT=str(free_port()), JOB_ID=f"lp-test-{os.getpid()}", MAX_RESTARTS="1")
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    nodes = [subprocess.Popen(["bash", str(ROOT / "launch" / "multi_node.sh"), "--config", str(config), "--quiet",
                               *sets],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              start_new_session=True) for _ in range(2)]

    def worker(node):
        return [pid for pid in descendants(node.pid) if b"torch.distributed.run" not in
                open(f"/proc/{pid}/cmdline", "rb").read() and b"lp.run" in open(f"/proc/{pid}/cmdline", "rb").read()]
    try:
        wait_for_records(nodes, lambda: written_lines(results), 3)
        (victim,) = worker(nodes[1])
        os.kill(victim, signal.SIGKILL)
        errs = [node.communicate(timeout=300)[1] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], [e[-2000:] for e in errs]
    ids = [r["task_id"] for path in sorted(results.parent.glob("results*.jsonl")) for r in read_results(path)]
    assert sorted(ids) == sorted(f"t{i}" for i in range(40)) and (tmp_path / "out" / "summary.json").exists()


def test_restarts_on_several_nodes_without_a_store_per_attempt_are_refused(monkeypatch):
    """Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (launch/multi_node.sh sets it) torchrun keeps one store
    across restarts, and on several nodes lp's keys of an attempt name no restart count: a restart would
    read the killed attempt's hand-out counter and done marks. Refused in one line before the rendezvous."""
    import datetime

    from lp.parallel.dist import attempt_store

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    with pytest.raises(ValueError, match="--max-restarts on several nodes needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        attempt_store(datetime.timedelta(seconds=5))
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    assert attempt_store(datetime.timedelta(seconds=5)) is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    assert attempt_store(datetime.timedelta(seconds=5)) is None        # no restart to come: no store is shared


LATE_JOINER = """
import json, os, sys, time
import torch.distributed as dist
from lp.parallel.dist import init_distributed
rank, late, lp_size = int(os.environ["RANK"]), float(sys.argv[1]), int(sys.argv[2]) or None
if rank == 1:
    time.sleep(late)            # joins `late` s after rank 0
comm = init_distributed("gloo", 1.0, "cpu", lp_size)
if rank == 1:
    time.sleep(late)            # and misses the first collective by as much
start = time.monotonic()
try:
    dist.barrier(group=comm.job_group)
    outcome = "passed"
except Exception:               # noqa: BLE001
    outcome = "timed out"
print(json.dumps({"outcome": outcome, "waited": time.monotonic() - start}), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("lp_size", [0, 1], ids=["lp2", "dp2"])
def test_a_late_rank_joins_but_a_late_collective_times_out(tmp_path, lp_size):
    """Joining the job's process groups is not bounded by distributed.timeout_s: ranks reach it seconds
    apart on a loaded node, and a 1 s timeout once failed CI's job at startup ("Gloo connectFullMesh failed
    ... wait timeout after 1000ms"). Once joined, a collective is: rank 0 waits about 1 s for rank 1."""
    late = 4.0
    procs = start_python(["-c", LATE_JOINER, str(late), str(lp_size)])
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        end_all(procs)
    assert procs[0].returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["outcome"] == "timed out" and result["waited"] < late - 1, result
