"""Lookahead decoding: the whole decode loop in one function.

Each round is ONE forward over: the ordinary rows (committed tokens not yet in
the cache; the whole prompt in the first round, so prefill is a round too),
the Jacobi window, and the round's token tree: every candidate source (pool
suffixes, lookup spans, suffix drafts from this request and the job's earlier
completions; lp/decode/propose.py) merged into one trie rooted after the last
committed token. The round commits z* plus the tokens along the deepest
accepted tree path plus the target's next prediction, moves the window one
column, harvests n-grams into the pool and publishes the accepted rows' K/V
(one worker) or re-feeds the emitted tokens (LP). Greedy output is identical
to plain greedy decoding.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Sequence

import torch

from lp.decode.kv_cache import cache_length, crop, forward_logits, new_cache, publish
from lp.decode.layout import build_round, pack
from lp.decode.params import GenerationParams, LookaheadParams, check
from lp.decode.propose import Proposer
from lp.decode.sampling import Draws, distribution, verify_tree_sampling, warpers
from lp.decode.stopping import StopChecker
from lp.decode.suffix import SuffixIndex
from lp.decode.tree import TokenTree
from lp.decode.verify import decide, pack_payload, tree_tensors, tree_verdict
from lp.decode.window import JacobiWindow
from lp.parallel.dist import Comm
from lp.parallel.shard import shard_plan

__all__ = ["GenerationParams", "GenerationResult", "LookaheadParams", "check", "lookahead_generate"]


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    finish_reason: str
    forwards: int
    emitted_per_round: list[int] = field(default_factory=list)
    rows_per_round: list[int] = field(default_factory=list)       # rows this worker fed
    max_rows_per_round: list[int] = field(default_factory=list)   # rows of the busiest worker
    decode_seconds: float = 0.0
    host_seconds: float = 0.0       # round time outside forward -> verification -> gathered payload
    collectives: int = 0            # step-loop collectives (0 with one worker)
    bytes_moved: int = 0

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def compression(self) -> float:
        """S = generated tokens / target forwards (prefill counted)."""
        return self.new_tokens / self.forwards if self.forwards else 0.0


def window_seed(prompt: Sequence[int], count: int, seed: int = 0) -> list[int]:
    """Initial level-0 guesses: tokens drawn from the prompt, deterministically."""
    return random.Random(seed).choices(list(prompt), k=count)


@torch.inference_mode()
def lookahead_generate(
    model,
    input_ids: Sequence[int],
    lookahead: LookaheadParams = LookaheadParams(),
    generation: GenerationParams = GenerationParams(),
    *,
    eos_token_ids: Sequence[int] = (),
    tokenizer=None,
    comm: Comm | None = None,
    request: str | int = 0,
    corpus: SuffixIndex | None = None,
) -> GenerationResult:
    """Decode `input_ids` with lookahead: greedy, or exact sampling when
    `generation.temperature` > 0 (`request` names the request in the random
    draws). With a multi-worker `comm` every rank calls this with the same
    arguments; rank 0 alone proposes candidates (and reads `corpus`, the job's
    index of earlier completions, when `lookahead.job_cache` is on)."""
    check(lookahead, generation)
    comm = comm or Comm()
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: lookahead needs at least one prompt token")
    n, w = lookahead.ngram, lookahead.window
    width, capacity = lookahead.width, lookahead.capacity   # deepest node; most nodes
    deep_slots = w + n - 2 if w else 0  # widest deepest level a rank can hold (first warmup round)
    device = next(model.parameters()).device

    proposer = Proposer(lookahead, prompt, corpus) if comm.rank == 0 else None
    window = JacobiWindow.seeded(n, w, window_seed(prompt, w + n - 3)) if w else None
    levels = window.levels if window is not None else []
    stopper = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer)
    cache = new_cache(model)
    tokens = list(prompt)        # committed: prompt + output
    ordinary = list(prompt)      # committed but not yet in the cache
    warp = warpers(generation.temperature, generation.top_k, generation.top_p) if generation.sampling else None
    draws = Draws(generation.seed, request)
    result = GenerationResult([], None, "", 0)
    collectives, bytes_moved = comm.collectives, comm.bytes_moved
    start = time.perf_counter()

    while stopper.reason is None:
        round_start = time.perf_counter()
        x_t = tokens[-1]
        past = cache_length(cache)
        tree = proposer.tree() if proposer else None       # rank 0 proposes, the others receive
        shared = comm.share_rows((tree.tokens, tree.parents) if tree is not None else None, capacity)
        tree = tree if tree is not None else TokenTree.from_parents(*shared)
        columns = window.columns if window is not None else 0
        plan = shard_plan(comm.world, columns, len(levels), tree.units(), len(ordinary))
        mine = plan[comm.rank]
        starts = list(accumulate(tree.units(), initial=0))     # whole root subtrees per rank
        nodes = range(starts[mine.subtrees.start], starts[mine.subtrees.stop])
        rnd = build_round(ordinary, len(tokens) - 1, levels, tree, nodes, columns=mine.columns)
        ids, pos, mask, keep = pack(rnd, past, model.dtype, device)

        forward_start = time.perf_counter()
        logits = forward_logits(model, ids, pos, mask, cache, keep)
        predicted = logits.argmax(-1)            # the window stays greedy whatever the sampling
        at = {row: k for k, row in enumerate(rnd.logit_rows)}
        if warp is None:
            head, after = tree_verdict(predicted[at[rnd.last_ordinary]], *tree_tensors(tree, nodes, device),
                                       predicted[torch.tensor([at[r] for r in rnd.node_rows], dtype=torch.long,
                                                              device=device)], first_node=nodes.start, width=width)
        else:
            sampled = verify_tree_sampling(
                distribution(logits[at[rnd.last_ordinary]], warp), tree,
                lambda u: distribution(logits[at[rnd.node_rows[u - nodes.start]]], warp),
                draws, result.forwards, owned=lambda u: u in nodes)
            head = torch.tensor([sampled.emitted[0], sampled.hits, sampled.node])
            after = torch.tensor((sampled.emitted[1:] + [0] * width)[:width])
        deep = predicted[torch.tensor([at[r] for r in rnd.deep_rows], dtype=torch.long, device=device)]
        payload = pack_payload(head, after, deep, deep_slots)
        decision = decide(comm.all_gather(payload).tolist(), width)   # the round's one sync
        forward_seconds = time.perf_counter() - forward_start

        ngrams = []
        if window is not None:
            ngrams = window.ngrams(x_t, decision.deepest)
            window.advance(decision.deepest)
            levels = window.levels
        emitted = []
        for token in decision.emitted:
            emitted.append(token)
            if stopper.push(token):
                break
        tokens += emitted
        if proposer is not None:
            proposer.commit(emitted, ngrams)
        if comm.world == 1:      # publish the accepted rows' K/V; the last token is next round's row
            accepted = [past + rnd.node_rows[u - nodes.start] for u in tree.path(decision.node)] if decision.hits else []
            publish(cache, past + len(ordinary), accepted)
            ordinary = decision.emitted[-1:]
        else:                    # re-feed: the accepted rows live on one rank only
            crop(cache, past + len(ordinary))
            ordinary = list(decision.emitted)

        result.forwards += 1
        result.emitted_per_round.append(len(emitted))
        result.rows_per_round.append(len(rnd))
        result.max_rows_per_round.append(max(sh.rows for sh in plan))
        result.host_seconds += time.perf_counter() - round_start - forward_seconds

    result.decode_seconds = time.perf_counter() - start
    result.token_ids = stopper.tokens
    result.text = stopper.text
    result.finish_reason = stopper.reason
    result.collectives = comm.collectives - collectives
    result.bytes_moved = comm.bytes_moved - bytes_moved
    return result
