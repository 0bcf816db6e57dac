"""Packing the rounds of several requests into one forward.

A batched round has a batch dimension: request b's rows are batch row b,
padded with PAD rows to the round's Q (the most rows any request feeds), each
request's K/V in its own cache row, so a row attends over its own request's
cached positions only and rows of different requests never meet. The other
layout, every request's rows packed into one batch row over one long cache
with a block-diagonal mask, needs no padding but makes every row attend over
the whole batch's cache: its attention cost grows with the batch, ours with
each request's own length.

transformers computes logits for the same row indices in every batch row
(`logits_to_keep`), so each request's rows are fed in an order that puts the
rows needing logits last: the forward keeps the last K rows (K, the most any
request needs) and request b reads the last K_b of them, in its round's logit
order. Rows can be fed in any order: each goes to its own cache slot (slot =
the request's past + the row's index in its round) and the mask is built in
the fed order. One request alone keeps today's order and its list of logit
rows, so a batch of one runs the single-request round unchanged.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lp.decode.kv_cache import RoundCache, forward_logits
from lp.decode.layout import FIELDS, bucket, descriptors, round_mask
from lp.decode.request import RoundPlan


def pack_round(plans: Sequence[RoundPlan], pasts: Sequence[int], rows: Sequence[int], q: int,
               fixed: bool) -> tuple[dict[str, list[int]], int]:
    """(sections for one upload, K: logit rows the forward keeps per request) for the plans of a round
    padded to `q` rows each; `pasts` are the requests' committed cache slots, `rows` their cache rows.
    `fixed` (compiled rounds): K and the one request's logit list are padded to few sizes.

    Sections: the FIELDS of every request's descriptors (request after request, q each), "past" and
    "rows" (one per request), and either "keep" (one request: its logit rows) or "order" (several: the
    round row fed at each of the q positions)."""
    sections: dict[str, list[int]] = {name: [] for name in FIELDS}
    for plan in plans:
        for name, values in descriptors(plan.rnd, q).items():
            sections[name] += values
    sections["past"], sections["rows"] = list(pasts), list(rows)
    if len(plans) == 1:
        keep = plans[0].rnd.logit_rows
        sections["keep"] = keep + keep[-1:] * ((q if fixed else len(keep)) - len(keep))
        return sections, len(sections["keep"])
    k = max(len(p.rnd.logit_rows) for p in plans)
    k = min(bucket(k), q) if fixed else k
    order: list[int] = []
    for plan in plans:
        keep = plan.rnd.logit_rows
        chosen = set(keep)
        order += [i for i in range(q) if i not in chosen] + keep
    sections["order"] = order
    return sections, k


def forward_round(model, dev: dict[str, torch.Tensor], n: int, q: int, k: int, past: int, first_row: int,
                  cache: RoundCache, kinds=None, compiled=None, span: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over a packed round of `n` requests in cache rows [first_row, first_row + n)
    (`dev`: the uploaded sections of pack_round, q rows per request, K logit rows kept; `past`: the
    one request's committed slots, read from "past" on the device for several): (logits [n, K, V]
    in each request's logit order as pack_round lays them out, each request's visibility among its
    rows [n, q, q]). Attention reads the first `span` slots of each cache row (default: all), which
    must hold every request's committed slots and round."""
    rows = {name: dev[name].view(n, q) for name in FIELDS}
    span = span or cache.length
    if n == 1:
        mask = round_mask({f: v[0] for f, v in rows.items()}, past, span, model.dtype, kinds)
        ids, pos, keep = rows["ids"], rows["pos"], dev["keep"]
        slots = torch.arange(past, past + q, device=ids.device)
    else:
        order = dev["order"].view(n, q)
        mask = round_mask(rows, dev["past"], span, model.dtype, kinds, order)
        ids, pos, keep = rows["ids"].gather(1, order), rows["pos"].gather(1, order), k
        slots = dev["past"][:, None] + order
    cache.rows = None if cache.batch == 1 else slice(first_row, first_row + n)
    logits = forward_logits(model, ids, pos, mask.attention, cache, keep, slots, compiled)
    return (logits[None] if n == 1 else logits), (mask.visible[None] if n == 1 else mask.visible)
