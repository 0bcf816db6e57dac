"""Packing the rounds of several requests into one forward.

A batched round has a batch dimension: request b's rows are batch row b,
padded with PAD rows to the round's Q, each request's K/V in its own cache
row, so a row attends over its own request's cached positions only and rows
of different requests never meet. The other layout, every request's rows
packed into one batch row over one long cache with a block-diagonal mask,
needs no padding but makes every row attend over the whole batch's cache: its
attention cost grows with the batch, ours with each request's own length.

transformers computes logits for the same trailing rows in every batch row
(`logits_to_keep`), and verification wants the same layout in every request,
so each request's rows are fed in one order whatever the request (a batch of
one included):

    [rows without logits][PAD][deep frame: D][z*'s row][node frame: N]

the deep frame holding the window's deepest cells (then PAD up to D, the most
any request feeds), z*'s row b_0, and the node frame this rank's tree nodes in
preorder (then PAD up to N). The forward keeps the last K = D + 1 + N rows
(compiled rounds keep all Q: a compiled graph per (Q, attended slots), not per
(Q, K, attended slots); the extra rows only cost logits), and the round's
work after it (verification of every request's nodes, the payload,
publication) is a fixed handful of ops on [B, ...] tensors. A fed row
still goes to its round row's own cache slot (slot = the request's past + the
row's index in its round; PAD rows after the round's), so the mask's key side
is in round order and its query side in fed order.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Callable, NamedTuple, Sequence

import torch

from lp.decode.kv_cache import RoundCache, forward_logits
from lp.decode.layout import FUTURE, round_mask
from lp.decode.request import RoundPlan
from lp.decode.verify import node_frame


class Packed(NamedTuple):
    """The shape of a packed round, the same for every request in it."""
    q: int          # rows fed per request, padding included
    k: int          # logit rows kept per request: the last k fed
    deep: int       # D: the deep frame's rows
    nodes: int      # N: the node frame's rows

    @property
    def frame(self) -> int:
        """Rows of the frame (deep, z*, nodes) at the end of the kept logits."""
        return self.deep + 1 + self.nodes


def pack_round(plans: Sequence[RoundPlan], pasts: Sequence[int], rows: Sequence[int], width: int,
               fit: Callable[[int], int] = lambda q: q, fixed: bool = False) -> tuple[dict[str, list[int]], Packed]:
    """(sections for one upload, the round's shape) for the requests' `plans`: `pasts` are their
    committed cache slots, `rows` their cache rows, `width` the deepest tree node; `fit` pads Q to
    a few sizes, and `fixed` (compiled rounds) keeps every row's logits (K = Q): fewer shapes.

    Sections, request after request: per fed row "ids", "pos", "slot" (its cache slot: past + its
    index in the round) and "pre" (its preorder number, lp/decode/layout.py); "keys"
    (round_mask's key table); "past" and "rows" (the cache row); per node-frame row "tok" (-1:
    PAD), "par" (the parent's index in [z*, nodes]), "depth" (0: PAD) and "step" (depth - 1;
    PAD: width, a spare); "dst" (the frontier slots publication fills, and a spare); "meta"
    (first node's index in the tree, deep cells fed, rows fed)."""
    deep = max(len(p.rnd.deep_rows) for p in plans)
    nodes = max(len(p.nodes) for p in plans)
    others = max(len(p.rnd) - 1 - len(p.rnd.deep_rows) - len(p.nodes) for p in plans)
    q = fit(others + deep + 1 + nodes)
    k = q if fixed else deep + 1 + nodes
    names = ("ids", "pos", "slot", "pre", "keys", "past", "rows", "tok", "par", "depth", "step", "dst", "meta")
    out: dict[str, list[int]] = {name: [] for name in names}
    for plan, past, row in zip(plans, pasts, rows):
        rnd = plan.rnd
        size, deep_rows, node_rows = len(rnd), rnd.deep_rows, rnd.node_rows
        # rows are stored [ordinary][window][tree]: the rows without logits are the ordinary rows
        # but the last and the window's rows before its deepest cells (or around them, in a block)
        window = range(rnd.last_ordinary + 1, node_rows[0] if node_rows else size)
        head = [*range(rnd.last_ordinary)]
        if len(window):
            deepest = set(deep_rows)
            head += [i for i in window if i not in deepest]
        before, gap = q - len(head) - deep - 1 - nodes, deep - len(deep_rows)   # PAD rows (round index >= size)
        order = [*head, *range(size, size + before), *deep_rows, *range(size + before, size + before + gap),
                 rnd.last_ordinary, *node_rows, *range(size + before + gap, q)]
        _, tok_of, pos_of, *_, pre_of, end_of = zip(*rnd.rows)
        pads = q - size
        tok_of = [*tok_of, *[0] * pads]
        pos_of = [*pos_of, *[pos_of[-1]] * pads]
        pre_of = [*pre_of, *range(size + 1, q + 1)]            # PAD rows: one-node trees after the forest
        end_of = [*end_of, *range(size + 2, q + 2)]
        fed = itemgetter(*order) if q > 1 else lambda values: [values[order[0]]]   # in fed order
        out["ids"] += fed(tok_of)
        out["pos"] += fed(pos_of)
        out["pre"] += fed(pre_of)
        out["slot"] += [past + i for i in order]
        out["keys"] += [0, *pre_of, FUTURE, size + 1, *end_of, FUTURE, 0, *pos_of, 0]
        out["past"].append(past)
        out["rows"].append(row)
        frame = node_frame(plan.tree, plan.nodes, nodes, width)
        for name in ("tok", "par", "depth", "step"):
            out[name] += frame[name]
        frontier = past + rnd.last_ordinary + 1
        out["dst"] += [*range(frontier, frontier + width), 0]
        out["meta"] += [plan.nodes.start, len(deep_rows), size]
    return out, Packed(q, k, deep, nodes)


def forward_round(model, dev: dict[str, torch.Tensor], n: int, shape: Packed, first_row: int, cache: RoundCache,
                  kinds=None, compiled=None, span: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over a packed round of `n` requests in cache rows [first_row, first_row + n)
    (`dev`: the uploaded sections of pack_round): (logits [n, K, V] of each request's last K fed
    rows, which slots each fed row sees [n, Q, span], each fed row's cache slot [n, Q]). Attention
    reads the first `span` slots of each cache row (default: all), which must hold every
    request's committed slots and round."""
    q = shape.q
    span = span or cache.length
    pre, pos, past = dev["pre"].view(n, q), dev["pos"].view(n, q), dev["past"].view(n, 1)
    mask = round_mask(pre, dev["keys"], past, span, model.dtype, kinds, pos, cache.numbers)
    slots = dev["slot"].view(n, q)
    cache.rows = None if cache.batch == 1 else slice(first_row, first_row + n)
    logits = forward_logits(model, dev["ids"].view(n, q), pos, mask.attention, cache, shape.k,
                            slots[0] if n == 1 else slots, compiled)
    return logits, mask.seen, slots
