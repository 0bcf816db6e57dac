"""The row budget of a batched round: how many tree nodes each request may feed.

Every request of a round feeds its base rows (the ordinary rows, its Jacobi window) and some of its
tree. In a batched round all requests are padded to the same Q rows, so the forward costs
`cost(n, Q)` (`cost`: seconds of one forward of n requests of Q rows each, read off the device's
measured forward-time grid, lp.measure.cost_model.batch_forward_time). A request that feeds k nodes of its tree
expects 1 + (the sum of its k best node scores) tokens: a node's score is its proposer's estimate of
the chance that the node is accepted, and the expected accepted depth of a tree is the sum of its
nodes' chances. `rows_per_request` picks the Q that maximises the expected tokens per second of the
round over every Q from the largest base to the largest full round, the smallest Q among equals, so
adding rows is only done when the drafts' expected gain pays for them; Q = the largest base (no tree
anywhere but what fits beside the widest base) is always a candidate, so by the estimate a round
is never slower than the same round without drafts. A lone request on a device where rows are free
keeps its whole tree.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Callable, Sequence


def rows_per_request(bases: Sequence[int], scores: Sequence[Sequence[float]],
                     cost: Callable[[int, int], float]) -> tuple[int, list[int]]:
    """(Q, nodes each request keeps) for requests with `bases` base rows and tree nodes scored
    `scores` (each request's scores best first, as its tree keeps them)."""
    n = len(bases)
    gains = [list(accumulate(s, initial=0.0)) for s in scores]    # gains[b][k]: its k best nodes
    low = max(bases)
    high = max(b + len(s) for b, s in zip(bases, scores))
    best, best_rate = low, -1.0
    for q in range(low, high + 1):
        tokens = sum(1.0 + g[min(len(g) - 1, q - b)] for b, g in zip(bases, gains))
        rate = tokens / max(cost(n, q), 1e-12)
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = q, rate
    return best, [min(len(s), best - b) for b, s in zip(bases, scores)]
