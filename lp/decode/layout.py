"""One round's rows: token ids, positions, the 4-D mask and the rows that need logits,
all derived from ONE list of row records (DESIGN.md sections 2-3).

Roles:
- ORDINARY: committed tokens not yet in the cache, causal among themselves;
  the last one is b_0 (the live token x_t). Every other row sees all of them.
- BASE: b_j = levels[0][j-1], j >= 1, sees b_0..b_j.
- DEEP: u_{r,j} = levels[r][j], r >= 1, sees b_0..b_j and u_{1,j}..u_{r,j}.
- CAND: v_{c,s} = s-th token of candidate c, sees b_0 and v_{c,0}..v_{c,s}.
Equal positions never imply visibility.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

ORDINARY, BASE, DEEP, CAND = range(4)


class Row(NamedTuple):
    role: int
    token: int
    pos: int
    level: int = 0   # window level (BASE: 0, DEEP: r)
    col: int = 0     # window column
    cand: int = -1   # candidate index (CAND)
    off: int = 0     # offset inside the candidate (CAND); index among ORDINARY rows


@dataclass
class Round:
    """The rows of a round plus the indices the engine reads back."""
    rows: list[Row]
    last_ordinary: int                 # row index of b_0
    deep_rows: list[int]               # rows of the deepest filled level (in storage order)
    cand_rows: list[list[int]]         # cand_rows[c][s] = row of v_{c,s}
    logit_rows: list[int]              # sorted row indices whose logits are computed

    def __len__(self) -> int:
        return len(self.rows)


def build_round(
    ordinary: Sequence[int],
    position: int,
    levels: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[int]],
    columns: range | None = None,
) -> Round:
    """Rows for one round.

    `ordinary` are the committed tokens not yet in the cache; the last is x_t at
    logical `position` p. `levels` is the Jacobi window (level 0 starts at column
    1). `columns` restricts the window cells computed here to a contiguous block
    (LP sharding): a block ending at column e also feeds base cells b_1..b_{e-1},
    because its rows attend to them; an empty block feeds none. Candidates are (c, suffix) in global order.
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

    cand_rows: list[list[int]] = []
    for c, suffix in enumerate(candidates):
        cand_rows.append([])
        for s, tok in enumerate(suffix):
            cand_rows[-1].append(len(rows))
            rows.append(Row(CAND, tok, position + 1 + s, cand=c, off=s))

    logit_rows = sorted({last, *deep_rows, *(i for cr in cand_rows for i in cr)})
    return Round(rows, last, deep_rows, cand_rows, logit_rows)


def visibility(rows: Sequence[Row]) -> torch.Tensor:
    """Boolean [Q, Q] matrix: entry (i, j) is True when row i attends to row j."""
    t = torch.tensor([(r.role, r.level, r.col, r.cand, r.off) for r in rows], dtype=torch.long)
    role, level, col, cand, off = t.unbind(1)
    qi = lambda x: x[:, None]  # noqa: E731  (query side)
    kj = lambda x: x[None, :]  # noqa: E731  (key side)
    ordinary = role == ORDINARY
    window = (role == BASE) | (role == DEEP) | ordinary

    # everyone sees the committed rows; committed rows among themselves are causal
    sees_ordinary = kj(ordinary) & (~qi(ordinary) | (kj(off) <= qi(off)))
    # window rows: base cells of columns <= own column, own column's deep cells up to own level
    sees_base = qi(window & ~ordinary) & kj(role == BASE) & (kj(col) <= qi(col))
    sees_deep = (qi(role == DEEP) & kj(role == DEEP) & (kj(col) == qi(col))
                 & (kj(level) <= qi(level)))
    # candidate rows: own candidate's earlier offsets
    is_cand = role == CAND
    sees_cand = qi(is_cand) & kj(is_cand) & (kj(cand) == qi(cand)) & (kj(off) <= qi(off))
    return sees_ordinary | sees_base | sees_deep | sees_cand


def pack(rnd: Round, past: int, dtype: torch.dtype, device: torch.device | str):
    """(input_ids [1,Q], position_ids [1,Q], 4-D additive mask [1,1,Q,past+Q], logit rows [K])."""
    rows = rnd.rows
    ids = torch.tensor([[r.token for r in rows]], dtype=torch.long)
    pos = torch.tensor([[r.pos for r in rows]], dtype=torch.long)
    vis = visibility(rows)
    mask = torch.zeros((1, 1, len(rows), past + len(rows)), dtype=dtype)
    mask[0, 0, :, past:].masked_fill_(~vis, torch.finfo(dtype).min)
    keep = torch.tensor(rnd.logit_rows, dtype=torch.long)
    return ids.to(device), pos.to(device), mask.to(device), keep.to(device)
