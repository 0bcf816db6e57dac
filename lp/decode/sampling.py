"""Exact sampling verification (DESIGN.md section 4).

The target distribution of a row is transformers' own: logits (after the
repetition penalty, bans and EOS hold-back, lp/decode/processors.py) ->
temperature -> top-h -> top-k -> top-p -> min-p -> typical -> epsilon -> eta
(the warpers `generate` uses, in its order; each reads its row alone),
softmax in float64. The candidates form a token tree (lp/decode/tree.py). Starting at
the root (the ordinary row's distribution p), a node's children are tested
in child order as one-hot proposals: child c is accepted with probability
p(g_c); on rejection p(g_c) is set to 0 and p renormalised (the residual);
when every child is rejected, the token is drawn from the residual and the
round ends. This is speculative sampling with one-hot drafts, so each
emitted token is distributed exactly as plain sampling. After an
acceptance the walk continues at the accepted child with its own row's
distribution; a node without children draws the next token from its row.

lp runs those tests with one draw per row: the row's token t is drawn from p
(inverse CDF), and child c is accepted when t is c's token. Given that the
children before c were rejected (t is none of theirs), t is distributed as
the residual p renormalised without them, so t = g_c with exactly the
probability the test accepts c; when every child is rejected, t is a draw
from the final residual. Each test, each rejection and each residual draw
thus has the probability the design gives it, child order changes no
outcome, and the walk is greedy's with the row's draw in the place of its
argmax (on the device: lp.decode.verify.node_mismatch on the drawn tokens).

Random numbers are a pure function of (seed, request, position): the k-th
new token of a request is always drawn with the same u_k, whichever round,
tree row or worker draws it. A row at depth d of a round that starts at new
token k predicts token k + d, so it draws u_(k+d). Every emitted token is
therefore the inverse-CDF draw of u_k from the model's distribution after
the tokens before it, as a plain sampling loop with the same draws
(`sample` at each step) would give: the output of a seed depends on neither
the trees nor the window, the batch, the row budget or the world size, and
every LP rank makes the same root-level decision.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, NamedTuple, Sequence

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from lp.decode.params import GenerationParams
from lp.decode.tree import TokenTree
from lp.decode.verify import node_mismatch


def warpers(generation: GenerationParams, device: torch.device | str = "cpu") -> LogitsProcessorList:
    """transformers' sampling warpers of `generation` (sampling: temperature > 0) in generate's order
    (lp.decode.params.WARPER_KEYS), each where generate builds it: temperature, then top_h, top_k, top_p,
    min_p, typical_p, epsilon_cutoff and eta_cutoff where they are not off."""
    g = generation
    out = LogitsProcessorList([TemperatureLogitsWarper(g.temperature)])
    if g.top_h > 0.0:
        out.append(TopHLogitsWarper(g.top_h))
    if g.top_k > 0:
        out.append(TopKLogitsWarper(g.top_k))
    if g.top_p < 1.0:
        out.append(TopPLogitsWarper(g.top_p))
    if g.min_p > 0.0:
        out.append(MinPLogitsWarper(g.min_p))
    if g.typical_p < 1.0:
        out.append(TypicalLogitsWarper(g.typical_p))
    if g.epsilon_cutoff > 0.0:
        out.append(EpsilonLogitsWarper(g.epsilon_cutoff))
    if g.eta_cutoff > 0.0:
        out.append(EtaLogitsWarper(g.eta_cutoff, device=device))
    return out


def distribution(logits: torch.Tensor, warp: LogitsProcessorList) -> torch.Tensor:
    """Sampling distribution(s) of logit row(s), float64, on the logits' device."""
    scores = warp(None, logits.double().reshape(-1, logits.shape[-1]))
    return scores.softmax(-1).reshape(logits.shape)


class NoDistribution(RuntimeError):
    """A request's processed scores leave no token to draw (they hold NaN or +inf, or every token is
    banned): generate fails there too. The request ends with it; the others decode on."""

    def __init__(self, position: int):
        super().__init__(f"sampling has no distribution to draw new token {position} from (its processed scores "
                         f"hold NaN or inf, or every token is banned); generate fails here too: probability tensor "
                         f"contains either inf, nan or element < 0")


