"""The n-gram pool's LRU policy and sequence seeding."""
import pytest

from lp.decode.pool import NGramPool, sequence_ngrams


def test_lru_order_and_eviction():
    pool = NGramPool(suffix_len=2, capacity=3)
    for s in [(1, 1), (2, 2), (3, 3)]:
        pool.add(7, s)
    assert pool.candidates(7) == [(3, 3), (2, 2), (1, 1)]      # most recent first
    pool.add(7, (1, 1))                                        # re-insert moves to most recent
    assert pool.candidates(7) == [(1, 1), (3, 3), (2, 2)]
    pool.add(7, (4, 4))                                        # full bucket evicts its oldest
    assert pool.candidates(7) == [(4, 4), (1, 1), (3, 3)]
    assert pool.candidates(7, limit=2) == [(4, 4), (1, 1)]
    assert pool.candidates(8) == []
    assert len(pool) == 3


def test_buckets_are_per_key():
    pool = NGramPool(2, 1)
    pool.add(1, (5, 5))
    pool.add(2, (6, 6))
    pool.add(1, (7, 7))
    assert pool.candidates(1) == [(7, 7)]
    assert pool.candidates(2) == [(6, 6)]


def test_zero_capacity_holds_nothing():
    pool = NGramPool(2, 0)
    pool.add(1, (2, 3))
    assert pool.candidates(1) == [] and len(pool) == 0


def test_suffix_length_checked():
    with pytest.raises(ValueError):
        NGramPool(3, 2).add(1, (1, 2))


def test_sequence_ngrams():
    seq = [1, 2, 3, 4, 5]
    assert sequence_ngrams(seq, 3) == [(1, (2, 3)), (2, (3, 4)), (3, (4, 5))]
    assert sequence_ngrams(seq, 3, start=2) == [(3, (4, 5))]
    assert sequence_ngrams(seq, 6) == []
    # incremental seeding after a commit adds exactly the n-grams that became complete
    grown = seq + [6, 7]
    assert sequence_ngrams(grown, 3, start=3) == [(4, (5, 6)), (5, (6, 7))]
