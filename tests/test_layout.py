"""Round layout: visibility rules row by row (the forest numbering against the rules written out
by role), row counts, logit rows, and the packed forward against separate causal forwards (the
oracle)."""
import pytest
import torch

from lp.decode.batch import forward_round, pack_round
from lp.decode.device import Uploader
from lp.decode.kv_cache import RoundCache
from lp.decode.layout import BASE, DEEP, ORDINARY, bucket, build_round, visibility
from lp.decode.request import RoundPlan
from lp.decode.tree import EMPTY, tree_of
from reference import last_logits


def name(row):
    if row.role == ORDINARY:
        return f"o{row.off}"
    if row.role == BASE:
        return f"b{row.col}"
    if row.role == DEEP:
        return f"u{row.level},{row.col}"
    return f"v{row.node}"


def expected_visible(rnd):
    """DESIGN.md section 3, written out per row by name (a row that a sharded round does not feed
    is not in the round, so it is not seen)."""
    k = sum(r.role == ORDINARY for r in rnd.rows)
    ords = [f"o{i}" for i in range(k)]
    fed = {name(r) for r in rnd.rows}
    out = {}
    for r in rnd.rows:
        if r.role == ORDINARY:
            seen = ords[:r.off + 1]
        elif r.role == BASE:
            seen = ords + [f"b{j}" for j in range(1, r.col + 1)]
        elif r.role == DEEP:
            seen = ords + [f"b{j}" for j in range(1, r.col + 1)]
            seen += [f"u{q},{r.col}" for q in range(1, r.level + 1) if f"u{q},{r.col}" in fed]
        else:   # the node and its ancestors, from the tree itself
            seen = ords + [f"v{u}" for u in rnd_tree(rnd).path(r.node)]
        out[name(r)] = set(seen)
    return out


LEVELS_N4_W3 = [[11, 12], [21, 22, 23], [31, 32, 33]]
CANDS = tree_of([(41, 42, 43), (51, 52, 53)])                   # two chains: v0 v1 v2 | v3 v4 v5
BRANCHY = tree_of([(41, 42, 43), (41, 44), (41, 42, 45), (51,)])  # branches at depth 1 and 2
_TREES = {}


def rnd_tree(rnd):
    return _TREES[id(rnd)]


def build(ordinary, position, levels, tree, **kw):
    rnd = build_round(ordinary, position, levels, tree, **kw)
    _TREES[id(rnd)] = tree
    return rnd


@pytest.mark.parametrize("ordinary", [[9], [7, 8, 9]])
@pytest.mark.parametrize("tree", [CANDS, BRANCHY])
@pytest.mark.parametrize("levels,columns", [(LEVELS_N4_W3, None), (LEVELS_N4_W3, range(0, 1)),
                                            (LEVELS_N4_W3, range(1, 3)), (LEVELS_N4_W3, range(2, 3)),
                                            ([[11, 12, 13]], None), ([], None)])
def test_visibility_row_by_row(ordinary, tree, levels, columns):
    """Whole rounds and LP column blocks, steady state and warmup: the preorder numbers give
    exactly the rule's rows, and every number is used once."""
    rnd = build(ordinary, 20, levels, tree, columns=columns)
    assert sorted(r.pre for r in rnd.rows) == list(range(1, len(rnd) + 1))
    vis = visibility(rnd.rows)
    want = expected_visible(rnd)
    names = [name(r) for r in rnd.rows]
    for i, r in enumerate(rnd.rows):
        got = {names[j] for j in range(len(names)) if vis[i, j]}
        assert got == want[names[i]], names[i]


