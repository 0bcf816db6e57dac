"""The embedded job through `torchrun --nproc 2 -m lp.run` gives the P = 1 completions
(SmolLM2-135M, float32, 5 HumanEval prompts; the two workers convert the GGUF into an empty
cache), and so does `torchrun --nproc 4` split into two
LP groups of two (distributed.lp_size: 2; 2 prompts x 32 tokens). Slow: minutes on two CPU cores."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_job(tmp_path, name, nproc, sets=("data.limit=5", "generation.max_new_tokens=128"), cache=None):
    out = tmp_path / name
    sets = [*sets, f"output.dir={out}", "model.device=cpu"]
    job = ["-m", "lp.run", "--config", str(ROOT / "configs" / "humaneval-smollm2.yaml"), "--quiet"]
    for s in sets:
        job += ["--set", s]
    if nproc == 1:
        cmd = [sys.executable] + job
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] + job
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **({"LP_CACHE_DIR": str(cache)} if cache else {}))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for path in sorted(out.glob("results*.jsonl")) for line in path.read_text().splitlines()]
    order = {p["task_id"]: i for i, p in enumerate(json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines())}
    return sorted(records, key=lambda r: order.get(r["task_id"], -1))


def test_torchrun_two_workers_match_one(tmp_path):
    """torchrun first, on an empty model cache: its ranks convert the GGUF (a rank other than 0 once
    left a copy without weights that every later load refused)."""
    two = run_job(tmp_path, "p2", 2, cache=tmp_path / "cache")
    one = run_job(tmp_path, "p1", 1, cache=tmp_path / "cache")
    assert [r["task_id"] for r in two] == [r["task_id"] for r in one]
    assert [r["completion"] for r in two] == [r["completion"] for r in one]
    assert [r["token_ids"] for r in two] == [r["token_ids"] for r in one]


def test_torchrun_four_workers_as_two_lp_groups_match_one(tmp_path):
    sets = ("data.limit=2", "generation.max_new_tokens=32")
    one = run_job(tmp_path, "p1", 1, sets)
    four = run_job(tmp_path, "p4", 4, (*sets, "distributed.lp_size=2"))
    assert [r["task_id"] for r in four] == [r["task_id"] for r in one] and len(one) == 2
    assert [r["token_ids"] for r in four] == [r["token_ids"] for r in one]
    summary = json.loads((tmp_path / "p4" / "summary.json").read_text())
    assert (summary["world_size"], summary["dp_size"], summary["lp_size"]) == (4, 2, 2)
