"""Exact sampling verification (DESIGN.md section 4).

The target distribution of a row is transformers' own: logits -> temperature
-> top-k -> top-p (the warpers `generate` uses, in its order), softmax in
float64. Candidates are tested as one-hot proposals in candidate order: a
proposal t is accepted with probability p(t); on rejection p(t) is set to 0
and p renormalised (the residual); when every distinct proposal is
rejected, the token is drawn from the residual. This is speculative
sampling with one-hot drafts, so each emitted token is distributed exactly
as plain sampling. After an accepted token only the candidates that carry it
survive, and the next offset reads a surviving candidate's row (they share
the prefix, so their rows agree). Candidates may differ in length: at each
offset only the survivors that reach it propose. When no survivor reaches
the next offset, its token is drawn from the last row.

Random numbers are a pure function of (seed, request, round, offset, draw),
never of which worker asks, so every LP rank makes the same offset-0
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


def group_by_first_token(candidates: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Stable regrouping: candidates sharing a first token become adjacent, groups in
    order of first appearance. The verifier's outcome does not change (it tests
    distinct first tokens in order of first appearance and keeps survivors' order)."""
    order = {}
    for c in candidates:
        order.setdefault(c[0], len(order))
    return sorted(candidates, key=lambda c: order[c[0]])   # sorted() is stable


def group_starts(candidates: Sequence[tuple[int, ...]]) -> list[int]:
    """Indices where a new first token starts, plus the end."""
    return [i for i in range(len(candidates)) if i == 0 or candidates[i][0] != candidates[i - 1][0]] \
        + [len(candidates)]


class Sampled(NamedTuple):
    emitted: list[int]     # hits accepted guess tokens, then one sampled token
    hits: int
    survivor: int          # index (in `candidates`) of a candidate carrying the accepted prefix, or -1


def verify_sampling(
    first: torch.Tensor,
    candidates: Sequence[Sequence[int]],
    row: Callable[[int, int], torch.Tensor],
    draws: Draws,
    round_: int,
    owned: Callable[[int], bool] = lambda c: True,
) -> Sampled:
    """Exact verification of `candidates` against the ordinary row's distribution
    `first`; `row(c, s)` is the distribution of candidate c's row at offset s.

    Offset 0 only needs `first` and the candidates' first tokens, so every LP
    rank can take it. Past offset 0 only candidates with `owned(c)` can be
    followed (an LP rank holds the rows of its own candidates); if the
    survivors are not owned here the round stops after the offset-0 token."""
    alive = list(range(len(candidates)))
    p, emitted, s = first, [], 0
    while True:
        # candidates may differ in length: only those that reach offset s propose there
        proposals = list(dict.fromkeys(candidates[c][s] for c in alive if len(candidates[c]) > s))
        token, accepted = try_proposals(p, proposals, lambda i: draws.uniform(round_, s, i))
        emitted.append(token)
        if not accepted:
            break
        alive = [c for c in alive if len(candidates[c]) > s and candidates[c][s] == token]
        if not owned(alive[0]):
            return Sampled(emitted, 0, -1)
        p = row(alive[0], s)
        s += 1
    hits = len(emitted) - 1
    return Sampled(emitted, hits, alive[0] if hits else -1)
