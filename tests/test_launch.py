"""launch/: the torchrun wrappers refuse a worker count torchrun itself would answer with a traceback,
and check the job before torchrun starts a worker."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_single_node_refuses_zero_workers():
    proc = subprocess.run(["bash", str(ROOT / "launch" / "single_node.sh"), "0", "--config", "job.yaml"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "error: launch/single_node.sh: P must be >= 1 (workers), got 0"


def test_single_node_says_its_usage():
    """No arguments, or a P that is not a number, is its own usage line (exit 2), not lp.run's; --help
    says it before lp.run's options."""
    script = str(ROOT / "launch" / "single_node.sh")
    nothing = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and nothing.stderr.startswith("usage: launch/single_node.sh [P] --config")
    word = subprocess.run(["bash", script, "two", "--config", "job.yaml"], capture_output=True, text=True, timeout=60)
    assert word.returncode == 2 and "P must be a whole number of workers, got 'two'" in word.stderr
    helped = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: launch/single_node.sh [P]")
    assert "--config" in helped.stdout.split("lp.run's options:")[1]


def test_single_node_checks_the_job_before_torchrun(tmp_path):
    """A bad config or prompt file is the worker's one error line and its status, without torchrun's
    traceback; a good one reaches torchrun (here its workers only --check too)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"task_id": "t/0", "prompt": "def f(x):"}) + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "tiny-random-llama?vocab=64&seed=0", "device": "cpu"},
                                      "data": {"source": "jsonl", "path": str(prompts)},
                                      "output": {"dir": str(tmp_path / "out")}}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def launch(*args):
        return subprocess.run(["bash", str(ROOT / "launch" / "single_node.sh"), "2", "--config", str(config), *args],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    bad = launch("--set", "distributed.lp_size=3")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.splitlines()[1].strip() == ("distributed.lp_size: 3 must divide the world size 2 (the workers "
                                                  "form world_size / lp_size LP groups of lp_size)")
    missing = launch("--set", f"data.path={tmp_path}/none.jsonl")
    assert missing.returncode == 1 and missing.stderr.startswith("error: prompt file not found"), missing.stderr
    assert "Traceback" not in missing.stderr
    good = launch("--check")
    assert good.returncode == 0, good.stderr[-2000:]
    assert good.stdout.count("ok: ") == 1 and "1 of 1 prompts to decode" in good.stdout   # rank 0's line
    assert not (tmp_path / "out").exists()


def test_torchrun_names_a_workers_error_line_as_the_root_cause(tmp_path):
    """Launched by torchrun itself (no check first), a worker's error line is its reply file, so that
    torchrun's failure summary names it as the root cause of every failed rank, not a link to its docs;
    ranks other than 0 do not print it."""
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "tiny-random-llama?vocab=64&seed=0", "device": "cpu"},
                                      "output": {"dir": str(tmp_path / "out")}}))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "lp.run", "--config", str(config), "--set", "distributed.lp_size=3"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = "distributed.lp_size: 3 must divide the world size 2"
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = proc.stderr[proc.stderr.index("Failures:"):]
    assert summary.count("traceback : error: invalid config") == 2 and summary.count(line) == 2, summary
    assert "To enable traceback" not in summary
    assert proc.stderr[:proc.stderr.index("Traceback")].count(line) == 1    # printed by rank 0 alone


def test_torchrun_names_a_usage_error_as_the_root_cause(tmp_path):
    """A usage error (here --force with --fresh) was click's own: its usage text on every rank, and
    torchrun's summary pointing at its docs. Rank 0 alone shows it now, and every rank's reply file holds
    its line."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "lp.run", "--config", "job.yaml", "--force", "--fresh"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = "--force (resume despite a changed config) and --fresh (discard the results) exclude each other"
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = proc.stderr[proc.stderr.index("Failures:"):]
    assert summary.count(f"traceback : error: {line}") >= 1 and "To enable traceback" not in summary, summary
    assert proc.stderr.count("Usage: ") == 1
