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
- PAD: rows that only round a round up to a fixed size (compiled rounds);
  they see only themselves and are never read back.
Equal positions never imply visibility.

On the device a round is described by one int per row and field (role,
level, column, depth - 1 / ordinary index, parent row, subtree end): `descriptors` packs
them with the ids and positions, `round_mask` builds the additive mask from
them with tensor ops on whatever device holds them (nothing of size Q x
(past + Q) is built on the host), `visibility` is the same rule on the host
for tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from lp.decode.arch import CHUNKED, SLIDING, LayerAttention, windowed
from lp.decode.tree import EMPTY, TokenTree

ORDINARY, BASE, DEEP, TREE, PAD = range(5)
FIELDS = ("ids", "pos", "role", "level", "col", "off", "parent", "end")


class Row(NamedTuple):
    role: int
    token: int
    pos: int
    level: int = 0   # window level (BASE: 0, DEEP: r)
    col: int = 0     # window column
    node: int = -1   # tree node index (TREE)
    off: int = 0     # depth - 1 (TREE); index among ORDINARY rows
    parent: int = -1  # row of the parent node (TREE; -1: a child of the root, x_t)
    end: int = 0      # the row just past this node's subtree (TREE; rows are in preorder)


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
    rows = [Row(ORDINARY, tok, position - k + 1 + i, off=i) for i, tok in enumerate(ordinary)]
    last = k - 1
    depth = len(levels)
    width = len(levels[0]) + 1 if depth else 0
    cols = columns if columns is not None else range(width)
    end = min(cols.stop, width) if cols.start < cols.stop else 0   # an empty block feeds no window rows

    deep_rows: list[int] = []
    base_index = {0: last}
    for j in range(1, end):
        base_index[j] = len(rows)
        rows.append(Row(BASE, levels[0][j - 1], position + j, 0, j))
    if depth == 1:
        deep_rows = [base_index[j] for j in range(max(cols.start, 1), end)]
    for r in range(1, depth):
        for j in range(cols.start, end):
            if r == depth - 1:
                deep_rows.append(len(rows))
            rows.append(Row(DEEP, levels[r][j], position + j + r, r, j))

    row_of: dict[int, int] = {}
    ends = tree.subtree_ends()
    for u in nodes if nodes is not None else range(len(tree)):   # whole root subtrees, in preorder
        row_of[u] = len(rows)
        parent = tree.parents[u]
        rows.append(Row(TREE, tree.tokens[u], position + tree.depths[u], node=u, off=tree.depths[u] - 1,
                        parent=row_of[parent] if parent >= 0 else -1, end=len(rows) + ends[u] - u))
    node_rows = list(row_of.values())

    # ordinary rows come first, then the window, then the tree: this list is sorted, and the
    # logits come back as [x_t's row, the deepest level's cells, the tree's nodes]
    return Round(rows, last, deep_rows, node_rows, [last, *deep_rows, *node_rows])


def bucket(rows: int) -> int:
    """The fixed size a round of `rows` rows is padded to when rounds are compiled: a power of
    two from 8 up, so a job sees a handful of shapes."""
    return max(8, 1 << (rows - 1).bit_length())


def descriptors(rnd: Round, size: int | None = None) -> dict[str, list[int]]:
    """The rows as one int list per field (FIELDS), padded with PAD rows to `size`."""
    rows = rnd.rows
    pad = (size or len(rows)) - len(rows)
    if pad < 0:
        raise ValueError(f"a round of {len(rows)} rows does not fit {size}")
    last_pos = rows[-1].pos
    return {
        "ids": [r.token for r in rows] + [0] * pad,
        "pos": [r.pos for r in rows] + [last_pos] * pad,
        "role": [r.role for r in rows] + [PAD] * pad,
        "level": [r.level for r in rows] + [0] * pad,
        "col": [r.col for r in rows] + [0] * pad,
        "off": [r.off for r in rows] + [0] * pad,
        "parent": [r.parent for r in rows] + [-1] * pad,
        "end": [r.end for r in rows] + [0] * pad,
    }


def visibility(rows: Sequence[Row]) -> torch.Tensor:
    """Boolean [Q, Q] matrix: entry (i, j) is True when row i attends to row j (host, for tests)."""
    t = torch.tensor([(r.role, r.level, r.col, r.off, r.end) for r in rows], dtype=torch.long)
    return visibility_from(*t.unbind(1))


