"""How lp's one-line messages quote what they were given and what went wrong, and what text they refuse."""
from __future__ import annotations

from typing import Any


def short_repr(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: for messages that quote what was given."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(error: BaseException, *, named: bool = True, limit: int = 600) -> str:
    """An exception as one line: its type's name (with `named`), then its message with every run of
    whitespace, newlines included, made one space, cut to `limit` characters."""
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if named else text


def lone_surrogate(text: str) -> int | None:
    """Where JSON's or YAML's \\uD800-\\uDFFF escapes left a lone surrogate in `text` (no UTF-8 encodes
    one, so no record or file could hold it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None
