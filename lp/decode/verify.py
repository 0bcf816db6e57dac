"""Greedy verification of a token tree (DESIGN.md section 8) and the round decision (section 5).

Each worker verifies its own nodes on the device (`tree_verdict`) and packs a
fixed-size payload; `decide` turns the gathered payloads of all workers into
the round's outcome on the host. With one worker the same two functions run,
so the single-worker engine is the P = 1 case of LP.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from lp.decode.layout import subtree_ancestors
from lp.decode.tree import TokenTree

HEADER = 5   # payload: z*, best hits, deepest accepted node (global index), deepest-output count, rows fed


def tree_tensors(tree: TokenTree, nodes: range, device) -> tuple[torch.Tensor, ...]:
    """The nodes of `tree` in `nodes` (whole root subtrees) as tensors on `device`: tokens,
    parents (local indices, -1: the root), depths, and the ancestor-or-self matrix (tests and
    measurements; the engine takes the same from the round's uploaded descriptors)."""
    first = nodes.start
    parents = torch.tensor([tree.parents[u] - first if tree.parents[u] >= 0 else -1 for u in nodes],
                           dtype=torch.long)
    ends = tree.subtree_ends()
    anc = subtree_ancestors(torch.tensor([ends[u] - first for u in nodes], dtype=torch.long))
    tokens = torch.tensor([tree.tokens[u] for u in nodes], dtype=torch.long)
    depths = torch.tensor([tree.depths[u] for u in nodes], dtype=torch.long)
    return tokens.to(device), parents.to(device), depths.to(device), anc.to(device)


def tree_hits(next_token: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
              predictions: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """Whether each node is on the accepted path, [B] bool.

    A node matches when its token is what its parent's row predicts (z*, the
    ordinary row's argmax, for a child of the root); it is accepted when it and
    all its ancestors match. `parents` are node indices (-1: the root),
    `ancestors[i, j]` is True when j is i or an ancestor of i. Children carry
    distinct tokens, so the accepted nodes form one path from the root."""
    expected = torch.where(parents < 0, next_token, predictions[parents.clamp(min=0)])
    match = tokens == expected
    return ~(ancestors & ~match[None, :]).any(dim=1)


def tree_verdict(next_token: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                 ancestors: torch.Tensor, predictions: torch.Tensor, first_node: int,
                 width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(head [z*, hits, deepest accepted node's global index], the tokens emitted after z*
    padded to `width`, the accepted path's local node indices by depth padded to `width`),
    on the device, without a host sync."""
    accepted = tree_hits(next_token, tokens, parents, predictions, ancestors)
    return path_verdict(next_token, accepted, depths, predictions, first_node, width)


def path_verdict(first: torch.Tensor, accepted: torch.Tensor, depths: torch.Tensor, emitted: torch.Tensor,
                 first_node: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdict of an accepted path (a set of nodes, one per depth from 1, `accepted`):
    head [first token, hits, deepest node's global index], what each path node emits
    (`emitted[node]`) at its depth, and the path's local node indices by depth."""
    device = first.device
    if depths.numel() == 0:
        zero = torch.zeros_like(first)
        none = torch.zeros(width, dtype=torch.long, device=device)
        return torch.stack([first, zero, zero]), none, none
    reached = torch.where(accepted, depths, 0)
    hits, best = reached.max(dim=0)
    slot = torch.where(accepted, depths - 1, width)   # off-path nodes go to a spare slot
    spare = torch.zeros(width + 1, dtype=torch.long, device=device)
    after = spare.scatter(0, slot, emitted)[:width]
    path = spare.scatter(0, slot, torch.arange(depths.numel(), device=device))[:width]
    return torch.stack([first, hits, best + first_node]), after, path


def pack_payload(head: torch.Tensor, emitted_after: torch.Tensor, deepest: torch.Tensor,
                 deep_slots: int, rows: int) -> torch.Tensor:
    """One worker's fixed-size int64 payload: [z, hits, node index, deepest count,
    rows this worker fed to its forward, `width` tokens emitted after z (the first
    `hits` are valid), deepest outputs padded to `deep_slots`]."""
    device = deepest.device
    count = torch.full((1,), deepest.numel(), dtype=torch.long, device=device)   # fills, not copies
    fed = torch.full((1,), rows, dtype=torch.long, device=device)
    pad = torch.full((deep_slots - deepest.numel(),), -1, dtype=torch.long, device=device)
    return torch.cat([head, count, fed, emitted_after, deepest, pad])


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
