"""Prompt/output lookup candidates: the index against a brute-force rescan, and merging."""
import random

import pytest

from lp.decode.lookup import LookupIndex, merge_candidates


def rescan(tokens, count, length, max_ngram):
    """The specification, by rescanning the whole sequence: longest m first, most
    recent occurrence first, continuations merged (no duplicates, no prefixes)."""
    n, out = len(tokens), []
    for m in range(min(max_ngram, n - 1), 0, -1):
        suffix = tokens[n - m:]
        for end in range(n - 1, m - 1, -1):
            if tokens[end - m:end] != suffix:
                continue
            cont = tuple(tokens[end:end + length])
            if any(c[:len(cont)] == cont for c in out):
                continue
            longer = [i for i, c in enumerate(out) if cont[:len(c)] == c]
            if longer:
                out[longer[0]] = cont
                out = [c for i, c in enumerate(out) if i not in longer[1:]]
            elif len(out) < count:
                out.append(cont)
            if len(out) == count:
                return out
    return out


def test_example_longest_match_most_recent_first():
    seq = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    index = LookupIndex(3, seq)
    # last 3 tokens (1, 2, 3) occurred at the start: followed by 4 9 2
    # then m = 2 (2, 3): most recent first -> 5 6 7, then 4 9 2 (already there)
    # then m = 1 (3): the same two continuations
    assert index.candidates(count=4, length=3) == [(4, 9, 2), (5, 6, 7)]
    assert index.candidates(count=1, length=3) == [(4, 9, 2)]
    assert LookupIndex(2, seq).candidates(count=4, length=2) == [(5, 6), (4, 9)]
    assert LookupIndex(1, seq).candidates(count=4, length=5) == [(5, 6, 7, 1, 2), (4, 9, 2, 3, 5)]


def test_continuation_stops_at_the_end_of_the_sequence():
    seq = [5, 6, 5, 6, 5]
    # the most recent earlier 5 is followed by 6 5 only (the sequence ends), the one
    # before by 6 5 6 5, which extends it and takes its slot
    assert LookupIndex(1, seq).candidates(count=3, length=4) == [(6, 5, 6, 5)]
    assert LookupIndex(2, seq).candidates(count=3, length=2) == [(6, 5)]


def test_no_earlier_occurrence_no_candidates():
    assert LookupIndex(3, [1, 2, 3, 4]).candidates(5, 4) == []
    assert LookupIndex(3, [7]).candidates(5, 4) == []
    assert LookupIndex(3, []).candidates(5, 4) == []
    assert LookupIndex(2, [1, 1]).candidates(0, 4) == []


@pytest.mark.parametrize("seed", range(30))
def test_incremental_index_equals_rescan(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    max_ngram, count, length = rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 9)
    index = LookupIndex(max_ngram, [rng.randrange(vocab) for _ in range(rng.randint(0, 5))], scan=10 ** 9)
    while len(index) < 80:   # grows in chunks, like committed rounds
        index.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 6)))
        assert index.candidates(count, length) == rescan(index.tokens, count, length, max_ngram)


def test_scan_limits_the_occurrences_looked_at():
    seq = [0, 1, 0, 2, 0, 3, 0, 4, 0]   # 0 occurred 4 times before the end
    assert LookupIndex(1, seq, scan=2).candidates(10, 1) == [(4,), (3,)]
    assert LookupIndex(1, seq).candidates(10, 1) == [(4,), (3,), (2,), (1,)]


def test_merge_drops_duplicates_and_prefixes_keeping_the_longer():
    assert merge_candidates([(1, 2, 3), (4, 5)], [(1, 2), (4, 5, 6, 7), (8,), (1, 2, 3)]) \
        == [(1, 2, 3), (4, 5, 6, 7), (8,)]
    # a long candidate covering two kept ones takes the first one's slot
    assert merge_candidates([(1,), (9,), (1, 2)], [(1, 2, 3)]) == [(1, 2, 3), (9,)]
    assert merge_candidates([(), (3,)]) == [(3,)]
    assert merge_candidates([(1,), (2,), (3,)], limit=2) == [(1,), (2,)]
    assert merge_candidates([(1,), (2,)], [(2, 5)], limit=2) == [(1,), (2, 5)]   # replacing is not adding


def test_bad_max_ngram():
    with pytest.raises(ValueError, match="max_ngram"):
        LookupIndex(0)
