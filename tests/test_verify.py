"""Greedy tree verification on the device and the round decision across ranks."""
import torch

from lp.decode.tree import tree_of
from lp.decode.verify import (HEADER, decide, frame_ancestors, greedy_ids, node_frame, node_mismatch, pack_payloads,
                              path_verdicts)

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


def verdicts(cases, width=4):
    """Several requests' verdicts at once, as the engine computes them: each case (tree, z*,
    predictions by node, this rank's nodes) in a node frame padded to the widest; per case
    (head [z*, hits, node], emitted after z*, the payload slot of each node)."""
    size = max(len(nodes) for _, _, _, nodes in cases)
    frames = [node_frame(tree, nodes, size, width, ends=True) for tree, _, _, nodes in cases]
    field = lambda name: T([f[name] for f in frames]).view(len(cases), size)  # noqa: E731
    preds = T([[z] + [p[u] for u in nodes] + [0] * (size - len(nodes)) for _, z, p, nodes in cases])
    off_path = node_mismatch(preds, field("tok"), field("par"), frame_ancestors(field("end")))
    hits, node, after, slot = path_verdicts(preds[:, 0], off_path, preds[:, 1:], field("depth"), field("step"),
                                            T([nodes.start for *_, nodes in cases]), width)
    out = []
    for i, (tree, z, _, nodes) in enumerate(cases):
        h = int(hits[i])
        if h > 0:     # the path, by depth, is the deepest node's path from the root
            path = [nodes.start + j for j in range(len(nodes)) if slot[i, j] < width]
            assert sorted(path, key=lambda u: tree.depths[u]) == tree.path(int(node[i]))
        out.append(([z, h, int(node[i])], after[i].tolist(), slot[i].tolist()))
    return out


def verdict(tree, z, predictions, nodes=None, width=4):
    nodes = nodes if nodes is not None else range(len(tree))
    head, after, _ = verdicts([(tree, z, predictions, nodes)], width)[0]
    return head, after


# preorder, children by token: nodes 0:4 | 1:5 2:1 3:6 4:7 5:9 (parents -1 | -1 1 1 3 3)
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
    """Batches of random trees of different sizes, verified at once, each as the host walk says."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    for _ in range(100):
        cases = []
        for _ in range(rand(1, 5)):
            tree = tree_of([tuple(torch.randint(0, 4, (rand(1, 5),), generator=gen).tolist())
                            for _ in range(rand(0, 6))])
            preds = torch.randint(0, 4, (len(tree),), generator=gen).tolist()
            cases.append((tree, rand(0, 4), preds, range(len(tree))))
        for (tree, z, preds, _), (head, after, _) in zip(cases, verdicts(cases, width=5)):
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
    head, after, _ = verdicts([(tree, z, preds, nodes)], width)[0]
    return pack_payloads(T(head[:1]), T(head[1:2]), T(head[2:3]), T([[len(deep), rows]]), T([after]),
                         T([list(deep)]).view(1, len(deep)), slots)[0].tolist()


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
    """Rank 1 disagrees with rank 0 on z* (ranks in low precision can): its hit under its own z* does not
    count."""
    preds = [7, 6, 0, 9, 0, 8]
    a = payload(TREE, 3, preds, nodes=range(1, 6))     # z* 3: no root child of its subtree (5) has it
    b = payload(TREE, 4, preds, nodes=range(0, 1))     # z* 4: its subtree's root, 4, matches
    assert a[1] == 0 and b[1] == 1
    d = decide([a, b], 4)
    assert d.emitted == [3] and d.hits == 0 and d.node == -1


def test_greedy_ids_are_argmax_on_ties_infinities_and_nans():
    """greedy_ids (a round's greedy predictions) picks what generate's argmax picks: the first of tied
    maxima, index 0 of an all -inf row, the first NaN; in every dtype, on a frame's strided view too."""
    g = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 3, (64, 257), generator=g).double()
    wide = torch.randn(3, 9, 4096, generator=g, dtype=torch.float64)
    wide[..., 4000] = wide.amax(-1)              # a tie with an earlier maximum, far along the row
    odd = torch.randn(4, 50, generator=g, dtype=torch.float64)
    odd[0] = float("-inf")
    odd[1, [7, 30]] = float("nan")
    odd[2] = float("nan")
    odd[3, 10:] = float("inf")
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        for scores in (ties, wide, wide[:, 2:], odd):
            scores = scores.to(dtype)
            assert torch.equal(greedy_ids(scores), scores.argmax(-1)), (dtype, scores.shape)
    assert greedy_ids(odd)[:4].tolist() == [0, 7, 0, 10]
