"""Greedy verification of candidate suffixes (DESIGN.md section 4)."""
from __future__ import annotations

from typing import NamedTuple, Sequence


class Verdict(NamedTuple):
    hits: int               # a: accepted guess tokens of the best candidate
    candidate: int          # index of the best candidate (-1 when none hit)
    emitted: list[int]      # a+1 tokens: z* then the target's predictions along it


def verify_greedy(
    next_token: int,
    candidates: Sequence[Sequence[int]],
    predictions: Sequence[Sequence[int]],
) -> Verdict:
    """Longest verified prefix among the candidates.

    `next_token` is z*, the argmax of the ordinary row. `predictions[c][s]` is
    the argmax of candidate c's row at offset s. Candidate c matches `a` tokens
    when g_1 = z* and g_{s+1} = predictions[c][s-1] for s < a. The round emits z*
    followed by predictions[c][0..a-1]: when all guesses match, the prediction
    after the last guess is a free extra token. Ties go to the lowest index.
    """
    best_hits, best_c = 0, -1
    for c, guess in enumerate(candidates):
        if not guess or guess[0] != next_token:
            continue
        a = 1
        while a < len(guess) and guess[a] == predictions[c][a - 1]:
            a += 1
        if a > best_hits:
            best_hits, best_c = a, c
    emitted = [next_token] + (list(predictions[best_c][:best_hits]) if best_c >= 0 else [])
    return Verdict(best_hits, best_c, emitted)
