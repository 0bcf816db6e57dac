"""Greedy verification of a token tree (DESIGN.md section 8) and the round decision (section 5).

Each worker verifies its own nodes on the device, every request of a round at
once (`node_mismatch`, `path_verdicts`: a node frame per request, lp/decode/batch.py),
and packs a fixed-size payload per request (`pack_payloads`); `decide` turns
the gathered payloads of all workers into a request's outcome on the host. With one worker the same two functions run,
so the single-worker engine is the P = 1 case of LP.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from lp.decode.tree import TokenTree

HEADER = 5   # payload: z*, best hits, deepest accepted node (global index), deepest-output count, rows fed


def node_frame(tree: TokenTree, nodes: range, size: int, width: int, ends: bool = False) -> dict[str, list[int]]:
    """The node frame of one request's round on this rank: `nodes` of `tree` (whole root subtrees,
    in preorder), then PAD entries up to `size`, as int lists: "tok" (-1: PAD, never equal to a
    prediction), "par" (the parent's index in [z*, nodes...]: 0 for a child of the root), "depth"
    (0: PAD), "step" (depth - 1: the payload slot it emits into; PAD: `width`, a spare), and with
    `ends` "end" (the local index just past its subtree: j is i's ancestor or i when j <= i < end(j);
    the engine reads ancestors off the round's mask instead)."""
    first, stop, pads = nodes.start, nodes.stop, size - len(nodes)
    depths = tree.depths[first:stop]
    frame = {"tok": [*tree.tokens[first:stop], *[-1] * pads],
             "par": [p - first + 1 if p >= 0 else 0 for p in tree.parents[first:stop]] + [0] * pads,
             "depth": [*depths, *[0] * pads],
             "step": [d - 1 for d in depths] + [width] * pads}
    if ends:
        frame["end"] = [e - first for e in tree.subtree_ends()[first:stop]] + list(range(len(nodes) + 1, size + 1))
    return frame


def frame_ancestors(end: torch.Tensor) -> torch.Tensor:
    """[..., N, N] bool from a node frame's subtree ends [..., N]: (i, j) when j <= i < end(j), i.e. j
    is node i itself or one of its ancestors (the engine reads the same off the round's mask)."""
    index = torch.arange(end.shape[-1], device=end.device)
    return (index[None, :] <= index[:, None]) & (index[:, None] < end[..., None, :])


def greedy_ids(scores: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dim, as generate's greedy step takes it: the first maximum (a NaN counts
    as the maximum). On the CPU `max`'s indices are the same at about 2.5x argmax's speed (a round's
    frame is tens of rows of the whole vocabulary); elsewhere argmax itself."""
    return scores.max(-1).indices if scores.device.type == "cpu" else scores.argmax(-1)


def node_mismatch(frame: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  ancestors: torch.Tensor) -> torch.Tensor:
    """Which node-frame entries are off the accepted path, [B, N] bool, for B requests at once.

    `frame` [B, 1 + N] is z* (the ordinary row's argmax) then each node's prediction; a node
    matches when its token is what its parent's row predicts (`parents`: index into `frame`); it
    is accepted when it and all its ancestors match (`ancestors[b, i, j]`: j is i or an ancestor
    of i). Children carry distinct tokens, so the accepted nodes form one path from the root."""
    wrong = tokens != frame.gather(1, parents)
    return (ancestors & wrong[:, None, :]).any(dim=2)


def path_verdicts(first: torch.Tensor, off_path: torch.Tensor, emitted: torch.Tensor, depths: torch.Tensor,
                  steps: torch.Tensor, first_node: torch.Tensor, width: int,
                  zeros: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdicts of B requests' accepted paths (one node per depth from 1: the node-frame entries
    not `off_path` [B, N]): (hits [B], the deepest accepted node's index in the tree [B], what each
    path node emits (`emitted` [B, N]) by depth [B, width] (the first `hits` valid), each entry's
    payload slot [B, N]: its depth - 1 on the path, the spare `width` off it), on the device.
    `zeros`: a preallocated int64 zero tensor of at least [B, width + 1] (never written)."""
    b = first.shape[0]
    spare = (zeros[:b, :width + 1] if zeros is not None else
             torch.zeros(b, width + 1, dtype=torch.long, device=first.device))
    if depths.shape[1] == 0:            # no nodes on this rank
        return spare[:, 0], spare[:, 0], spare[:, :width], steps
    hits, best = depths.masked_fill(off_path, 0).max(dim=1)
    slot = steps.masked_fill(off_path, width)
    return hits, best + first_node, spare.scatter(1, slot, emitted)[:, :width], slot


def pack_payloads(first: torch.Tensor, hits: torch.Tensor, node: torch.Tensor, counts: torch.Tensor,
                  after: torch.Tensor, deepest: torch.Tensor, deep_slots: int,
                  filler: torch.Tensor | None = None) -> torch.Tensor:
    """Each request's fixed-size int64 payload on this worker, [B, HEADER + width + deep_slots]:
    [z, hits, node index, deepest count, rows this worker fed to its forward (`counts` [B, 2]),
    `width` tokens emitted after z (the first `hits` valid), deepest outputs (the first `count`
    valid; the rest padding, -1)]. `filler`: a preallocated int64 tensor of -1 of at least
    [B, deep_slots] (never written), so that the padding costs no op."""
    b, pad = first.shape[0], deep_slots - deepest.shape[1]
    filler = (filler[:b, :pad] if filler is not None else
              torch.full((b, pad), -1, dtype=torch.long, device=first.device))
    return torch.cat([first[:, None], hits[:, None], node[:, None], counts, after, deepest, filler], dim=1)


class Decision(NamedTuple):
    emitted: list[int]      # z* then the predictions along the accepted path: hits + 1 tokens
    hits: int
    node: int               # global index of the deepest accepted node (-1: none)
    deepest: list[int]      # deepest-level outputs of the whole window, in column order
    rows: list[int]         # rows each worker fed to its forward, in rank order


def decide(payloads: Sequence[Sequence[int]], width: int) -> Decision:
    """The round's outcome, identical on every worker.

    Rank 0's z* is authoritative (a worker whose z* differs counts as no hit);
    the longest hit wins (root subtrees live on one rank each and start with
    distinct tokens, so at most one rank hits); ties go to the lowest node index."""
    z = payloads[0][0]
    best = None
    for row in payloads:
        mine, hits, index = row[0], row[1], row[2]
        if mine != z or hits == 0:
            continue
        if best is None or (hits, -index) > (best[1], -best[2]):
            best = row
    deepest = [t for row in payloads for t in row[HEADER + width:HEADER + width + row[3]]]
    rows = [row[4] for row in payloads]
    if best is None:
        return Decision([z], 0, -1, deepest, rows)
    hits = best[1]
    return Decision([z] + list(best[HEADER:HEADER + hits]), hits, best[2], deepest, rows)
