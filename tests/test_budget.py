"""The row budget (lp/decode/budget.py): the Q it picks maximises expected tokens per second over every
Q, never does worse than the round without drafts, keeps whole trees where rows are free and cuts them
where rows cost their weight."""
import random

from lp.decode.budget import rows_per_request


def rate(bases, scores, cost, q):
    tokens = sum(1 + sum(s[:max(0, q - b)]) for b, s in zip(bases, scores))
    return tokens / cost(len(bases), q)


def test_free_rows_keep_every_tree_and_costly_rows_keep_none():
    bases, scores = [1, 1, 3], [[0.9, 0.5, 0.2], [0.3], []]
    q, keep = rows_per_request(bases, scores, lambda n, q: 1.0)
    assert keep == [3, 1, 0] and q == 4
    q, keep = rows_per_request(bases, scores, lambda n, q: float(n * q))     # every row costs as much as a token
    assert q == 3 and keep == [2, 1, 0]       # the widest base pads everyone to 3 rows: those nodes are free
    q, keep = rows_per_request([1, 1], [[0.9, 0.5], [0.4]], lambda n, q: 0.1 * n * q)
    assert keep == [0, 0] and q == 1


def test_a_lone_request_on_a_flat_curve_keeps_its_tree():
    scores = [0.9 ** k for k in range(1, 40)]
    q, keep = rows_per_request([1], [scores], lambda n, q: 1.0 + 0.001 * n * q)
    assert keep == [len(scores)]


def test_the_chosen_rows_are_the_best_by_the_estimate():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 6)
        bases = [rng.randint(1, 4) for _ in range(n)]
        scores = [sorted((rng.random() for _ in range(rng.randint(0, 12))), reverse=True) for _ in range(n)]
        a, b, knee = rng.uniform(0.5, 2), rng.uniform(0, 0.2), rng.randint(1, 64)
        cost = lambda n, q: a + b * max(0, n * q - knee)  # noqa: E731  (flat, then linear: a GPU-like curve)
        q, keep = rows_per_request(bases, scores, cost)
        qs = range(max(bases), max(b + len(s) for b, s in zip(bases, scores)) + 1)
        best = max(rate(bases, scores, cost, x) for x in qs)
        assert abs(rate(bases, scores, cost, q) - best) <= 1e-9 * best
        assert rate(bases, scores, cost, q) >= rate(bases, scores, cost, max(bases))    # never below no drafts
        assert keep == [min(len(s), q - b) for b, s in zip(bases, scores)]


def test_acceptance_starts_from_the_score_and_learns_the_job():
    from lp.decode.budget import PRIOR_SCALE, Acceptance
    table = Acceptance()
    assert table.chance(1.0, 1) == PRIOR_SCALE and table.chance(0.4, 3) == 0.4 * PRIOR_SCALE
    for _ in range(50):     # a chain of three score-1.0 nodes of which only the first is ever accepted
        table.observe([1.0, 1.0, 1.0], [1, 2, 3], {0})
    assert table.chance(1.0, 1) > 0.9 and table.chance(1.0, 2) < 0.05 and table.chance(1.0, 3) < 0.05
    assert table.chance(0.4, 3) == 0.4 * PRIOR_SCALE      # other cells keep their prior
