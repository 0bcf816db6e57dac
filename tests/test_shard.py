"""Shard plan: coverage, order, exact balance against brute force, edge cases; snapping
the candidate cuts to first-token groups (sampling)."""
import itertools
import random

import pytest

from lp.parallel.shard import Shard, block_rows, shard_plan, snap_to_groups


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
    cands = [c for sh in plan for c in sh.candidates]
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
                           + sum(lengths[sh.candidates.start:sh.candidates.stop]))
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
    assert sh.columns == range(15) and sh.candidates == range(15)
    assert sh.rows == (15 + 15) * 4        # Q = (W + C)(N - 1)


def test_deterministic():
    assert shard_plan(3, 10, 4, (4,) * 7, 2) == shard_plan.__wrapped__(3, 10, 4, (4,) * 7, 2)


# ---------------------------------------------------------------- snap_to_groups (sampling under LP)

def candidate_plan(cuts, lengths, ordinary=1):
    """A window-free plan whose rank k holds candidates [cuts[k], cuts[k+1])."""
    return tuple(Shard(range(0), range(a, b), ordinary + sum(lengths[a:b])) for a, b in zip(cuts, cuts[1:]))


def bounds(plan):
    return [plan[0].candidates.start] + [sh.candidates.stop for sh in plan]


@pytest.mark.parametrize("raw,starts,snapped", [
    # several boundaries, worked by hand: 2 is a group start; 4 is as near 3 as 5 (ties: the
    # earlier); 7 is nearer 8 than 5
    ([0, 2, 4, 7, 9], [0, 2, 3, 5, 8, 9], [0, 2, 3, 8, 9]),
    # a group (0..4) larger than a rank's share: it lands whole on one rank, the next rank gets none
    ([0, 2, 4, 6], [0, 5, 6], [0, 0, 5, 6]),
    # a single group: every candidate on one rank (the cut nearest each raw cut, never going back)
    ([0, 2, 4, 6], [0, 6], [0, 0, 6, 6]),
    ([0, 5, 6], [0, 6], [0, 6, 6]),
    # cuts already on group starts stay
    ([0, 1, 3, 4], [0, 1, 3, 4], [0, 1, 3, 4]),
    # no candidates at all
    ([0, 0, 0], [0], [0, 0, 0]),
])
def test_snap_worked_examples(raw, starts, snapped):
    lengths = tuple(range(1, raw[-1] + 1))        # distinct lengths: rows show which candidates moved
    out = snap_to_groups(candidate_plan(raw, lengths, ordinary=3), starts, lengths)
    assert bounds(out) == snapped
    assert [sh.rows for sh in out] == [3 + sum(lengths[a:b]) for a, b in zip(snapped, snapped[1:])]


def groups_of(first_tokens):
    """Group starts (plus the end) of candidates whose first tokens are `first_tokens`."""
    return [i for i in range(len(first_tokens)) if i == 0 or first_tokens[i] != first_tokens[i - 1]] \
        + [len(first_tokens)]


@pytest.mark.parametrize("seed", range(40))
def test_snap_keeps_groups_whole_on_random_plans(seed):
    """On balanced plans (window and candidates) of 2-6 ranks: each rank keeps its columns,
    every cut is a group start, no group is split, each cut is the group start nearest the
    plan's cut among those not before the previous cut (ties: the earlier), and every
    rank's rows are recomputed for the candidates it now holds."""
    rng = random.Random(seed)
    world, columns, depth, ordinary = rng.randint(2, 6), rng.randint(0, 8), rng.randint(1, 4), rng.randint(1, 5)
    lengths = tuple(rng.randint(1, 10) for _ in range(rng.randint(0, 14)))
    first = sorted(rng.choices(range(rng.randint(1, 5)), k=len(lengths)))   # grouped first tokens
    starts = groups_of(first)
    plan = shard_plan(world, columns, depth, lengths, ordinary)
    out = snap_to_groups(plan, starts, lengths)
    check_plan(out, world, columns, len(lengths))
    assert [sh.columns for sh in out] == [sh.columns for sh in plan]
    cuts = bounds(out)
    assert set(cuts) <= set(starts)
    for c in range(1, len(lengths)):
        if first[c] == first[c - 1]:      # same group: same rank
            assert next(k for k, sh in enumerate(out) if c in sh.candidates) == \
                next(k for k, sh in enumerate(out) if c - 1 in sh.candidates)
    for k in range(world - 1):
        want, allowed = plan[k].candidates.stop, [b for b in starts if b >= cuts[k]]
        assert (abs(cuts[k + 1] - want), cuts[k + 1]) == min((abs(b - want), b) for b in allowed)
    for sh in out:
        assert sh.rows == (ordinary + block_rows(sh.columns.start, sh.columns.stop, depth)
                           + sum(lengths[sh.candidates.start:sh.candidates.stop]))
