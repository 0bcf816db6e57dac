"""LP shard plan: which window columns and which candidates each rank computes.

Rank k gets a contiguous block of columns [start, stop) and a contiguous slice
of the candidates; blocks and slices follow rank order, so concatenating the
ranks' outputs gives column order and candidate order. Costs are real row
counts: every rank feeds all ordinary rows; a block ending at column e also
feeds base cells b_1..b_{e-1} (its rows attend to them) plus its own deeper
cells; candidate c costs its length in rows. The plan minimises the largest rank's
rows exactly (binary search on the bound, dynamic programme per bound).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache
from itertools import accumulate
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
def shard_plan(world: int, columns: int, depth: int, lengths: tuple[int, ...],
               ordinary: int = 1) -> tuple[Shard, ...]:
    """Balanced plan for `world` ranks over `columns` window columns (depth = filled
    levels) and candidates of `lengths[c]` rows each."""
    if world < 1:
        raise ValueError("world size must be >= 1")
    if world == 1:   # one rank takes everything
        return (Shard(range(columns), range(len(lengths)),
                      ordinary + block_rows(0, columns, depth) + sum(lengths)),)
    prefix = list(accumulate(lengths, initial=0))
    lo = ordinary
    hi = ordinary + block_rows(0, columns, depth) + prefix[-1]
    while lo < hi:   # smallest bound for which a plan exists
        mid = (lo + hi) // 2
        if _split(world, columns, depth, prefix, ordinary, mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return _split(world, columns, depth, prefix, ordinary, lo)


def _split(world, columns, depth, prefix, ordinary, bound):
    """A plan whose ranks all stay within `bound` rows, or None.

    best[r][e]: the most leading candidates ranks 0..r-1 can take while covering
    columns [0, e); taking more leading candidates never hurts later ranks, so
    each rank takes all the candidates that fit beside its block."""
    candidates = len(prefix) - 1
    best = [[-1] * (columns + 1) for _ in range(world + 1)]
    cut = [[0] * (columns + 1) for _ in range(world + 1)]
    best[0][0] = 0
    for r in range(1, world + 1):
        for e in range(columns + 1):
            for s in range(e + 1):
                done = best[r - 1][s]
                rows = ordinary + block_rows(s, e, depth)
                if done < 0 or rows > bound:
                    continue
                taken = bisect_right(prefix, prefix[done] + bound - rows) - 1
                if taken > best[r][e]:
                    best[r][e], cut[r][e] = taken, s
    if best[world][columns] < candidates:
        return None
    stops = [columns]
    for r in range(world, 0, -1):
        stops.append(cut[r][stops[-1]])
    bounds = stops[::-1]   # bounds[k]..bounds[k+1] is rank k's block
    base = [ordinary + block_rows(bounds[k], bounds[k + 1], depth) for k in range(world)]
    # candidate slices in rank order; the last ranks fill up to the bound, rank 0
    # (which also runs the pool) takes what is left
    stops = [candidates]
    for k in range(world - 1, 0, -1):
        stops.append(min(stops[-1], max(0, bisect_left(prefix, prefix[stops[-1]] - (bound - base[k])))))
    cuts = [0] + stops[::-1]
    shards = tuple(Shard(range(bounds[k], bounds[k + 1]), range(cuts[k], cuts[k + 1]),
                         base[k] + prefix[cuts[k + 1]] - prefix[cuts[k]]) for k in range(world))
    return shards


def snap_to_groups(plan: tuple[Shard, ...], starts: list[int], lengths: tuple[int, ...]) -> tuple[Shard, ...]:
    """Move each rank's candidate cut to the nearest group start (ties: the earlier),
    so that candidates of one group stay on one rank. `plan` must have been made for
    these `lengths` in this order (each rank's rows are recounted from them)."""
    cuts, first = [], 0
    for sh in plan[:-1]:
        want = sh.candidates.stop
        cut = min((abs(b - want), b) for b in starts if b >= first)[1]
        cuts.append(cut)
        first = cut
    bounds = [0] + cuts + [starts[-1] if starts else 0]
    rows = lambda r: sum(lengths[r.start:r.stop])  # noqa: E731
    return tuple(
        Shard(sh.columns, range(bounds[k], bounds[k + 1]),
              sh.rows - rows(sh.candidates) + rows(range(bounds[k], bounds[k + 1])))
        for k, sh in enumerate(plan))
