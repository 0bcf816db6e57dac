"""Prefix reuse across a batch's cache rows (host bookkeeping only; the copy is
lp.decode.kv_cache.copy_prefix).

A request's cache row holds, at slots 0..cached-1, the K/V of its first `cached` committed tokens
(prompt, then output). When the request leaves its row (it ends, or moves down to a lower row), the
row keeps them until another request writes there. A joining prompt whose first tokens equal what
a row holds (an active request's, or the last one a free row held) gets those slots' K/V copied
into its own row and prefills only the rest: a causal model's K/V at a position depend only on the
tokens up to it, so the copied slots hold what its own prefill would write (up to float rounding:
the tokens are the same in float64). Chat prompts share their template and system prompt, and a
code job's prompts often their first lines: on the default job 27% of the prompt tokens.
"""
from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RowPrefixes:
    """Which tokens' K/V each of a batch's `rows` cache rows holds at its leading slots once its
    request has left it (active rows are read off their requests)."""

    def __init__(self, rows: int):
        self.held: list[Sequence[int]] = [()] * rows

    def left(self, row: int, tokens: Sequence[int]) -> None:
        """A request left `row` holding the K/V of `tokens` (its committed tokens in the cache)."""
        self.held[row] = tokens

    def best(self, prompt: Sequence[int], row: int, live: dict[int, Sequence[int]]) -> tuple[int, int]:
        """(source row, tokens) of the longest reusable prefix of `prompt` joining at `row`: over the
        active rows' tokens (`live`: row -> tokens in the cache) and what the free rows hold; the
        joining row itself first (nothing to copy). At most len(prompt) - 1 tokens: the prefill
        feeds one row at least (its last token's row gives the first new token). The joining row
        holds nothing reusable afterwards until its request leaves it."""
        order = [row] + [r for r in range(len(self.held)) if r != row]
        source, length = row, 0
        for r in order:
            n = common_prefix(prompt, live.get(r, self.held[r]))
            if n > length:
                source, length = r, n
        self.held[row] = ()
        return source, min(length, len(prompt) - 1)