def test_positions_follow_the_coordinates():
    rnd = build_round([9], 20, LEVELS_N4_W3, BRANCHY)
    pos = {name(r): r.pos for r in rnd.rows}
    assert pos["o0"] == 20 and pos["b1"] == 21 and pos["b2"] == 22
    assert pos["u1,0"] == 21 and pos["u2,2"] == 24
    # BRANCHY in preorder: 41 42 43 45 44 | 51; a node at depth d sits at p + d
    assert [pos[f"v{u}"] for u in range(6)] == [21, 22, 23, 23, 22, 21]
    tok = {name(r): r.token for r in rnd.rows}
    assert tok["b1"] == 11 and tok["u2,1"] == 32 and [tok[f"v{u}"] for u in range(6)] == [41, 42, 43, 45, 44, 51]


@pytest.mark.parametrize("n,w,c", [(3, 1, 0), (4, 5, 0), (4, 5, 3), (5, 15, 15), (7, 2, 1)])
def test_steady_row_count(n, w, c):
    levels = [[1] * (w - 1)] + [[2] * w for _ in range(n - 2)]
    cands = tree_of([(3 + i,) + (3,) * (n - 2) for i in range(c)])   # c chains of N-1 tokens
    rnd = build_round([5], 0, levels, cands)
    assert len(rnd) == (w + c) * (n - 1)


def test_logit_rows_are_only_the_needed_ones():
    rnd = build_round([7, 8, 9], 20, LEVELS_N4_W3, CANDS)
    names = [name(r) for r in rnd.rows]
    got = {names[i] for i in rnd.logit_rows}
    assert got == {"o2", "u2,0", "u2,1", "u2,2"} | {f"v{u}" for u in range(6)}
    # during warmup with only level 0, the base cells are the deepest level
    rnd = build_round([9], 20, [[11, 12, 13]])
    assert {names for names in (name(rnd.rows[i]) for i in rnd.logit_rows)} == {"o0", "b1", "b2", "b3"}


def test_column_block_feeds_earlier_base_cells():
    """An LP block ending at column e also feeds b_1..b_{e-1} but only its own deep cells."""
    rnd = build_round([9], 20, LEVELS_N4_W3, columns=range(2, 3))
    names = [name(r) for r in rnd.rows]
    assert names == ["o0", "b1", "b2", "u1,2", "u2,2"]
    assert [names[i] for i in rnd.deep_rows] == ["u2,2"]


@pytest.mark.parametrize("start", [0, 2, 3])
def test_empty_column_block_feeds_no_window_rows(start):
    """A rank whose block holds no column (W < P) feeds only the ordinary rows and its
    candidates, as the shard plan counts it (block_rows of an empty block is 0)."""
    from lp.parallel.shard import block_rows

    for levels in (LEVELS_N4_W3, [[11, 12, 13]]):
        rnd = build_round([8, 9], 20, levels, tree_of([(4, 5)]), columns=range(start, start))
        assert [name(r) for r in rnd.rows] == ["o0", "o1", "v0", "v1"] and rnd.deep_rows == []
        assert len(rnd) == 2 + block_rows(start, start, len(levels)) + 2


def branch_tokens(rnd, row_index, vis):
    """The tokens a row sees, in position order: its causal branch."""
    seen = [r for j, r in enumerate(rnd.rows) if vis[row_index, j]]
    seen.sort(key=lambda r: r.pos)
    positions = [r.pos for r in seen]
    assert positions == list(range(positions[0], positions[0] + len(positions))), "branch must be contiguous"
    return [r.token for r in seen], positions[0]


@torch.inference_mode()
def packed_logits(model, rnd, tree, past, cache, pad_to=None):
    """The engine's path: pack_round -> one upload -> mask on the device -> static-cache forward;
    the logits of `rnd.logit_rows`, in that order."""
    plan = RoundPlan(rnd, tree, range(len(tree)))
    sections, shape = pack_round([plan], [past], [0], 4, fit=lambda q: pad_to or q)
    logits, *_ = forward_round(model, Uploader("cpu").send(sections), 1, shape, 0, cache)
    frame, d = logits[0, shape.k - shape.frame:], shape.deep
    return torch.cat([frame[d:d + 1], frame[:len(rnd.deep_rows)], frame[d + 1:d + 1 + len(tree)]])


