"""The row budget of a batched round: how many tree nodes each request may feed.

Every request of a round feeds its base rows (the ordinary rows, its Jacobi window) and some of its
tree. In a batched round all requests are padded to the same Q rows, so the forward costs
`cost(n, Q)` (`cost`: seconds of one forward of n requests of Q rows each, read off the device's
measured forward-time grid, lp.measure.cost_model.batch_forward_time). A request that feeds k nodes
of its tree expects 1 + (the sum of its k best nodes' chances of acceptance) tokens: the expected
accepted depth of a tree is the sum of its nodes' chances. A proposer's score is not that chance (a
suffix draft from one earlier occurrence scores 1.0 at every depth; on the embedded job the nodes
offered were accepted about six times less often than their scores said), so `Acceptance` learns it
as the job goes: the share of the nodes offered in each (score decile, depth) cell that were
accepted, from a prior of score / 4 worth a few observations. It is a function of the trees and the
tokens only, never of timings. `rows_per_request` picks the Q that maximises the expected tokens per
second of the round over every Q from the largest base to the largest full round, the smallest Q among
equals, so adding rows is only done when the drafts' expected gain pays for them. A joining request's
prefill runs alone while the batch waits, and its own rate (a prompt's rows for a token or two) would
make any node look cheap: the leader gives it a floor, a full batch's plain decoding rate, that each
node must earn instead (on the embedded job at B = 4 the prefill trees of 15 to 24 nodes had added
0.65 tokens per prompt on average for 20 to 35 ms of rows each). A round that keeps
nodes is also charged the host seconds of drafting (`drafting` per request: measured once at start-up
with the grid, lp.measure.cost_model.draft_time), which a round without drafts never spends; the round
without any node is always a candidate, so by the estimate a round is never slower than the same round
without drafts, host work included. The leader (lp.engine.Rounds) stops drafting for a while after a
round that weighed nodes and kept none (`DraftBackoff`), so rounds whose trees do not pay stop paying
for the drafting too. A lone request on a device where rows are free keeps its whole tree.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import accumulate
from typing import Callable, Sequence

PRIOR_SCALE = 0.25      # a node's chance before any observation: its score times this
PRIOR_WEIGHT = 4.0      # ...worth this many observations
DEPTHS = 16             # cells by depth 1..16 (deeper nodes share the last)
QUIET_MOST = 8          # most rounds the leader goes without drafting after rounds that kept no node


class Acceptance:
    """The observed chance that a tree node is accepted, by (score decile, depth)."""

    def __init__(self):
        self.offered: dict[tuple[int, int], int] = defaultdict(int)
        self.accepted: dict[tuple[int, int], int] = defaultdict(int)

    @staticmethod
    def cell(score: float, depth: int) -> tuple[int, int]:
        return min(int(score * 10), 10), min(depth, DEPTHS)

    def chance(self, score: float, depth: int) -> float:
        k = self.cell(score, depth)
        return (self.accepted[k] + PRIOR_WEIGHT * PRIOR_SCALE * score) / (self.offered[k] + PRIOR_WEIGHT)

    def observe(self, scores: Sequence[float], depths: Sequence[int], accepted: set[int]) -> None:
        """A round's tree (each node's score and depth, in tree order) and the nodes it accepted."""
        for u, (score, depth) in enumerate(zip(scores, depths)):
            k = self.cell(score, depth)
            self.offered[k] += 1
            self.accepted[k] += u in accepted


def ranked_chances(builder, acceptance: Acceptance, budget: int | None = None) -> list[float]:
    """A request's candidate nodes' chances of acceptance (`builder`: its lp.decode.tree.TreeBuilder),
    in the order its tree keeps them, best first: what the budget weighs."""
    return [acceptance.chance(score, depth) for score, depth in builder.ranking(budget)]


class DraftBackoff:
    """When the leader drafts: after a round whose budget weighed nodes and kept none, the next round
    drafts nothing; after another such round the next 2, then 4, up to QUIET_MOST; a round that
    keeps a node resets it (a round without candidates changes nothing). Drafting is paid before
    the budget decides, so this bounds what rounds whose trees do not pay spend on it. A function of
    the budget's decisions only (of the tokens and the recorded costs)."""

    def __init__(self):
        self.quiet = 0          # rounds to skip after the next round that keeps nothing
        self.waiting = 0        # rounds left to skip

    def drafts(self) -> bool:
        """Whether this round drafts (a skipped round counts down)."""
        if self.waiting:
            self.waiting -= 1
            return False
        return True

    def kept(self, any_node: bool) -> None:
        """A drafted round's outcome."""
        self.quiet = 0 if any_node else min(2 * self.quiet or 1, QUIET_MOST)
        self.waiting = self.quiet


def rows_per_request(bases: Sequence[int], scores: Sequence[Sequence[float]], cost: Callable[[int, int], float],
                     drafting: float = 0.0, floor: float = 0.0) -> tuple[int, list[int]]:
    """(Q, nodes each request keeps) for requests with `bases` base rows and tree nodes whose chances
    of acceptance are `scores` (each request's in the order its tree keeps them, best first). A
    round that keeps any node is charged `drafting` host seconds per request besides its forward
    (drafting and its trees: what a round without them does not do); the round without a node is
    always a candidate, Q = the largest base. The pick maximises the round's expected tokens per
    second; where even that best rate is below `floor` (tokens per second: what the round's seconds
    earn elsewhere, as a joining request's prefill holds up the batch's decoding), a node must earn
    `floor` instead: the pick maximises expected tokens minus `floor` times the seconds."""
    n = len(bases)
    gains = [list(accumulate(s, initial=0.0)) for s in scores]    # gains[b][k]: its k best nodes
    low = max(bases)
    high = max(b + len(s) for b, s in zip(bases, scores))
    options = [(low, [0] * n, float(n), cost(n, low))]            # (Q, keep, expected tokens, seconds)
    for q in range(low, high + 1):
        keep = [min(len(s), q - b) for b, s in zip(bases, scores)]
        if any(keep):
            options.append((q, keep, sum(1.0 + g[k] for g, k in zip(gains, keep)), cost(n, q) + n * drafting))
    rate = lambda option: option[2] / max(option[3], 1e-12)      # noqa: E731
    best, best_rate = options[0], rate(options[0])
    for option in options[1:]:              # the smallest Q among equals
        if rate(option) > best_rate * (1 + 1e-12):
            best, best_rate = option, rate(option)
    if best_rate < floor:
        profit = lambda option: option[2] - floor * option[3]    # noqa: E731
        best = options[0]
        for option in options[1:]:
            if profit(option) > profit(best) + 1e-12 * abs(profit(best)):
                best = option
    return best[0], best[1]