class Draws:
    """Uniform [0, 1) numbers addressed by position for one request: the draw of the request's k-th
    new token (k from 0) is u_k, whichever round, row or rank draws it."""

    def __init__(self, seed: int, request: str | int):
        self.key = f"{seed}/{request}".encode()

    def bits(self, position: int) -> int:
        """u_position as a 53-bit integer."""
        h = hashlib.blake2b(self.key + struct.pack("<q", position), digest_size=8).digest()
        return int.from_bytes(h, "little") >> 11

    def uniform(self, position: int) -> float:
        """u_position as a number in [0, 1) (53 bits: exact in a double)."""
        return self.bits(position) * 2.0 ** -53

    def words(self, start: int, depths: Sequence[int]) -> list[int]:
        """Each row's draw, u_(start + its depth), as the device walk reads it: 1 - u, a double in
        (0, 1] (exact for a 53-bit u), written as the int64 word holding its bits, so that it travels in
        the round's one int64 upload and the device reads it back as float64 by a view, with no op."""
        rest = [1.0 - self.uniform(start + d) for d in depths]
        return list(struct.unpack(f"<{len(rest)}q", struct.pack(f"<{len(rest)}d", *rest)))


def draw(cdf: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws on (unnormalised) cdfs [..., V]: `rest` [..., 1] is each row's 1 - u, in
    (0, 1]; the token is the first whose cdf reaches rest x the total, a point in (0, total] (the
    product never rounds above the total), so it always has positive probability, at either end. A
    row whose total is NaN (its scores held NaN or +inf, or were all -inf) draws V, no token: the
    engine refuses it. Returns [..., 1]."""
    return torch.searchsorted(cdf, rest * cdf[..., -1:])


def sample(p: torch.Tensor, u: float) -> int:
    """The token of a (possibly unnormalised) probability vector for the uniform draw `u` in [0, 1):
    the device walk's rule (`draw`), on one row."""
    return int(draw(torch.cumsum(p, 0), torch.tensor([1.0 - u], dtype=p.dtype)))


def try_proposals(p: torch.Tensor, proposals: Sequence[int], u: float) -> tuple[int, bool]:
    """One offset: (token, accepted). The distinct `proposals` are tested in order as one-hot drafts,
    with the residual drawn when all are rejected, by one draw `u` from `p`: the token is accepted
    when it is one of the proposals (the module's docstring says why that is the test)."""
    token = sample(p, u)
    return token, token in proposals

class Sampled(NamedTuple):
    emitted: list[int]     # hits accepted node tokens, then one sampled token
    hits: int
    node: int              # the deepest accepted node, or -1


def verify_tree_sampling(
    first: torch.Tensor,
    tree: TokenTree,
    row: Callable[[int], torch.Tensor],
    draws: Draws,
    start: int,
    owned: Callable[[int], bool] = lambda u: True,
) -> Sampled:
    """Exact verification of `tree` against the ordinary row's distribution
    `first`; `row(u)` is the distribution of node u's row; `start` is the
    position (new tokens so far) of the round's first token.

    The root's children need only `first` and their tokens, so every LP rank
    takes that decision. Below it only nodes with `owned(u)` can be followed (an
    LP rank holds the rows of its own subtrees); when the accepted child is not
    owned here the round stops after its token (its owner continues)."""
    kids = children_lists(tree)
    p, emitted, node, depth = first, [], -1, 0
    while True:
        options = kids.get(node, [])
        token, accepted = try_proposals(p, [tree.tokens[u] for u in options], draws.uniform(start + depth))
        emitted.append(token)
        if not accepted:            # every child rejected: the token is the residual's draw
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


def tree_sampling_verdict(dists: torch.Tensor, node_tokens: torch.Tensor, parent_rows: torch.Tensor,
                          ancestors: torch.Tensor, rest: torch.Tensor):
    """The walk of `verify_tree_sampling`, on the device for every request of a round and every row
    at once, no host read, in three ops and greedy's path ops whatever the trees and the batch.

    For request b, row 0 is the root (the ordinary row), row 1 + j this rank's local node j (PAD
    nodes after its own). `dists` [B, R, V] are the rows' warped distributions, `rest` [B, R] each
    row's draw as 1 - u (Draws.words, read as float64), `node_tokens` / `parent_rows` [B, N] each
    node's token (PAD: -1) and parent row (0: the root), `ancestors` [B, N, N]. Every row draws its
    token; node j is on the accepted path when every node from the root to it carries its parent
    row's token (siblings' tokens are distinct; PAD is -1, never drawn). Returns (first token [B],
    off the accepted path [B, N] bool, emitted [B, N]: what each node emits after itself)."""
    token = draw(dists.cumsum(-1), rest[..., None])[..., 0]
    off_path = node_mismatch(token, node_tokens, parent_rows, ancestors)
    return token[:, 0], off_path, token[:, 1:]
