"""Token trees: the trie of merged candidates, its storage order, budgets and scores."""
import random

from lp.decode.tree import TokenTree, TreeBuilder, tree_of


def test_shared_prefixes_become_one_path_and_prefixes_add_nothing():
    t = tree_of([(1, 2, 3), (1, 2), (1, 2, 4), (5,), (1, 2, 3)])
    assert sorted(t.chains()) == [(1, 2, 3), (1, 2, 4), (5,)]
    assert len(t) == 5


def test_preorder_children_by_score_then_token():
    b = TreeBuilder()
    b.add((7, 1), 0.2)
    b.add((3, 9), 0.9)
    b.add((3, 4), 0.5)
    b.add((5,), 0.9)
    t = b.build()
    assert t.tokens == (3, 9, 4, 5, 7, 1)        # 3 and 5 tie on 0.9: token order; then 7
    assert t.parents == (-1, 0, 0, -1, -1, 4)
    assert t.units() == (3, 1, 2)                # root subtrees are contiguous blocks
    for u, p in enumerate(t.parents):
        assert p < u


def test_a_node_reached_twice_keeps_its_best_score_and_scores_never_grow():
    b = TreeBuilder()
    b.add((1, 2, 3), [0.3, 0.9, 0.8])           # clipped to 0.3 below the first node
    b.add((1, 2), 0.6)
    b.add((4,), 0.5)
    t = b.build(budget=3)
    assert sorted(t.chains()) == [(1, 2), (4,)]  # 1 and 2 at 0.6 beat 4 at 0.5; 3 (0.3) is cut


def test_budget_keeps_the_best_nodes_with_their_ancestors():
    rng = random.Random(0)
    for _ in range(200):
        b = TreeBuilder()
        paths = [tuple(rng.randrange(4) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
        for path in paths:
            b.add(path, sorted((rng.random() for _ in path), reverse=True))
        full = b.build()
        budget = rng.randint(0, len(full))
        cut = b.build(budget)
        assert len(cut) == budget
        chains = set(full.chains())
        for u in range(len(cut)):               # every kept node's path is a path of the full tree
            path = tuple(cut.tokens[v] for v in cut.path(u))
            assert any(c[:len(path)] == path for c in chains)


def test_from_parents_round_trips():
    t = tree_of([(1, 2, 3), (1, 4), (6, 7)])
    assert TokenTree.from_parents(t.tokens, t.parents) == t
    assert t.max_depth == 3 and t.path(2) == [0, 1, 2]


def test_max_depth_cuts_every_path_at_that_depth():
    """Near a position threshold or max_new_tokens the proposer builds with max_depth: the tree is the
    unbounded one's nodes of depth <= max_depth, subtrees of a dropped node dropped with it."""
    rng = random.Random(1)
    for _ in range(200):
        paths = [tuple(rng.randrange(4) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 6))]
        scores = [[rng.random() for _ in p] for p in paths]
        depth = rng.randint(0, 4)
        full, cut = TreeBuilder(), TreeBuilder(max_depth=depth)
        for path, score in zip(paths, scores):
            full.add(path, score)
            cut.add(path, score)
        t = cut.build()
        assert t.max_depth <= depth
        assert sorted(t.chains()) == sorted({c[:depth] for c in full.build().chains() if depth})
        assert cut.ranking() == [r for r in full.ranking() if r[1] <= depth]
