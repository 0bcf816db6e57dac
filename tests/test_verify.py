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


def verdict(tree, z, predictions, nodes=None, width=4):
    nodes = nodes if nodes is not None else range(len(tree))
    head, after, path = tree_verdict(T(z), *tree_tensors(tree, nodes, "cpu"), T([predictions[u] for u in nodes]),
                                     first_node=nodes.start, width=width)
    if head[1] > 0:     # the path, by depth, is the deepest node's path from the root
        assert [u + nodes.start for u in path[:head[1]].tolist()] == tree.path(int(head[2]))
    return head.tolist(), after.tolist()


# preorder: 5 6 7 | 5 6 9 | 5 1 | 4 -> nodes 0:5 1:6 2:7 3:9 4:1 5:4
TREE = tree_of([(5, 6, 7), (5, 6, 9), (5, 1), (4,)])


def test_the_tree_is_stored_in_preorder_with_children_by_token():
    assert TREE.tokens == (4, 5, 1, 6, 7, 9) and TREE.parents == (-1, -1, 1, 1, 3, 3)
    assert TREE.depths == (1, 1, 2, 2, 3, 3) and TREE.units() == (1, 5)


def test_walk_follows_argmax_down_the_branch_that_matches():
    preds = [0, 6, 0, 9, 0, 8]           # 5 -> predicts 6 -> predicts 9 -> (leaf 9) predicts 8
    head, after = verdict(TREE, 5, preds)
    assert head == [5, 3, 5] and after[:3] == [6, 9, 8]
    emitted, node = walk(TREE, 5, preds)
    assert emitted == [5] + after[:3] and node == head[2]


def test_random_trees_agree_with_the_host_walk():
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        paths = [tuple(torch.randint(0, 4, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist())
                 for _ in range(int(torch.randint(1, 6, (1,), generator=gen)))]
        tree = tree_of(paths)
        preds = torch.randint(0, 4, (len(tree),), generator=gen).tolist()
        z = int(torch.randint(0, 4, (1,), generator=gen))
        head, after = verdict(tree, z, preds, width=5)
        emitted, node = walk(tree, z, preds)
        assert [head[0]] + after[:head[1]] == emitted and head[1] == len(emitted) - 1
        assert head[1] == 0 or head[2] == node


def test_no_match_and_empty_tree_emit_only_z():
    assert verdict(TREE, 3, [0] * 6)[0][:2] == [3, 0]
    empty = tree_of([])
    head, after = verdict(empty, 3, [], width=4)
    assert head[:2] == [3, 0] and after == [0, 0, 0, 0]


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
