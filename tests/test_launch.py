"""launch/: the torchrun wrappers refuse a worker count torchrun itself would answer with a traceback."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_single_node_refuses_zero_workers():
    proc = subprocess.run(["bash", str(ROOT / "launch" / "single_node.sh"), "0", "--config", "job.yaml"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "error: launch/single_node.sh: P must be >= 1 (workers), got 0"
