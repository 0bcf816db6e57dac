"""Prompt/output lookup: candidates copied from earlier in the sequence.

On code the continuation often repeats a span of the prompt or of the output
so far. `LookupIndex` remembers where every m-gram (m = 1..max_ngram) of the
committed sequence ended; `candidates` finds the earlier occurrences of the
sequence's last m tokens, longest m first, most recent occurrence first, and
proposes the up to k tokens that followed each one (looking at the `scan`
most recent occurrences of each m-gram, 64 by default, so a round's cost is
bounded however often a token repeats). The index grows with the sequence
(`extend`): nothing is rescanned per round.

`merge_candidates` is the one place candidate lists are combined: a
candidate equal to, or a prefix of, another one adds nothing to verification
(greedy or sampling) and is dropped; the longer one keeps the earlier slot.
"""
from __future__ import annotations

from typing import Iterable, Sequence


def merge_candidates(*sources: Iterable[Sequence[int]], limit: int | None = None) -> list[tuple[int, ...]]:
    """Candidates of all `sources` in order, without duplicates or prefixes of one another."""
    out: list[tuple[int, ...]] = []
    for source in sources:
        for cand in source:
            add_candidate(out, tuple(cand), limit)
    return out


def add_candidate(out: list[tuple[int, ...]], cand: tuple[int, ...], limit: int | None = None) -> None:
    """Add `cand` to `out` (kept free of duplicates and prefixes), in place."""
    if not cand or any(kept[:len(cand)] == cand for kept in out):
        return                # empty, equal to or a prefix of a kept candidate
    covered = [i for i, kept in enumerate(out) if cand[:len(kept)] == kept]
    if covered:               # longer than kept candidates: it takes the first one's slot
        out[covered[0]] = cand
        for i in reversed(covered[1:]):
            del out[i]
    elif limit is None or len(out) < limit:
        out.append(cand)


class LookupIndex:
    """End positions of every m-gram, m = 1..max_ngram, of a growing token sequence."""

    def __init__(self, max_ngram: int, tokens: Sequence[int] = (), scan: int = 64):
        if max_ngram < 1:
            raise ValueError(f"lookup max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.scan = scan          # most recent occurrences looked at per m-gram
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}   # m-gram -> index after each occurrence
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens; cost O(max_ngram) per token."""
        seq = self.tokens
        for t in tokens:
            seq.append(int(t))
            end = len(seq)
            for m in range(1, min(self.max_ngram, end) + 1):
                self._ends.setdefault(tuple(seq[end - m:end]), []).append(end)

    def candidates(self, count: int, length: int) -> list[tuple[int, ...]]:
        """Up to `count` continuations of up to `length` tokens that followed an earlier
        occurrence of the last m tokens (longest m first, most recent first, merged)."""
        seq, n = self.tokens, len(self.tokens)
        out: list[tuple[int, ...]] = []
        if count <= 0 or length <= 0:
            return out
        for m in range(min(self.max_ngram, n - 1), 0, -1):
            # the last end is the suffix itself (end == n): nothing follows it yet
            for end in reversed(self._ends[tuple(seq[n - m:])][-self.scan - 1:-1]):
                add_candidate(out, tuple(seq[end:end + length]), count)
                if len(out) == count:
                    return out
        return out
