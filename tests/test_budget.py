"""The row budget (lp/decode/budget.py): the Q it picks maximises expected tokens per second over every
Q, drafting's host seconds charged to rounds that keep a node, never does worse than the round without
drafts, keeps whole trees where rows are free and cuts them where rows cost their weight; the leader
stops drafting for a while after rounds that keep nothing."""
import random

from lp.decode.budget import QUIET_MOST, DraftBackoff, rows_per_request


def rate(bases, scores, cost, q, drafting=0.0):
    keep = [min(len(s), max(0, q - b)) for b, s in zip(bases, scores)]
    tokens = sum(1 + sum(s[:k]) for k, s in zip(keep, scores))
    return tokens / (cost(len(bases), q) + (len(bases) * drafting if any(keep) else 0.0))


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
    for _ in range(600):
        n = rng.randint(1, 6)
        bases = [rng.randint(1, 4) for _ in range(n)]
        scores = [sorted((rng.random() for _ in range(rng.randint(0, 12))), reverse=True) for _ in range(n)]
        a, b, knee = rng.uniform(0.5, 2), rng.uniform(0, 0.2), rng.randint(1, 64)
        cost = lambda n, q: a + b * max(0, n * q - knee)  # noqa: E731  (flat, then linear: a GPU-like curve)
        drafting = rng.choice([0.0, 0.0, rng.uniform(0, 0.3)])
        q, keep = rows_per_request(bases, scores, cost, drafting)
        qs = range(max(bases), max(b + len(s) for b, s in zip(bases, scores)) + 1)
        best = max(rate(bases, scores, cost, x, drafting) for x in qs)
        chosen = rate(bases, scores, cost, q, drafting) if any(keep) else n / cost(n, max(bases))
        assert chosen >= best * (1 - 1e-9) and chosen >= n / cost(n, max(bases)) * (1 - 1e-9)  # never below none
        assert keep == ([min(len(s), q - b) for b, s in zip(bases, scores)] if any(keep) else [0] * n)


def test_drafting_is_charged_to_the_rounds_that_keep_a_node():
    """One node of chance 0.5 for a row that costs 0.4 pays (1.5 / 1.4 tokens per second against 1.0);
    with 0.1 s of drafting per request it no longer does, and the round keeps nothing."""
    cost = lambda n, q: 1.0 + 0.4 * (q - 1)  # noqa: E731
    assert rows_per_request([1], [[0.5]], cost) == (2, [1])
    assert rows_per_request([1], [[0.5]], cost, drafting=0.1) == (1, [0])
    assert rows_per_request([1], [[0.5]], cost, drafting=0.09) == (2, [1])
    # nodes beside a wider base cost no row, but their drafting is charged all the same
    assert rows_per_request([1, 2], [[0.05], []], lambda n, q: 1.0) == (2, [1, 0])
    assert rows_per_request([1, 2], [[0.05], []], lambda n, q: 1.0, drafting=0.1) == (2, [0, 0])


def test_the_leader_drafts_less_and_less_while_rounds_keep_nothing():
    backoff, drafted = DraftBackoff(), []
    outcomes = iter([False] * 5 + [True] + [False])
    for _ in range(40):
        drafted.append(backoff.drafts())
        if drafted[-1]:
            backoff.kept(next(outcomes, True))
    skipped = [len(run) for run in "".join("d" if d else "." for d in drafted).split("d") if run]
    assert skipped == [1, 2, 4, QUIET_MOST, QUIET_MOST, 1]     # doubling to QUIET_MOST; a kept node resets it


def test_acceptance_starts_from_the_score_and_learns_the_job():
    from lp.decode.budget import PRIOR_SCALE, Acceptance
    table = Acceptance()
    assert table.chance(1.0, 1) == PRIOR_SCALE and table.chance(0.4, 3) == 0.4 * PRIOR_SCALE
    for _ in range(50):     # a chain of three score-1.0 nodes of which only the first is ever accepted
        table.observe([1.0, 1.0, 1.0], [1, 2, 3], {0})
    assert table.chance(1.0, 1) > 0.9 and table.chance(1.0, 2) < 0.05 and table.chance(1.0, 3) < 0.05
    assert table.chance(0.4, 3) == 0.4 * PRIOR_SCALE      # other cells keep their prior


def test_a_floor_rate_makes_a_prefills_nodes_earn_what_decoding_would():
    """A prefill-like round (100 base rows, 10 ms a row) earns 1 token in a second: by its own rate every
    node of chance above 0.1 pays. Against a floor of 20 tokens per second a node must earn 20 x its
    0.01 s row, so only the nodes of chance above 0.2 stay; the pick is the best expected tokens less
    floor x seconds over every Q (a brute force agrees), and a floor below the round's best rate
    changes nothing."""
    cost = lambda n, q: 0.01 * n * q  # noqa: E731
    scores = [0.9, 0.6, 0.3, 0.25, 0.15, 0.12, 0.11]
    assert rows_per_request([100], [scores], cost) == (107, [7])
    assert rows_per_request([100], [scores], cost, floor=20.0) == (104, [4])
    assert rows_per_request([100], [scores], cost, floor=0.5) == (107, [7])
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 4)
        bases = [rng.randint(1, 120) for _ in range(n)]
        scores = [sorted((rng.random() for _ in range(rng.randint(0, 10))), reverse=True) for _ in range(n)]
        a, b = rng.uniform(0.01, 0.05), rng.uniform(0.0005, 0.003)
        cost = lambda n, q: a + b * n * q  # noqa: E731
        drafting, floor = rng.choice([0.0, 0.001]), rng.uniform(0, 200)
        q, keep = rows_per_request(bases, scores, cost, drafting, floor)
        qs = range(max(bases), max(b + len(s) for b, s in zip(bases, scores)) + 1)
        rates = [n / cost(n, max(bases))] + [rate(bases, scores, cost, x, drafting) for x in qs]
        if max(rates) * (1 - 1e-9) >= floor:
            continue
        def profit(x):
            keep = [min(len(s), max(0, x - b)) for b, s in zip(bases, scores)]
            if not any(keep):
                return n - floor * cost(n, max(bases))
            return rate(bases, scores, cost, x, drafting) * (cost(n, x) + n * drafting) - floor * (cost(n, x) + n * drafting)
        best = max([n - floor * cost(n, max(bases))] + [profit(x) for x in qs])
        assert profit(q) >= best - 1e-9
