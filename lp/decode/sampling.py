"""Exact sampling verification (DESIGN.md section 4).

The target distribution of a row is transformers' own: logits -> temperature
-> top-k -> top-p (the warpers `generate` uses, in its order), softmax in
float64. The candidates form a token tree (lp/decode/tree.py). Starting at
the root (the ordinary row's distribution p), a node's children are tested
in child order as one-hot proposals: child c is accepted with probability
p(g_c); on rejection p(g_c) is set to 0 and p renormalised (the residual);
when every child is rejected, the token is drawn from the residual and the
round ends. This is speculative sampling with one-hot drafts, so each
emitted token is distributed exactly as plain sampling. After an
acceptance the walk continues at the accepted child with its own row's
distribution; a node without children draws the next token from its row.

Random numbers are a pure function of (seed, request, round, depth, draw),
never of which worker asks, so every LP rank makes the same root-level
decision and a seed gives the same output at every world size.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, NamedTuple, Sequence

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lp.decode.tree import TokenTree
from lp.decode.verify import node_mismatch


def warpers(temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    out = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k > 0:
        out.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p))
    return out


def distribution(logits: torch.Tensor, warp: LogitsProcessorList) -> torch.Tensor:
    """Sampling distribution(s) of logit row(s), float64, on the logits' device."""
    scores = warp(None, logits.double().reshape(-1, logits.shape[-1]))
    return scores.softmax(-1).reshape(logits.shape)


class Draws:
    """Uniform [0, 1) numbers addressed by (round, depth, index) for one request."""

    def __init__(self, seed: int, request: str | int):
        self.key = f"{seed}/{request}".encode()

    def bits(self, round_: int, depth: int, index: int) -> int:
        """The draw as a 53-bit integer (exact in an int64 upload)."""
        h = hashlib.blake2b(self.key + struct.pack("<3q", round_, depth, index), digest_size=8).digest()
        return int.from_bytes(h, "little") >> 11

    def uniform(self, round_: int, depth: int, index: int) -> float:
        return self.bits(round_, depth, index) * 2.0 ** -53

    def table(self, round_: int, depths: int, width: int) -> list[int]:
        """bits for depth 0..depths-1 and index 0..width-1, row by row (a round's upload)."""
        return [self.bits(round_, d, i) for d in range(depths) for i in range(width)]


