"""Suffix-match proposals: draft trees copied from earlier occurrences of the context.

`SuffixIndex` remembers where every m-gram (m = 1..`max_ngram`) ends in a
growing set of token sequences: one request's prompt and output, or every
earlier completion of a job. `draft(context)` finds the longest suffix of the
context that occurred before with something after it, for every match
length L (extended past `max_ngram` token by token), gathers what followed
each of those occurrences, and turns the continuations into a tree whose node
score is the fraction of occurrences that continue through the node (a
relative frequency; it never grows from parent to child). The tree's size
adapts to the match: at most `factor * L` nodes (a long match is a confident
one), never nodes whose score is below `min_score`; of the trees for the
different L, the one with the largest expected gain (sum of score -
min_score) wins.

`spans(context, count, length, max_ngram)` is prompt/output lookup on the
same index: the up to `count` distinct continuations of up to `length`
tokens that followed the last m context tokens, longest m (<= max_ngram)
first, most recent occurrence first; a continuation that equals or prefixes
a kept one adds nothing and is dropped (the longer one keeps the slot).

The drafts follow the idea of SuffixDecoding (Oliaro et al., arXiv 2411.04975) on a
plain m-gram index instead of a suffix tree: appending a token costs
O(max_ngram) dictionary updates, a draft looks at no more than `scan`
occurrences (the most recent), so a round's cost stays bounded however long
the job grows. Its memory is bounded by `most_tokens`: adding a sequence past
it forgets the oldest whole sequences first (a job's earliest completions),
never the newest (so one sequence longer than the bound stays whole).
"""
from __future__ import annotations

import math
import sys
from typing import Iterable, NamedTuple, Sequence

END_BITS = 32                   # an occurrence is (sequence << END_BITS | end): ends below 2**32
END_MASK = (1 << END_BITS) - 1


class Draft(NamedTuple):
    """Nodes in parent-before-child order: (token, parent, score); parent -1 is the root."""
    tokens: list[int]
    parents: list[int]
    scores: list[float]
    match: int          # L, the context tokens the draft is conditioned on

    def __len__(self) -> int:
        return len(self.tokens)


NO_DRAFT = Draft([], [], [], 0)


