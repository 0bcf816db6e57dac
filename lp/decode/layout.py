"""One round's rows: token ids, positions, the 4-D mask and the rows that need logits,
all derived from ONE list of row records (DESIGN.md sections 2-3).

Roles:
- ORDINARY: committed tokens not yet in the cache, causal among themselves;
  the last one is b_0 (the live token x_t). Every other row sees all of them.
- BASE: b_j = levels[0][j-1], j >= 1, sees b_0..b_j.
- DEEP: u_{r,j} = levels[r][j], r >= 1, sees b_0..b_j and u_{1,j}..u_{r,j}.
- TREE: a node of the round's token tree (lp/decode/tree.py) at depth d,
  position p + d; sees the committed rows and its ancestors, itself included.
  A chain candidate v_{c,0}..v_{c,s} is the one-child-per-node case.
- PAD: rows that only round a round up to a fixed size (compiled rounds, or
  the batch's widest round); they see only themselves and are never read back.
Equal positions never imply visibility.

Every one of those rules is "sees its ancestors and itself" in one forest:
the committed prefix is the root, the ordinary rows a chain below it, and
below b_0 the tree's nodes, column 0's deep cells (a chain) and the base
cells b_1 -> b_2 -> ... with column j's deep cells a chain below b_j. So each
row carries two ints, its forest preorder number `pre` and the number just
past its subtree `end`, and row i sees row j exactly when
pre(j) <= pre(i) < end(j): the mask of a round of any shape is two
comparisons on the device (`round_mask`), whatever the tree's depth. PAD rows
are one-node trees of their own after the forest.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Sequence

import torch

from lp.decode.arch import CHUNKED, SLIDING, LayerAttention, windowed
from lp.decode.tree import EMPTY, TokenTree

ORDINARY, BASE, DEEP, TREE, PAD = range(5)
FUTURE = 1 << 40     # pre and end of the slots past a round: no row sees them


class Row(NamedTuple):
    role: int
    token: int
    pos: int
    level: int = 0   # window level (BASE: 0, DEEP: r)
    col: int = 0     # window column
    node: int = -1   # tree node index (TREE)
    off: int = 0     # depth - 1 (TREE); index among ORDINARY rows
    parent: int = -1  # row of the parent node (TREE; -1: a child of the root, x_t)
    pre: int = 0      # forest preorder number (the committed prefix is 0)
    end: int = 0      # the preorder number just past this row's subtree


@dataclass
class Round:
    """The rows of a round plus the indices the engine reads back."""
    rows: list[Row]
    last_ordinary: int                 # row index of b_0
    deep_rows: list[int]               # rows of the deepest filled level (in storage order)
    node_rows: list[int]               # row of each tree node fed here, in node order
    logit_rows: list[int]              # rows whose logits are computed: last_ordinary, deep_rows, node_rows

    def __len__(self) -> int:
        return len(self.rows)


def build_round(
    ordinary: Sequence[int],
    position: int,
    levels: Sequence[Sequence[int]],
    tree: TokenTree = EMPTY,
    nodes: range | None = None,
    columns: range | None = None,
) -> Round:
    """Rows for one round.

    `ordinary` are the committed tokens not yet in the cache; the last is x_t at
    logical `position` p. `levels` is the Jacobi window (level 0 starts at column
    1). `columns` restricts the window cells computed here to a contiguous block
    and `nodes` the tree to a contiguous block of whole root subtrees (LP
    sharding): a block ending at column e also feeds base cells b_1..b_{e-1},
    because its rows attend to them; an empty block feeds none.
    """
    k = len(ordinary)
    depth = len(levels)
    width = len(levels[0]) + 1 if depth else 0
    cols = columns if columns is not None else range(width)
    end = min(cols.stop, width) if cols.start < cols.stop else 0   # an empty block feeds no window rows
    tree_nodes = nodes if nodes is not None else range(len(tree))
    block = range(cols.start, end)                  # the columns whose deep cells are fed here
    chain = depth - 1                               # deep cells per fed column
    # forest preorder: prefix 0, ordinary 1..k, the tree's nodes, column 0's chain, then b_1, its
    # column's chain, b_2, ... (each base cell's subtree runs to the end of the window)
    top = [0] * max(end, 1)                         # preorder number of column j's first deep cell
    base = k + 1 + len(tree_nodes)                  # ...and of b_j, top[j] - 1 (j >= 1)
    for j in range(end):
        top[j] = base + (j > 0)
        base = top[j] + (chain if j in block else 0)
    stop = base                                     # 1 + the round's rows: every real row's subtree end
    rows = [Row(ORDINARY, tok, position - k + 1 + i, 0, 0, -1, i, -1, 1 + i, stop) for i, tok in enumerate(ordinary)]
    last = k - 1

    deep_rows: list[int] = []
    base_index = {0: last}
    for j in range(1, end):
        base_index[j] = len(rows)
        rows.append(Row(BASE, levels[0][j - 1], position + j, 0, j, -1, 0, -1, top[j] - 1, stop))
    if depth == 1:
        deep_rows = [base_index[j] for j in range(max(cols.start, 1), end)]
    for r in range(1, depth):
        if r == depth - 1:
            deep_rows = list(range(len(rows), len(rows) + len(block)))
        rows += [Row(DEEP, levels[r][j], position + j + r, r, j, -1, 0, -1, top[j] + r - 1, top[j] + chain)
                 for j in block]

    first, at = tree_nodes.start, len(rows)         # node u is row at + u - first
    ends, parents, depths, tokens = tree.subtree_ends(), tree.parents, tree.depths, tree.tokens
    rows += [Row(TREE, tokens[u], position + depths[u], 0, 0, u, depths[u] - 1,
                 at + parents[u] - first if parents[u] >= 0 else -1, k + 1 + u - first, k + 1 + ends[u] - first)
             for u in tree_nodes]                   # whole root subtrees, in preorder
    node_rows = list(range(at, len(rows)))

    # ordinary rows come first, then the window, then the tree: this list is sorted, and the
    # logits come back as [x_t's row, the deepest level's cells, the tree's nodes]
    return Round(rows, last, deep_rows, node_rows, [last, *deep_rows, *node_rows])


def bucket(rows: int) -> int:
    """The fixed size a round of `rows` rows is padded to when rounds are compiled: a power of
    two from 8 up, so a job sees a handful of shapes."""
    return max(8, 1 << (rows - 1).bit_length())


def visibility(rows: Sequence[Row], pads: int = 0) -> torch.Tensor:
    """Boolean [Q, Q] matrix: entry (i, j) is True when row i attends to row j (host, for tests),
    `pads` PAD rows after the rows included."""
    first = len(rows) + 1
    pre = torch.tensor([r.pre for r in rows] + [first + p for p in range(pads)])
    end = torch.tensor([r.end for r in rows] + [first + p + 1 for p in range(pads)])
    return (pre[None, :] <= pre[:, None]) & (pre[:, None] < end[None, :])


class RoundMask(NamedTuple):
    attention: torch.Tensor | dict[str, torch.Tensor]   # what the forward's attention_mask gets
    seen: torch.Tensor      # [B, Q, span] bool: which slots each fed row sees (no layer windows)


def round_mask(pre: torch.Tensor, keys: torch.Tensor, past: torch.Tensor, span: int, dtype: torch.dtype,
               kinds: dict[str, LayerAttention] | None = None, pos: torch.Tensor | None = None,
               numbers: torch.Tensor | None = None) -> RoundMask:
    """Additive 4-D mask [B, 1, Q, span] for B requests' rounds over the first `span` slots of their
    cache rows, built on the rows' device in a fixed handful of ops. `pre` [B, Q]: each fed row's
    preorder number; `keys` [B, 3, Q + 2]: the table of (pre, end, position) by slot, entry 0 for
    every committed slot (the root: pre 0, end past every real row), 1 + r for the slot of round
    row r, Q + 1 for every slot past the round (FUTURE); `past` [B, 1]: each request's committed
    slots, so slot s reads entry clamp(s + 1 - past, 0, Q + 1). Row i sees slot s when
    pre(s) <= pre(i) < end(s): its committed prefix, its ancestors in the round, itself.

    `kinds` (lp.decode.arch.attention_kinds: layer type -> rule) adds each windowed type's rule
    on positions (`pos` [B, Q]: the fed rows' positions): a sliding row also hides keys `size` or
    more positions behind it, a chunked row keys outside its chunk. With one layer type the mask
    is one tensor, with several a mapping from type name to mask (what transformers' models take
    per layer); without windows nothing changes. Committed slot i holds position i; the round's
    slots hold their rows' positions. `numbers`: arange(span + 1) or longer on the rows' device, made
    once (RoundCache.numbers), so that a round makes none."""
    b, q = pre.shape
    numbers = numbers if numbers is not None else torch.arange(span + 1, device=pre.device)
    entry = (numbers[1:span + 1] - past).clamp_(0, q + 1)                               # [B, span]
    table = keys.view(b, 3, q + 2).gather(2, entry[:, None, :].expand(b, 3, span))     # [B, 3, span]
    query = pre[:, :, None]
    seen = (table[:, None, 0] <= query) & (query < table[:, None, 1])                  # [B, Q, span]
    low = torch.finfo(dtype).min
    if not kinds or not windowed(kinds):
        return RoundMask(_additive(seen, dtype, low), seen)
    slot = numbers[:span]
    kpos = torch.where(entry == 0, slot, table[:, 2])[:, None, :]
    qpos = pos[:, :, None]
    masks = {}
    for name, kind in kinds.items():
        if kind.rule == SLIDING:
            keep = seen & (qpos - kpos < kind.size)
        elif kind.rule == CHUNKED:
            keep = seen & (qpos // kind.size == kpos // kind.size)
        else:
            keep = seen
        masks[name] = _additive(keep, dtype, low)
    return RoundMask(masks if len(masks) > 1 else next(iter(masks.values())), seen)


@lru_cache(maxsize=None)
def _zero(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=dtype, device=device)


def _additive(keep: torch.Tensor, dtype: torch.dtype, low: float) -> torch.Tensor:
    return torch.where(keep, _zero(dtype, keep.device), low)[:, None]
