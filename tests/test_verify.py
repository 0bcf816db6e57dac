"""Greedy tree verification on the device and the round decision across ranks."""
import torch

from lp.decode.tree import tree_of
from lp.decode.verify import HEADER, decide, pack_payload, tree_tensors, tree_verdict

T = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731


def walk(tree, z, predictions):
    """The specification, on the host: follow the target's argmax down the tree."""
    node, emitted = -1, [z]
    while True:
        nxt = [u for u in tree.children(node) if tree.tokens[u] == emitted[-1]]
        if not nxt:
            return emitted, node
        node = nxt[0]
        emitted.append(predictions[node])


def payload(tree, z, preds, nodes=None, deep=(), width=4, slots=4, rows=1):
    nodes = nodes if nodes is not None else range(len(tree))
    head, after, _ = tree_verdict(T(z), *tree_tensors(tree, nodes, "cpu"), T([preds[u] for u in nodes]),
                                  first_node=nodes.start, width=width)
    return pack_payload(head, after, T(list(deep)), slots, rows).tolist()


def test_payload_layout_and_bonus_token():
    chain = tree_of([(5, 6, 7)])
    p = payload(chain, 5, [6, 7, 8], deep=[1, 2], width=3, rows=9)
    assert p[:HEADER] == [5, 3, 2, 2, 9]       # all 3 nodes match; the deepest is node 2; 9 rows fed
    assert p[HEADER:HEADER + 3] == [6, 7, 8]    # ...and 8 is the free 4th token
    assert p[HEADER + 3:] == [1, 2, -1, -1]
    d = decide([p], 3)
    assert d.emitted == [5, 6, 7, 8] and d.hits == 3 and d.node == 2 and d.deepest == [1, 2]
    assert d.rows == [9]


def test_every_rank_learns_every_ranks_fed_rows():
    """The rows each rank fed travel in the payload, so every rank knows the busiest one."""
    preds = [0, 6, 0, 9, 0, 8]
    a = payload(TREE, 5, preds, nodes=range(0, 1), deep=[1], rows=7)
    b = payload(TREE, 5, preds, nodes=range(1, 1), deep=[2, 3], rows=12)
    c = payload(TREE, 5, preds, nodes=range(1, 6), rows=4)
    d = decide([a, b, c], 4)
    assert d.rows == [7, 12, 4] and d.deepest == [1, 2, 3] and d.emitted == [5, 6, 9, 8]


def test_ranks_own_whole_subtrees_and_the_hit_decides():
    preds = [0, 6, 0, 9, 0, 8]
    a = payload(TREE, 5, preds, nodes=range(0, 1), deep=[1])   # subtree of 4: no hit
    b = payload(TREE, 5, preds, nodes=range(1, 6), deep=[2])   # subtree of 5: 3 hits
    d = decide([a, b], 4)
    assert d.emitted == [5, 6, 9, 8] and d.node == 5 and d.deepest == [1, 2]


def test_rank0_next_token_is_authoritative():
    preds = [0, 6, 0, 9, 0, 8]
    a = payload(TREE, 5, preds, nodes=range(0, 1))
    b = payload(TREE, 4, preds, nodes=range(1, 6))     # disagrees with rank 0 on z*: no hit
    d = decide([a, b], 4)
    assert d.emitted == [5] and d.hits == 0 and d.node == -1