class SuffixIndex:
    """End positions of every m-gram, m = 1..max_ngram, of a set of growing sequences."""

    def __init__(self, max_ngram: int = 8, scan: int = 64, most_tokens: int | None = None):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if most_tokens is not None and most_tokens < 0:
            raise ValueError(f"most_tokens must be >= 0 (or None: no bound), got {most_tokens}")
        self.max_ngram = max_ngram
        self.scan = scan                         # most recent occurrences looked at per draft
        self.most_tokens = most_tokens           # None: no bound
        self.seqs: list[list[int]] = []          # a forgotten sequence is [] (ids stay those given out)
        self.tokens = 0                          # in the sequences kept
        self.first = 0                           # the oldest sequence kept
        # m-gram -> its occurrences' (seq << END_BITS | end), oldest first, 8 bytes each in a bytearray,
        # which the garbage collector does not track: a list per m-gram made millions of tracked objects
        # over a job's completions, and every full collection walked them (372 ms at 575k tokens, a
        # stall of the whole batch; 11 ms now)
        self._ends: dict[tuple[int, ...], bytearray] = {}

    def __len__(self) -> int:
        return self.tokens

    def add(self, tokens: Iterable[int] = ()) -> int:
        """Start a new sequence; returns its id. Past `most_tokens`, the oldest sequences are forgotten
        first (never the new one)."""
        self.seqs.append([])
        seq_id = len(self.seqs) - 1
        self.extend(seq_id, tokens)
        while self.most_tokens is not None and self.tokens > self.most_tokens and self.first < seq_id:
            self._forget(self.first)
            self.first += 1
        return seq_id

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append tokens to sequence `seq_id`; O(max_ngram) per token."""
        seq, ends = self.seqs[seq_id], self._ends
        if seq_id < self.first:
            raise ValueError(f"sequence {seq_id} was forgotten")
        for t in tokens:
            seq.append(int(t))
            self.tokens += 1
            end = len(seq)
            entry = (seq_id << END_BITS | end).to_bytes(8, sys.byteorder)
            for m in range(1, min(self.max_ngram, end) + 1):
                key = tuple(seq[end - m:end])
                bucket = ends.get(key)
                if bucket is None:
                    ends[key] = bytearray(entry)
                else:
                    bucket += entry

    def _forget(self, seq_id: int) -> None:
        """Drop sequence `seq_id`'s occurrences, O(max_ngram) per token. They lead each bucket where the
        sequences were added whole (a job's completions): occurrences are kept oldest first."""
        seq, ends = self.seqs[seq_id], self._ends
        for end in range(1, len(seq) + 1):
            entry = (seq_id << END_BITS | end).to_bytes(8, sys.byteorder)
            for m in range(1, min(self.max_ngram, end) + 1):
                key = tuple(seq[end - m:end])
                bucket = ends[key]
                if bucket[:8] == entry:
                    del bucket[:8]              # a bytearray drops its head in place
                else:                           # grown alongside a newer sequence
                    at = memoryview(bucket).cast("q").tolist().index(int.from_bytes(entry, sys.byteorder))
                    del bucket[8 * at:8 * at + 8]
                if not bucket:
                    del ends[key]
        self.tokens -= len(seq)
        self.seqs[seq_id] = []

    def _occurrences(self, gram: Sequence[int], last: int) -> list[tuple[int, int]]:
        """The (seq, end) of the last `last` occurrences of `gram`, most recent first."""
        bucket = self._ends.get(tuple(gram))
        if bucket is None:
            return []
        if len(bucket) == 8:        # one occurrence, as most longer m-grams have
            v = int.from_bytes(bucket, sys.byteorder)
            return [(v >> END_BITS, v & END_MASK)]
        return [(v >> END_BITS, v & END_MASK) for v in reversed(memoryview(bucket)[-8 * last:].cast("q"))]

    def matches(self, context: Sequence[int], max_match: int = 64) -> list[tuple[int, list[tuple[int, int]]]]:
        """The match lengths L (1 <= L <= max_match) for which the last L context tokens
        occurred with at least one token after them, with the (sequence, end) of those
        occurrences, most recent first; L ascending. At most `scan` occurrences of each
        m-gram are looked at. Past `max_ngram` the longest m-gram's occurrences are
        extended token by token, and only the lengths at which one of them stops
        matching are listed (a length in between has the same occurrences as the next
        listed one and a smaller draft, so it never gives a better draft)."""
        seqs, n, out = self.seqs, len(context), []
        for m in range(1, min(self.max_ngram, n, max_match) + 1):
            found = [(s, e) for s, e in self._occurrences(context[n - m:], self.scan) if e < len(seqs[s])]
            if not found:
                return out
            out.append((m, found))
        if not out or out[-1][0] < self.max_ngram:
            return out
        m, found = out[-1]
        lengths = []
        for s, e in found:
            seq, length = seqs[s], m
            while (length < max_match and length < n and e - length > 0
                   and seq[e - length - 1] == context[n - length - 1]):
                length += 1
            lengths.append(length)
        for length in sorted(set(lengths) - {m}):
            out.append((length, [o for o, k in zip(found, lengths) if k >= length]))
        return out

    def spans(self, context: Sequence[int], count: int, length: int, max_ngram: int) -> list[tuple[int, ...]]:
        """Lookup candidates (see the module docstring)."""
        out: list[tuple[int, ...]] = []
        if count <= 0 or length <= 0:
            return out
        n = len(context)
        for m in range(min(max_ngram, self.max_ngram, n), 0, -1):
            for s, e in self._occurrences(context[n - m:], self.scan + 1):
                cont = tuple(self.seqs[s][e:e + length])
                if cont:
                    _add_span(out, cont, count)
                    if len(out) == count:
                        return out
        return out

    def draft(self, context: Sequence[int], max_nodes: int, factor: float = 1.0, min_score: float = 0.0,
              max_match: int = 64) -> Draft:
        """The best draft over all match lengths L: for each, the continuations of the
        occurrences of the last L tokens as a tree of at most min(max_nodes, factor * L)
        nodes (best scores first; ties: shallower, then the most recent occurrence),
        without nodes scored below `min_score`; the draft with the largest sum of
        (score - min_score) wins, the longer match on ties. `min_score` is the
        acceptance probability below which a row costs more than it is expected to
        return. A shorter match with the same occurrences as the longer one drafted before it is
        skipped: its draft is that one's cut to fewer nodes, so it cannot win."""
        best, gain, longer = NO_DRAFT, 0.0, None
        for match, found in reversed(self.matches(context, max_match)):
            limit = min(max_nodes, math.floor(factor * match + 1e-9))
            if limit * (1 - min_score) <= gain or found == longer:
                continue                 # a full draft of sure nodes cannot win, or a cut of the last one
            longer = found
            d = self._continuations(found, match, limit, min_score)
            g = sum(d.scores) - min_score * len(d)
            if g > gain:
                best, gain = d, g
        return best

    def _continuations(self, found: list[tuple[int, int]], match: int, limit: int, min_score: float) -> Draft:
        """The count trie of what followed each occurrence, at most `limit` nodes kept (best counts
        first; ties: shallower, then the earlier occurrence), in the order the occurrences reach
        them. Built a level at a time, each node only where at least `min_score` of the
        occurrences reach it: a node's count never exceeds its parent's, so no node below that has
        a kept descendant, and occurrences that part from every kept path are dropped at once."""
        seqs, total = self.seqs, len(found)
        nodes: list[tuple[int, int, int, int, int]] = []   # (first occurrence, depth, token, parent, count)
        level: list[tuple[int, list[tuple[int, int, int]]]] = [(-1, [(k, s, e) for k, (s, e) in enumerate(found)])]
        for depth in range(1, limit + 1):          # level[i]: a node and the occurrences through it
            deeper = []
            for parent, through in level:
                groups: dict[int, list[tuple[int, int, int]]] = {}
                for k, s, e in through:
                    seq = seqs[s]
                    if e + depth <= len(seq):
                        groups.setdefault(seq[e + depth - 1], []).append((k, s, e))
                for token, group in groups.items():
                    if len(group) / total >= min_score:
                        nodes.append((group[0][0], depth, token, parent, len(group)))
                        deeper.append((len(nodes) - 1, group))
            level = deeper
        best = sorted(range(len(nodes)), key=lambda i: (-nodes[i][4], nodes[i][1], nodes[i][0]))[:limit]
        keep = sorted(best, key=lambda i: nodes[i][:2])           # parents first
        new = {old: k for k, old in enumerate(keep)}
        return Draft([nodes[i][2] for i in keep], [new.get(nodes[i][3], -1) for i in keep],
                     [nodes[i][4] / total for i in keep], match)


def _add_span(out: list[tuple[int, ...]], cand: tuple[int, ...], limit: int) -> None:
    """Add `cand` to `out` (kept free of duplicates and prefixes), in place."""
    if any(kept[:len(cand)] == cand for kept in out):
        return                # equal to or a prefix of a kept candidate
    covered = [i for i, kept in enumerate(out) if cand[:len(kept)] == kept]
    if covered:               # longer than kept candidates: it takes the first one's slot
        out[covered[0]] = cand
        for i in reversed(covered[1:]):
            del out[i]
    elif len(out) < limit:
        out.append(cand)
