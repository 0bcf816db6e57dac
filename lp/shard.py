"""LP shard plan: which window columns and which candidates each rank computes.

Rank k gets a contiguous block of columns [start, stop) and a contiguous slice
of the candidates; blocks and slices follow rank order, so concatenating the
ranks' outputs gives column order and candidate order. Costs are real row
counts: every rank feeds all ordinary rows; a block ending at column e also
feeds base cells b_1..b_{e-1} (its rows attend to them) plus its own deeper
cells; each candidate costs S rows. The plan minimises the largest rank's
rows exactly (binary search on the bound, dynamic programme per bound).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple


class Shard(NamedTuple):
    columns: range      # window columns [start, stop)
    candidates: range   # global candidate indices
    rows: int           # rows this rank feeds


def block_rows(start: int, stop: int, depth: int) -> int:
    """Window rows for columns [start, stop): base cells b_1..b_{stop-1} plus the
    deeper levels' cells in the block (level 0 column 0 is the ordinary row)."""
    if stop <= start:
        return 0
    return (stop - 1) + (depth - 1) * (stop - start)


@lru_cache(maxsize=4096)
def shard_plan(world: int, columns: int, depth: int, candidates: int,
               suffix_len: int, ordinary: int = 1) -> tuple[Shard, ...]:
    """Balanced plan for `world` ranks over `columns` window columns (depth = filled
    levels) and `candidates` suffixes of `suffix_len` rows each."""
    if world < 1:
        raise ValueError("world size must be >= 1")
    lo = ordinary
    hi = ordinary + block_rows(0, columns, depth) + candidates * suffix_len
    while lo < hi:   # smallest bound for which a plan exists
        mid = (lo + hi) // 2
        if _split(world, columns, depth, candidates, suffix_len, ordinary, mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return _split(world, columns, depth, candidates, suffix_len, ordinary, lo)


def _split(world, columns, depth, candidates, suffix_len, ordinary, bound):
    """A plan whose ranks all stay within `bound` rows, or None."""
    def room(rows):  # candidates that still fit beside `rows` rows
        return (bound - rows) // suffix_len if suffix_len else candidates

    # best[r][e]: most candidate room for ranks 0..r-1 covering columns [0, e)
    neg = -1
    best = [[neg] * (columns + 1) for _ in range(world + 1)]
    cut = [[0] * (columns + 1) for _ in range(world + 1)]
    best[0][0] = 0
    for r in range(1, world + 1):
        for e in range(columns + 1):
            for s in range(e + 1):
                if best[r - 1][s] < 0:
                    continue
                rows = ordinary + block_rows(s, e, depth)
                if rows > bound:
                    continue
                value = best[r - 1][s] + room(rows)
                if value > best[r][e]:
                    best[r][e], cut[r][e] = value, s
    if best[world][columns] < candidates:
        return None
    stops = [columns]
    for r in range(world, 0, -1):
        stops.append(cut[r][stops[-1]])
    bounds = stops[::-1]   # bounds[k]..bounds[k+1] is rank k's block
    base = [ordinary + block_rows(bounds[k], bounds[k + 1], depth) for k in range(world)]
    counts = [0] * world
    for _ in range(candidates):   # each candidate to the least loaded rank that has room
        k = min((k for k in range(world) if base[k] + (counts[k] + 1) * suffix_len <= bound),
                key=lambda k: (base[k] + counts[k] * suffix_len, k))
        counts[k] += 1
    shards, first = [], 0
    for k in range(world):
        shards.append(Shard(range(bounds[k], bounds[k + 1]), range(first, first + counts[k]),
                            base[k] + counts[k] * suffix_len))
        first += counts[k]
    return tuple(shards)


def snap_to_groups(plan: tuple[Shard, ...], starts: list[int], suffix_len: int) -> tuple[Shard, ...]:
    """Move each rank's candidate cut to the nearest group start (ties: the earlier),
    so that candidates of one group stay on one rank."""
    cuts, first = [], 0
    for sh in plan[:-1]:
        want = sh.candidates.stop
        cut = min((abs(b - want), b) for b in starts if b >= first)[1]
        cuts.append(cut)
        first = cut
    bounds = [0] + cuts + [starts[-1] if starts else 0]
    return tuple(
        Shard(sh.columns, range(bounds[k], bounds[k + 1]),
              sh.rows + (bounds[k + 1] - bounds[k] - len(sh.candidates)) * suffix_len)
        for k, sh in enumerate(plan))
