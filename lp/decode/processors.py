"""generate's score processors that lookahead applies exactly: the repetition penalty and the
min-new-tokens EOS hold-back (`generation.repetition_penalty`, `generation.min_new_tokens`).

Both change a row's scores by what came before the row's prediction, so each verified row gets its
own: z*'s row predicts the request's k-th new token (k committed so far) from the prompt and the
committed output; a tree node at depth d predicts token k + d from those and the tokens of its own
path, itself included. Applied to every row before the argmax (greedy) or the warpers (sampling),
the walk accepts a node exactly when plain decoding with the same processors would have produced
its token, so exactness holds as without them. The window's deepest cells (the rows whose argmax
feeds the pool) get the penalty of the request's tokens before the round: they only propose, but
guesses from raw logits would rarely match a penalised output.

- **Repetition penalty** (transformers' RepetitionPenaltyLogitsProcessor): a score s of a token
  the row's input holds becomes s * p when s < 0, else s / p. The request's tokens before the round
  live on the device as one presence row per request ([V + 1] bool: column V takes ids past the
  logits' V, which generate leaves out too), updated each round with the tokens committed since
  the last one (the round's upload carries them); a node row adds its path's tokens.
- **min_new_tokens**: the EOS ids' scores are -inf in a row predicting new token k + d <
  min_new_tokens (transformers' MinNewTokensLengthLogitsProcessor; MinLengthLogitsProcessor is the
  same with the prompt's length taken off).

Scores are processed in float32 as generate processes them, in its order: the penalty, then the
hold-back, then the sampling warpers. float64 logits stay float64, where generate casts them to
float32 first: as for lp's plain argmax, the two differ only at a near-tie below float32's
resolution.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lp.decode.params import GenerationParams
from lp.decode.request import RequestState, RoundPlan

FRESH_PAD = 1 << 62      # a `fresh` section's padding: clamped to the spare column V on the device


def penalize(scores: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty of every score (the processor applies it to held tokens only)."""
    return torch.where(scores < 0, scores * penalty, scores / penalty)


def process_rows(frame: torch.Tensor, deep: int, seen: torch.Tensor | None, tok: torch.Tensor,
                 ancestors: torch.Tensor, hold: torch.Tensor | None, eos: torch.Tensor | None,
                 penalty: float) -> torch.Tensor:
    """The processed scores of a round's frame, [n, D + 1 + N, V]: `frame` holds the window's `deep`
    (D) deepest cells, z*'s row, then the node frame's N rows; `seen` [n, V + 1] bool the tokens each
    request's input held before the round (None: no penalty); `tok` [n, N] the node frame's tokens
    (-1: PAD); `ancestors` [n, N, N] bool, (i, j) when node j is i or one of its ancestors; `hold`
    [n, 1 + N] bool the verified rows (z*'s, the nodes') whose `eos` ([V] bool) scores are held at
    -inf (None: none). The window's cells get the penalty of `seen` alone, and no hold-back."""
    scores = frame if frame.dtype in (torch.float32, torch.float64) else frame.float()
    out = scores
    if seen is not None:
        v = scores.shape[-1]
        hit = penalize(scores, penalty)
        out = torch.where(seen[:, None, :v], hit, scores)
        n, nodes = tok.shape
        if nodes:
            # a node row also holds its path's tokens: write each path token's column of the row,
            # penalised when the column is held (from before the round or on the path), else as it
            # was; every write to one (row, column) computes the same value (PAD and ids past V
            # write their clamped column's own value)
            col = tok.clamp(0, v - 1)
            valid = (tok >= 0) & (tok < v)
            same = ((col[:, :, None] == col[:, None, :]) & valid[:, :, None]).to(scores.dtype)
            held = (torch.bmm(ancestors.to(scores.dtype), same) > 0) | seen.gather(1, col)[:, None, :]
            index = col[:, None, :].expand(n, nodes, nodes)
            first = deep + 1
            rows = torch.where(held, hit[:, first:].gather(2, index), scores[:, first:].gather(2, index))
            out[:, first:].scatter_(2, index, rows)
    if hold is not None:
        out = out.clone() if out is frame else out      # never write the model's logits
        out[:, deep:].masked_fill_(hold[:, :, None] & eos, float("-inf"))
    return out


class Processors:
    """The repetition penalty and min_new_tokens of a decode: what a round uploads for them and
    their work on its frame. Each request keeps its tokens not yet on the device
    (`RequestState.unseen`) and its device presence row (`RequestState.seen`)."""

    def __init__(self, generation: GenerationParams, eos_token_ids: Sequence[int], device: torch.device):
        self.penalty = generation.repetition_penalty
        self.least = generation.min_new_tokens if eos_token_ids else 0
        self.eos_ids, self.device = list(eos_token_ids), device
        self.eos = None          # [V] bool, made at the first round (V: the logits')
        self.empty = None        # [V + 1] bool zeros: a request's presence before its first round

    @staticmethod
    def wanted(generation: GenerationParams, eos_token_ids: Sequence[int]) -> bool:
        return generation.repetition_penalty != 1.0 or (generation.min_new_tokens > 0 and bool(eos_token_ids))

    def sections(self, states: Sequence[RequestState], plans: Sequence[RoundPlan], nodes: int) -> dict[str, list[int]]:
        """The round's upload for them: per request the tokens committed since its last round
        ("fresh", padded alike) and which of its verified rows hold EOS back ("hold": z*'s row,
        then the node frame's; none once every request has min_new_tokens)."""
        out: dict[str, list[int]] = {}
        if self.penalty != 1.0:
            width = max(1, *(len(s.unseen) for s in states))
            out["fresh"] = [t for s in states for t in [*s.unseen, *[FRESH_PAD] * (width - len(s.unseen))]]
        if any(s.generated < self.least for s in states):
            out["hold"] = []
            for state, plan in zip(states, plans):
                k, depths = state.generated, plan.tree.depths
                out["hold"] += [int(k + d < self.least) for d in [0, *(depths[u] for u in plan.nodes)]]
                out["hold"] += [0] * (nodes - len(plan.nodes))
        return out

    def apply(self, frame: torch.Tensor, deep: int, states: Sequence[RequestState], dev: dict[str, torch.Tensor],
              tok: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """The round's `frame` processed (process_rows), each request's presence brought up to date
        first with its fresh tokens (they leave the host's `unseen`)."""
        n, v = frame.shape[0], frame.shape[-1]
        seen = hold = eos = None
        if self.penalty != 1.0:
            if self.empty is None:
                self.empty = torch.zeros(v + 1, dtype=torch.bool, device=self.device)
            seen = torch.stack([s.seen if s.seen is not None else self.empty for s in states])
            seen.scatter_(1, dev["fresh"].view(n, -1).clamp(max=v), True)
            for i, state in enumerate(states):
                state.seen, state.unseen = seen[i], []
        if "hold" in dev:
            if self.eos is None:        # filled id by id: a few fills once, no copy from the host
                self.eos = torch.zeros(v, dtype=torch.bool, device=self.device)
                for t in self.eos_ids:
                    if 0 <= t < v:
                        self.eos[t] = True
            hold, eos = dev["hold"].view(n, -1).bool(), self.eos
        return process_rows(frame, deep, seen, tok, ancestors, hold, eos, self.penalty)
