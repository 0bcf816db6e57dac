"""A worker that dies mid-job ends the job: the survivors exit non-zero within
the configured timeout, and the results already written stay intact."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(tmp_path, prompts=40):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": "abcabc" + "xyz"[i % 3] * (i % 5 + 1)}) + "\n"
                            for i in range(prompts)))
    cfg = {
        "model": {"name": "tiny-random-llama?vocab=64&seed=0", "dtype": "float32", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 4, "guesses": 4},
        "generation": {"max_new_tokens": 48},
        "data": {"source": "jsonl", "path": str(data), "limit": None},
        "output": {"dir": str(tmp_path / "out")},
        "distributed": {"backend": "gloo", "timeout_s": TIMEOUT_S},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(config, world, port):
    procs = []
    for rank in range(world):
        env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "lp.run", "--config", str(config), "--quiet"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def read_results(path):
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def test_dead_worker_ends_the_job(tmp_path):
    config = write_job(tmp_path)
    results = tmp_path / "out" / "results.jsonl"
    procs = launch(config, 2, free_port())
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
    config = write_job(tmp_path, prompts=4)
    one = subprocess.run([sys.executable, "-m", "lp.run", "--config", str(config), "--quiet",
                          "--set", f"output.dir={tmp_path / 'one'}"],
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    procs = launch(config, 2, free_port())
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "world size 2 (gloo)" in outs[0][0] and outs[1][0] == ""   # only rank 0 prints
    single = read_results(tmp_path / "one" / "results.jsonl")
    multi = read_results(tmp_path / "out" / "results.jsonl")
    assert [r["token_ids"] for r in multi] == [r["token_ids"] for r in single]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["collectives_per_round"] == 2
    assert summary["bytes_per_round"] > 0 and summary["max_rows_per_round"] > 0
