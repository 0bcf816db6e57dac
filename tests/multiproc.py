"""Helpers for tests that start several `python -m lp.run` ranks by hand (no torchrun, its store in the test),
so that what a rank does when a peer dies or refuses is our code's doing."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml
from torch.distributed import TCPStore

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(tmp_path: Path, lines: list[str], **sections) -> Path:
    """A tiny-model JSONL job (float32, W=N=G=4, gloo) with `sections` merged over it."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    cfg = {
        "model": {"name": "tiny-random-llama?vocab=64&seed=0", "dtype": "float32", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 4, "guesses": 4},
        "generation": {"max_new_tokens": 16, "batch_size": 1},   # one request at a time unless a test batches
        "data": {"source": "jsonl", "path": str(data), "limit": None},
        "output": {"dir": str(tmp_path / "out")},
        "distributed": {"backend": "gloo", "timeout_s": 120},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def prompt_lines(records: list[tuple[str, str]]) -> list[str]:
    return [json.dumps({"task_id": t, "prompt": p}) for t, p in records]


def start_python(args: list[str], world: int = 2, **env) -> list[subprocess.Popen]:
    """`world` ranks of `python *args` (pipes for stdout and stderr), started as torchrun starts them:
    the job's c10d store lives in this (the launching) process, like torchrun's agent store, and every
    rank is only its client. (When rank 0 hosted it, its exit right after a startup refusal, with rank
    1 leaving at the same moment, once aborted in CI: 'terminate called without an active exception'
    from the store's teardown. A process group freed at interpreter exit aborts the same way:
    lp.parallel.dist.shutdown(comm) drops the Comm's groups first.) Each process keeps a reference to the store (`proc.store`), so it
    lives as long as they are waited on. `env`: more environment variables for every rank."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)     # port 0: any free port
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                        TORCHELASTIC_USE_AGENT_STORE="True", RANK=str(rank), LOCAL_RANK=str(rank),
                        WORLD_SIZE=str(world), OMP_NUM_THREADS="1", **env)
        proc = subprocess.Popen([sys.executable, *args], env=rank_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.store = store
        procs.append(proc)
    return procs


def start_ranks(config: Path, *args: str, world: int = 2, quiet: bool = True) -> list[subprocess.Popen]:
    """`world` ranks of `python -m lp.run --config config *args` (start_python)."""
    return start_python(["-m", "lp.run", "--config", str(config), *(["--quiet"] if quiet else []), *args], world)


def written_lines(*paths: Path) -> int:
    """The whole lines (ending in a newline) of results files a running job writes: a poll may read a
    line half written."""
    return sum(path.read_bytes().count(b"\n") for path in paths if path.exists())


def wait_for_records(procs: list[subprocess.Popen], count_records, count: int) -> None:
    """Poll `count_records()` until it reaches `count`; every rank must stay alive meanwhile."""
    deadline = time.time() + 180
    while count_records() < count:
        assert time.time() < deadline, "job made no progress"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.002)
