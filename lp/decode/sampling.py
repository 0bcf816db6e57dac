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


def warpers(temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    out = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k > 0:
        out.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p))
    return out


def distribution(logits: torch.Tensor, warp: LogitsProcessorList) -> torch.Tensor:
    """Sampling distribution(s) of logit row(s), float64 on the CPU."""
    scores = warp(None, logits.double().reshape(-1, logits.shape[-1]))
    return scores.softmax(-1).cpu().reshape(logits.shape)


class Draws:
    """Uniform [0, 1) numbers addressed by (round, offset, index) for one request."""

    def __init__(self, seed: int, request: str | int):
        self.key = f"{seed}/{request}".encode()

    def uniform(self, round_: int, offset: int, index: int) -> float:
        h = hashlib.blake2b(self.key + struct.pack("<3q", round_, offset, index), digest_size=8).digest()
        return (int.from_bytes(h, "little") >> 11) * 2.0 ** -53


def sample(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from a (possibly unnormalised) probability vector."""
    cdf = torch.cumsum(p, 0)
    i = int(torch.searchsorted(cdf, torch.tensor([u * cdf[-1].item()], dtype=cdf.dtype), right=True))
    return min(i, int(torch.nonzero(p).max()))   # rounding at the top end: the last possible token


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