@pytest.mark.parametrize("prefilled", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("levels,cands", [
    (LEVELS_N4_W3, [(41, 42, 43), (51, 52, 53)]),           # steady state, N=4 W=3, 2 chains
    (LEVELS_N4_W3, [(41, 42, 43), (41, 44), (41, 42, 45), (51,)]),   # a tree branching below the root
    ([[11, 12, 13, 14]], [(41, 42, 43)]),                   # first warmup round, one candidate
    ([[11, 12, 13], [21, 22, 23, 24]], []),                 # second warmup round
    ([], [(41, 42, 43), (41, 44, 46), (47,)]),              # no window at all
])
def test_packed_round_equals_separate_causal_forwards(tiny_model64, prefilled, padded, levels, cands):
    """Every logit row of a packed round (static cache, mask from the uploaded descriptors,
    optionally padded to a compiled round's size) equals a causal forward of its branch."""
    model = tiny_model64
    vocab = model.config.vocab_size
    prompt = [3, 5, 7, 9, 11, 13, 2, 4]
    levels = [[t % vocab for t in lv] for lv in levels]
    cands = tree_of([tuple(t % vocab for t in c) for c in cands])
    cache = RoundCache(model, 64)
    if prefilled:   # the cache holds prompt[:-1]; the round has one ordinary row
        pre = build_round(prompt[:-1], len(prompt) - 2, [])
        packed_logits(model, pre, EMPTY, 0, cache)
        ordinary = prompt[-1:]
    else:           # prefill round: the whole prompt is ordinary rows
        ordinary = prompt
    past = len(prompt) - len(ordinary)
    rnd = build_round(ordinary, len(prompt) - 1, levels, cands)
    logits = packed_logits(model, rnd, cands, past, cache, bucket(len(rnd) + 1) if padded else None)
    vis = visibility(rnd.rows)
    for k, i in enumerate(rnd.logit_rows):
        tokens, first_pos = branch_tokens(rnd, i, vis)
        assert first_pos == past   # every branch starts right after the cached prefix
        ref = last_logits(model, prompt[:past] + tokens)
        assert (logits[k] - ref).abs().max().item() < 1e-9, name(rnd.rows[i])


def test_padding_rows_see_only_themselves():
    """A packed round padded by 3 rows over 5 committed slots: real rows see the committed prefix
    and the visibility rule's rows, PAD rows their own slot only, nobody a slot past the round."""
    rnd = build_round([7, 8, 9], 20, LEVELS_N4_W3, CANDS)
    q = len(rnd)
    sections, shape = pack_round([RoundPlan(rnd, CANDS, range(len(CANDS)))], [5], [0], 4, fit=lambda q: q + 3)
    dev = Uploader("cpu").send(sections)
    cache = RoundCache(tiny_cache_model(), 64)
    from lp.decode.layout import round_mask
    mask = round_mask(dev["pre"].view(1, -1), dev["keys"], dev["past"].view(1, 1), 64, torch.float64)
    seen = (mask.attention[0, 0] == 0)
    assert (seen == mask.seen[0]).all() and shape.q == q + 3 and cache.length == 64
    slot = sections["slot"]                            # fed row i -> its cache slot
    fed = [s - 5 for s in slot]                        # ...its index in the round (PAD: >= q)
    vis = visibility(rnd.rows, pads=3)
    for i, r in enumerate(fed):
        assert bool(seen[i, :5].all()) == (r < q) and bool(seen[i, :5].any()) == (r < q)
        assert seen[i, 5:].nonzero().flatten().tolist() == vis[r].nonzero().flatten().tolist()
        if r >= q:
            assert seen[i].nonzero().flatten().tolist() == [slot[i]]     # its own slot, nothing else
    assert not seen[:, 5 + q + 3:].any()


def tiny_cache_model():
    from lp.models import tiny_random_llama
    return tiny_random_llama(vocab=16, seed=1).model.double()