def visibility_from(role: torch.Tensor, level: torch.Tensor, col: torch.Tensor, off: torch.Tensor,
                    end: torch.Tensor) -> torch.Tensor:
    """The visibility rule on per-row descriptor tensors [..., Q] (any device, any leading batch
    dimensions): [..., Q, Q]. Tree rows are in preorder with `end` past each one's subtree, so
    row j is an ancestor of row i (or i itself) exactly when j <= i < end(j): no walk up the tree."""
    qi = lambda x: x[..., :, None]  # noqa: E731  (query side)
    kj = lambda x: x[..., None, :]  # noqa: E731  (key side)
    ordinary = role == ORDINARY
    window = (role == BASE) | (role == DEEP) | ordinary
    pad = role == PAD
    node = role == TREE
    index = torch.arange(role.shape[-1], device=role.device)

    # everyone sees the committed rows; committed rows among themselves are causal
    sees_ordinary = kj(ordinary) & ~qi(pad) & (~qi(ordinary) | (kj(off) <= qi(off)))
    # window rows: base cells of columns <= own column, own column's deep cells up to own level
    sees_base = qi(window & ~ordinary) & kj(role == BASE) & (kj(col) <= qi(col))
    sees_deep = (qi(role == DEEP) & kj(role == DEEP) & (kj(col) == qi(col))
                 & (kj(level) <= qi(level)))
    tree = qi(node) & kj(node) & subtree_ancestors(end)
    itself = (index[:, None] == index[None, :]) & qi(pad)
    return sees_ordinary | sees_base | sees_deep | tree | itself


def subtree_ancestors(end: torch.Tensor) -> torch.Tensor:
    """[..., Q, Q] bool from preorder subtree ends [..., Q]: (i, j) when j <= i < end(j), i.e. j is
    row i itself or one of its ancestors (meaningful between tree rows)."""
    index = torch.arange(end.shape[-1], device=end.device)
    return (index[None, :] <= index[:, None]) & (index[:, None] < end[..., None, :])


class RoundMask(NamedTuple):
    attention: torch.Tensor | dict[str, torch.Tensor]   # what the forward's attention_mask gets
    visible: torch.Tensor                                # [..., Q, Q] bool: the visibility rule among the rows


def round_mask(rows: dict[str, torch.Tensor], past: int | torch.Tensor, length: int, dtype: torch.dtype,
               kinds: dict[str, LayerAttention] | None = None, order: torch.Tensor | None = None) -> RoundMask:
    """Additive 4-D mask [B, 1, Q, length] for B requests' rounds (descriptors [B, Q]; [Q] for one,
    giving B = 1), request b's written to slots [past_b, past_b + Q) of its cache row of `length`
    slots: every real row sees its request's committed prefix [0, past_b), its round's rows by the
    visibility rule, nothing after; built on the rows' device. `order` [B, Q] (default: as built)
    says which round row each fed row is: the mask's query rows come in that order, `visible`
    stays in round order.

    `kinds` (lp.decode.arch.attention_kinds: layer type -> rule) adds each windowed type's rule
    on positions: a sliding row also hides keys `size` or more positions behind it, a chunked row
    keys outside its chunk. With one layer type the mask is one tensor, with several a mapping
    from type name to mask (what transformers' models take per layer); without windows nothing
    changes. Committed slot i holds position i; the round's slots hold their rows' positions."""
    single = rows["role"].dim() == 1
    if single:
        rows = {k: v[None] for k, v in rows.items()}
        order = None if order is None else order[None]
    role, pos = rows["role"], rows["pos"]
    (b, q), device, low = role.shape, role.device, torch.finfo(dtype).min
    vis = visibility_from(role, rows["level"], rows["col"], rows["off"], rows["end"])      # [B, Q, Q]
    past = past if isinstance(past, int) else past.reshape(-1, 1)       # an int, or [B, 1] on the device
    rel = torch.arange(length, device=device)[None, :] - past                              # slot - past_b
    in_round = (rel >= 0) & (rel < q)
    where = torch.where(in_round, rel, q).expand(b, length)                                 # q: a False column
    fed_vis, fed_role, fed_pos = vis, role, pos
    if order is not None:
        fed_vis = vis.gather(1, order[..., None].expand(b, q, q))
        fed_role, fed_pos = role.gather(1, order), pos.gather(1, order)
    fed_vis = torch.cat([fed_vis, torch.zeros((b, q, 1), dtype=torch.bool, device=device)], dim=2)
    seen = fed_vis.gather(2, where[:, None, :].expand(b, q, length))
    seen |= (rel < 0)[:, None, :] & (fed_role != PAD)[:, :, None]
    if not kinds or not windowed(kinds):
        return RoundMask(_additive(seen, dtype, low), vis[0] if single else vis)
    qpos = fed_pos[:, :, None]
    kpos = torch.where(in_round, pos.gather(1, where.clamp(max=q - 1)), rel + past)[:, None, :]
    masks = {}
    for name, kind in kinds.items():
        if kind.rule == SLIDING:
            keep = seen & (qpos - kpos < kind.size)
        elif kind.rule == CHUNKED:
            keep = seen & (qpos // kind.size == kpos // kind.size)
        else:
            keep = seen
        masks[name] = _additive(keep, dtype, low)
    return RoundMask(masks if len(masks) > 1 else next(iter(masks.values())), vis[0] if single else vis)


def _additive(keep: torch.Tensor, dtype: torch.dtype, low: float) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, low)[:, None]
