"""Shard plan: coverage, order, exact balance against brute force, edge cases."""
import itertools

import pytest

from lp.shard import block_rows, shard_plan


def brute_force_best(world, columns, depth, candidates, s, ordinary):
    best = None
    for cuts in itertools.combinations_with_replacement(range(columns + 1), world - 1):
        bounds = (0,) + cuts + (columns,)
        base = [ordinary + block_rows(bounds[k], bounds[k + 1], depth) for k in range(world)]
        # candidates go one by one to the least loaded rank: optimal for equal-cost items
        loads = list(base)
        for _ in range(candidates):
            k = min(range(world), key=lambda k: loads[k])
            loads[k] += s
        worst = max(loads)
        best = worst if best is None else min(best, worst)
    return best


def check_plan(plan, world, columns, candidates):
    assert len(plan) == world
    cols = [c for sh in plan for c in sh.columns]
    cands = [c for sh in plan for c in sh.candidates]
    assert cols == list(range(columns))          # every column once, in rank order
    assert cands == list(range(candidates))      # every candidate once, in rank order


CASES = [
    (1, 5, 4, 5, 4, 1), (2, 5, 4, 5, 4, 1), (3, 15, 4, 15, 4, 1), (4, 15, 4, 15, 4, 3),
    (4, 2, 4, 7, 4, 1),      # W < P
    (8, 3, 2, 0, 2, 1),      # P > W, no candidates
    (4, 7, 1, 2, 3, 12),     # first warmup round (depth 1), prefill rows, C < P
    (3, 6, 3, 1, 6, 2),
    (5, 9, 6, 11, 6, 1),
]


@pytest.mark.parametrize("world,columns,depth,cands,s,ordinary", CASES)
def test_plan_covers_and_is_optimal(world, columns, depth, cands, s, ordinary):
    plan = shard_plan(world, columns, depth, cands, s, ordinary)
    check_plan(plan, world, columns, cands)
    for sh in plan:
        assert sh.rows == ordinary + block_rows(sh.columns.start, sh.columns.stop, depth) + len(sh.candidates) * s
    assert max(sh.rows for sh in plan) == brute_force_best(world, columns, depth, cands, s, ordinary)


def test_balance_beats_equal_column_counts():
    """Later blocks cost more (they feed the earlier base cells): equal column counts are not balanced."""
    plan = shard_plan(4, 16, 4, 0, 4, 1)
    sizes = [len(sh.columns) for sh in plan]
    assert sizes[0] > sizes[-1]
    naive = max(1 + block_rows(4 * k, 4 * k + 4, 4) for k in range(4))
    assert max(sh.rows for sh in plan) < naive


def test_single_rank_takes_everything():
    (sh,) = shard_plan(1, 15, 4, 15, 4, 1)
    assert sh.columns == range(15) and sh.candidates == range(15)
    assert sh.rows == (15 + 15) * 4        # Q = (W + C)(N - 1)


def test_deterministic():
    assert shard_plan(3, 10, 4, 7, 4, 2) == shard_plan.__wrapped__(3, 10, 4, 7, 4, 2)