def draw_target(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Where the inverse-CDF draw of `u` in [0, 1) lands on the (unnormalised) `cdf` [..., V]: (1 - u) x
    the total, in (0, total] (1 - u is exact for a 53-bit u, and the product never rounds above the
    total), so the first slot whose cdf reaches it (searchsorted, left) holds a token of positive
    probability: never a zero-probability token at either end."""
    return (1.0 - u) * cdf[..., -1:]


def sample(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from a (possibly unnormalised) probability vector (the device walk's rule)."""
    cdf = torch.cumsum(p, 0)
    return int(torch.searchsorted(cdf, draw_target(cdf, torch.tensor([u], dtype=cdf.dtype))))


def try_proposals(p: torch.Tensor, proposals: Sequence[int], uniform: Callable[[int], float]) -> tuple[int, bool]:
    """One offset: (token, accepted). Proposals are tested in order; the residual
    is sampled with draw index len(proposals)."""
    p = p.clone()
    for i, token in enumerate(proposals):
        total = p.sum().item()
        if uniform(i) * total < p[token].item():
            return token, True
        p[token] = 0.0
    return sample(p, uniform(len(proposals))), False


class Sampled(NamedTuple):
    emitted: list[int]     # hits accepted node tokens, then one sampled token
    hits: int
    node: int              # the deepest accepted node, or -1


def verify_tree_sampling(
    first: torch.Tensor,
    tree: TokenTree,
    row: Callable[[int], torch.Tensor],
    draws: Draws,
    round_: int,
    owned: Callable[[int], bool] = lambda u: True,
) -> Sampled:
    """Exact verification of `tree` against the ordinary row's distribution
    `first`; `row(u)` is the distribution of node u's row.

    The root's children need only `first` and their tokens, so every LP rank
    takes that decision. Below it only nodes with `owned(u)` can be followed (an
    LP rank holds the rows of its own subtrees); when the accepted child is not
    owned here the round stops after its token (its owner continues)."""
    kids = children_lists(tree)
    p, emitted, node, depth = first, [], -1, 0
    while True:
        options = kids.get(node, [])
        token, accepted = try_proposals(p, [tree.tokens[u] for u in options],
                                        lambda i: draws.uniform(round_, depth, i))
        emitted.append(token)
        if not accepted:
            break
        node = next(u for u in options if tree.tokens[u] == token)
        if not owned(node):
            return Sampled(emitted, 0, -1)
        p = row(node)
        depth += 1
    return Sampled(emitted, len(emitted) - 1, node)


def children_lists(tree: TokenTree) -> dict[int, list[int]]:
    """node (-1: the root) -> its children in child order (storage order)."""
    out: dict[int, list[int]] = {}
    for u, parent in enumerate(tree.parents):
        out.setdefault(parent, []).append(u)
    return out


def tree_sampling_verdict(dists: torch.Tensor, child_tokens: torch.Tensor, child_index: torch.Tensor,
                          child_count: torch.Tensor, node_tokens: torch.Tensor, parent_rows: torch.Tensor,
                          ancestors: torch.Tensor, uniforms: torch.Tensor):
    """The walk of `verify_tree_sampling`, on the device for every request of a round and every row
    at once, no host read, in a fixed two dozen ops whatever the trees' width and depth and the batch.

    For request b, row 0 is the root (the ordinary row), row 1 + j this rank's local node j (PAD
    nodes after its own: no children, never accepted). `dists` [B, R, V] are the rows' warped
    distributions; `child_tokens` / `child_index` [B, R, M] each row's children in child order
    (token, -1 for padding; the token with padding repeating the first child, 0 without children),
    `child_count` [B, R], `node_tokens` / `parent_rows` [B, N] each node's token (PAD: -1) and parent
    row (0: the root), `ancestors` [B, N, N] and `uniforms` [B, R, M + 1] each row's draws (its
    depth's, by index). Every row tests its children as one-hot proposals with its own draws and
    samples its residual; the walk is then the chain of accepted children from the root, found as
    greedy's accepted path is (lp.decode.verify.node_mismatch, with each row's emitted token in the
    place of its argmax). Returns (first token [B], off the accepted path [B, N] bool, emitted
    [B, N]: what each node emits after itself)."""
    m = child_tokens.shape[-1]
    # Child i is tested against the residual left by rejecting children 0..i-1: their mass is gone
    # from the total (children's tokens are distinct), so every test is one [B, R, M] compare.
    valid = child_tokens >= 0
    pt = torch.where(valid, dists.gather(-1, child_index), 0.0)
    left = dists.sum(-1, keepdim=True) - pt.cumsum(-1) + pt
    accept = valid & (uniforms[..., :m] * left < pt)
    chosen = child_index.gather(-1, accept.to(torch.uint8).argmax(-1, keepdim=True))[..., 0]  # the first accepted
    # every child rejected: the residual (each child's mass taken off exactly; padding takes off 0)
    cdf = dists.scatter_add(-1, child_index, pt.neg()).cumsum(-1)
    drawn = torch.searchsorted(cdf, draw_target(cdf, uniforms.gather(-1, child_count[..., None])))[..., 0]
    token = torch.where(accept.any(-1), chosen, drawn)
    # node j is on the path when every node from the root to it is its parent row's emitted token: an
    # accepted child (siblings' tokens are distinct; a residual draw is none of them; PAD is -1)
    off_path = node_mismatch(token, node_tokens, parent_rows, ancestors)
    return token[:, 0], off_path, token[:, 1:]
