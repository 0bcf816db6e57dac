"""The n-gram pool: key token -> LRU list of at most G suffixes (DESIGN.md section 4)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence


class NGramPool:
    """Per-key LRU of suffixes of a fixed length.

    `candidates(key)` returns the bucket most recent first; inserting an
    existing suffix moves it to most recent; a full bucket evicts its oldest.
    """

    def __init__(self, suffix_len: int, capacity: int):
        self.suffix_len = suffix_len
        self.capacity = capacity
        self._buckets: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def add(self, key: int, suffix: Sequence[int]) -> None:
        if self.capacity == 0:
            return
        suffix = tuple(suffix)
        if len(suffix) != self.suffix_len:
            raise ValueError(f"suffix length {len(suffix)} != {self.suffix_len}")
        bucket = self._buckets.setdefault(key, OrderedDict())
        if suffix in bucket:
            bucket.move_to_end(suffix)
            return
        bucket[suffix] = None
        if len(bucket) > self.capacity:
            bucket.popitem(last=False)

    def update(self, ngrams: Iterable[tuple[int, Sequence[int]]]) -> None:
        for key, suffix in ngrams:
            self.add(key, suffix)

    def candidates(self, key: int, limit: int | None = None) -> list[tuple[int, ...]]:
        bucket = self._buckets.get(key)
        if not bucket:
            return []
        out = list(reversed(bucket))
        return out if limit is None else out[:limit]


def sequence_ngrams(tokens: Sequence[int], n: int, start: int = 0) -> list[tuple[int, tuple[int, ...]]]:
    """(key, suffix) for every n-gram of `tokens` that ends at index >= start + n - 1,
    i.e. whose first token is at index >= start."""
    return [
        (tokens[i], tuple(tokens[i + 1:i + n]))
        for i in range(max(start, 0), len(tokens) - n + 1)
    ]
