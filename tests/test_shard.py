"""Shard plan: coverage, order, exact balance against brute force, edge cases."""
import itertools

import pytest

from lp.parallel.shard import block_rows, shard_plan


def brute_force_best(world, columns, depth, lengths, ordinary):
    """Smallest max rows over every column split and every contiguous candidate split."""
    best = None
    c = len(lengths)
    for cuts in itertools.combinations_with_replacement(range(columns + 1), world - 1):
        bounds = (0,) + cuts + (columns,)
        for ccuts in itertools.combinations_with_replacement(range(c + 1), world - 1):
            cb = (0,) + ccuts + (c,)
            worst = max(ordinary + block_rows(bounds[k], bounds[k + 1], depth) + sum(lengths[cb[k]:cb[k + 1]])
                        for k in range(world))
            best = worst if best is None else min(best, worst)
    return best


def check_plan(plan, world, columns, candidates):
    assert len(plan) == world
    cols = [c for sh in plan for c in sh.columns]
    cands = [c for sh in plan for c in sh.subtrees]
    assert cols == list(range(columns))          # every column once, in rank order
    assert cands == list(range(candidates))      # every candidate once, in rank order


CASES = [
    (1, 5, 4, (4,) * 5, 1), (2, 5, 4, (4,) * 5, 1), (3, 15, 4, (4,) * 15, 1), (4, 15, 4, (4,) * 15, 3),
    (4, 2, 4, (4,) * 7, 1),      # W < P
    (8, 3, 2, (), 1),            # P > W, no candidates
    (4, 7, 1, (3, 3), 12),       # first warmup round (depth 1), prefill rows, C < P
    (3, 6, 3, (6,), 2),
    (5, 9, 6, (6,) * 11, 1),
    (2, 5, 4, (10, 4, 4, 1, 10, 3), 1),   # lookup candidates: lengths differ
    (3, 4, 4, (10, 10, 4, 4, 4, 2), 2),
    (2, 0, 0, (10, 3, 10), 1),            # no window at all
]


@pytest.mark.parametrize("world,columns,depth,lengths,ordinary", CASES)
def test_plan_covers_and_is_optimal(world, columns, depth, lengths, ordinary):
    plan = shard_plan(world, columns, depth, lengths, ordinary)
    check_plan(plan, world, columns, len(lengths))
    for sh in plan:
        assert sh.rows == (ordinary + block_rows(sh.columns.start, sh.columns.stop, depth)
                           + sum(lengths[sh.subtrees.start:sh.subtrees.stop]))
    assert max(sh.rows for sh in plan) == brute_force_best(world, columns, depth, lengths, ordinary)


def test_balance_beats_equal_column_counts():
    """Later blocks cost more (they feed the earlier base cells): equal column counts are not balanced."""
    plan = shard_plan(4, 16, 4, (), 1)
    sizes = [len(sh.columns) for sh in plan]
    assert sizes[0] > sizes[-1]
    naive = max(1 + block_rows(4 * k, 4 * k + 4, 4) for k in range(4))
    assert max(sh.rows for sh in plan) < naive


def test_single_rank_takes_everything():
    (sh,) = shard_plan(1, 15, 4, (4,) * 15, 1)
    assert sh.columns == range(15) and sh.subtrees == range(15)
    assert sh.rows == (15 + 15) * 4        # Q = (W + C)(N - 1)


def test_deterministic():
    assert shard_plan(3, 10, 4, (4,) * 7, 2) == shard_plan.__wrapped__(3, 10, 4, (4,) * 7, 2)
