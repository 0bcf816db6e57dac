"""Greedy verification (DESIGN.md section 4) and the round decision (section 5).

Each worker verifies its own candidates on the device (`greedy_hits`) and
packs a fixed-size payload; `decide` turns the gathered payloads of all
workers into the round's outcome on the host. With one worker the same two
functions run, so the single-worker engine is the P = 1 case of LP.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

HEADER = 5   # payload: z*, best hits, best global candidate index, deepest-output count, rows fed


def padded(rows: Sequence[Sequence[int]], width: int, fill: int) -> torch.Tensor:
    """[len(rows), width] int64 tensor of rows of different lengths, padded with `fill`."""
    flat = [t for row in rows for t in (*row, *(fill,) * (width - len(row)))]
    return torch.tensor(flat, dtype=torch.long).view(len(rows), width)


def greedy_hits(next_token: torch.Tensor, guesses: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
    """Accepted guess tokens per candidate, [C].

    Candidate c matches a tokens when g_1 = z* (the ordinary row's argmax) and
    g_{s+1} = predictions[c, s-1] for s < a; `predictions[c, s]` is the argmax of
    candidate c's row at offset s. Candidates shorter than the tensor's width are
    padded with -1, which matches no prediction."""
    ok = torch.cat([guesses[:, :1] == next_token, guesses[:, 1:] == predictions[:, :-1]], dim=1)
    return ok.long().cumprod(dim=1).sum(dim=1)


def greedy_verdict(next_token: torch.Tensor, guesses: torch.Tensor, predictions: torch.Tensor,
                   first_candidate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(head [z*, hits, global index], the best candidate's predictions [width]), on the device."""
    if guesses.shape[0]:
        hits = greedy_hits(next_token, guesses, predictions)
        best = hits.argmax()                    # first maximum: ties go to the lowest index
        return torch.stack([next_token, hits[best], best + first_candidate]), predictions[best]
    zero = torch.zeros_like(next_token)
    return torch.stack([next_token, zero, zero]), torch.zeros(guesses.shape[1], dtype=torch.long,
                                                              device=next_token.device)


def pack_payload(head: torch.Tensor, emitted_after: torch.Tensor, deepest: torch.Tensor,
                 deep_slots: int, rows: int) -> torch.Tensor:
    """One worker's fixed-size int64 payload: [z, hits, global candidate index,
    deepest count, rows this worker fed to its forward, `width` tokens emitted
    after z (the first `hits` are valid), deepest outputs padded to `deep_slots`]."""
    device = deepest.device
    count = torch.tensor([deepest.numel(), rows], dtype=torch.long, device=device)
    pad = torch.full((deep_slots - deepest.numel(),), -1, dtype=torch.long, device=device)
    return torch.cat([head.to(device), count, emitted_after.to(device), deepest, pad])


class Decision(NamedTuple):
    emitted: list[int]      # z* then the winner's predictions: hits + 1 tokens
    hits: int
    candidate: int          # global index of the winning candidate (-1: none)
    deepest: list[int]      # deepest-level outputs of the whole window, in column order
    rows: list[int]         # rows each worker fed to its forward, in rank order


def decide(payloads: Sequence[Sequence[int]], width: int) -> Decision:
    """The round's outcome, identical on every worker.

    Rank 0's z* is authoritative (a worker whose z* differs counts as no hit);
    the longest hit wins; ties go to the lowest global candidate index."""
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
