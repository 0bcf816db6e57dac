"""Single-worker Lookahead decoding: the whole decode loop in one function.

Each round is ONE forward over: the ordinary rows (committed tokens not yet in
the cache; the whole prompt in the first round, so prefill is a round too),
the Jacobi window, the candidate suffixes that the n-gram pool holds for
the last committed token, and the prompt/output lookup candidates (spans that
followed earlier occurrences of the last few tokens, of any length up to
`lookup_tokens`). The round commits z* plus the longest verified candidate
prefix plus the target's next prediction, moves the window one column,
harvests n-grams into the pool and publishes the accepted rows' K/V.
Greedy output is identical to plain greedy decoding.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lp.decode.kv_cache import cache_length, crop, forward_logits, new_cache, publish
from lp.decode.layout import build_round, pack
from lp.decode.lookup import LookupIndex, merge_candidates
from lp.decode.pool import NGramPool, sequence_ngrams
from lp.decode.sampling import Draws, distribution, group_by_first_token, group_starts, verify_sampling, warpers
from lp.decode.stopping import StopChecker
from lp.decode.verify import decide, greedy_verdict, pack_payload, padded
from lp.decode.window import JacobiWindow
from lp.parallel.dist import Comm
from lp.parallel.shard import shard_plan, snap_to_groups


@dataclass
class LookaheadParams:
    """Config section `lookahead`: W columns, N-gram size, G pool guesses per round,
    plus up to `lookup_candidates` prompt/output lookup candidates of up to
    `lookup_tokens` tokens, matched on the last `lookup_ngram`..1 tokens."""
    window: int = 15
    ngram: int = 5
    guesses: int = 15
    pool_seeding: bool = True  # seed the pool from the prompt and the committed output
    lookup_candidates: int = 0  # 0: no lookup candidates
    lookup_tokens: int = 10
    lookup_ngram: int = 3

    @property
    def width(self) -> int:
        """Longest candidate a round can verify: N-1 (pool) or lookup_tokens."""
        return max(self.ngram - 1, self.lookup_tokens if self.lookup_candidates else 0)

    @property
    def capacity(self) -> int:
        """Most candidates a round can verify."""
        return self.guesses + self.lookup_candidates

    def problems(self) -> list[str]:
        out = []
        if self.window < 0:
            out.append(f"lookahead.window: {self.window!r} must be >= 0 (0: no Jacobi window)")
        for key in ("lookup_candidates", "lookup_tokens", "lookup_ngram"):
            low = 0 if key == "lookup_candidates" else 1
            if getattr(self, key) < low:
                out.append(f"lookahead.{key}: {getattr(self, key)!r} must be >= {low}")
        if self.ngram < 3:
            out.append(f"lookahead.ngram: {self.ngram!r} must be >= 3")
        if self.guesses < 0:
            out.append(f"lookahead.guesses: {self.guesses!r} must be >= 0")
        return out


@dataclass
class GenerationParams:
    """Config section `generation`."""
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    # how a job decodes: "lookahead" (this module) or "autoregressive" (transformers generate,
    # lp.baseline); lookahead_generate itself ignores it
    method: str = "lookahead"
    temperature: float = 0.0   # 0: greedy; else sample (temperature, then top_k, then top_p, as generate)
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off
    seed: int = 0              # draws are a function of (seed, request, round, offset)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def problems(self) -> list[str]:
        out = []
        if self.max_new_tokens < 1:
            out.append(f"generation.max_new_tokens: {self.max_new_tokens!r} must be >= 1")
        if self.method not in ("lookahead", "autoregressive"):
            out.append(f"generation.method: {self.method!r} must be one of lookahead, autoregressive")
        if self.temperature < 0:
            out.append(f"generation.temperature: {self.temperature!r} must be >= 0 (0 is greedy)")
        if self.top_k < 0:
            out.append(f"generation.top_k: {self.top_k!r} must be >= 0 (0 is off)")
        if not 0 < self.top_p <= 1:
            out.append(f"generation.top_p: {self.top_p!r} must be in (0, 1] (1 is off)")
        if self.seed < 0:
            out.append(f"generation.seed: {self.seed!r} must be >= 0")
        if any(not isinstance(s, str) or not s for s in self.stop):
            out.append(f"generation.stop: {list(self.stop)!r} must be non-empty strings")
        return out


def check(*params) -> None:
    problems = [p for ps in params for p in ps.problems()]
    if problems:
        raise ValueError("\n".join(problems))


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    finish_reason: str
    forwards: int
    emitted_per_round: list[int] = field(default_factory=list)
    rows_per_round: list[int] = field(default_factory=list)       # rows this worker fed (ids it packed)
    max_rows_per_round: list[int] = field(default_factory=list)   # rows the busiest worker fed (gathered)
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
) -> GenerationResult:
    """Decode `input_ids` with lookahead: greedy, or exact sampling when
    `generation.temperature` > 0 (`request` names the request in the random
    draws). With a multi-worker `comm` every rank calls this with the same
    arguments; rank 0 alone holds the pool and the lookup index."""
    check(lookahead, generation)
    comm = comm or Comm()
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: lookahead needs at least one prompt token")
    n, w, g = lookahead.ngram, lookahead.window, lookahead.guesses
    s, width = n - 1, lookahead.width   # pool suffix length; longest candidate
    deep_slots = w + n - 2 if w else 0  # widest deepest level a rank can hold (first warmup round)
    device = next(model.parameters()).device

    source = comm.rank == 0      # rank 0 alone proposes candidates
    pool = NGramPool(s, g) if source and g else None
    lookup = LookupIndex(lookahead.lookup_ngram, prompt) if source and lookahead.lookup_candidates else None
    window = JacobiWindow.seeded(n, w, window_seed(prompt, w + n - 3)) if w else None
    levels = window.levels if window is not None else []
    stopper = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer)
    cache = new_cache(model)
    tokens = list(prompt)        # committed: prompt + output
    ordinary = list(prompt)      # committed but not yet in the cache
    seeded = 0                   # n-grams of `tokens` already in the pool
    if pool is not None and lookahead.pool_seeding:
        pool.update(sequence_ngrams(tokens, n))
        seeded = max(len(tokens) - n + 1, 0)
    warp = warpers(generation.temperature, generation.top_k, generation.top_p) if generation.sampling else None
    draws = Draws(generation.seed, request)
    result = GenerationResult([], None, "", 0)
    collectives, bytes_moved = comm.collectives, comm.bytes_moved
    start = time.perf_counter()

    while stopper.reason is None:
        round_start = time.perf_counter()
        x_t = tokens[-1]
        past = cache_length(cache)
        proposed = None
        if source:               # pool suffixes share one length: only lookup needs merging
            proposed = pool.candidates(x_t, g) if pool is not None else []
            if lookup is not None:
                proposed = merge_candidates(
                    lookup.candidates(lookahead.lookup_candidates, lookahead.lookup_tokens), proposed)
        candidates = comm.share_candidates(proposed, width, lookahead.capacity)
        if warp is not None:     # an LP rank must hold every candidate that shares a first token
            candidates = group_by_first_token(candidates)   # (before planning: the plan counts rows in this order)
        lengths = tuple(len(c) for c in candidates)
        columns = window.columns if window is not None else 0
        plan = shard_plan(comm.world, columns, len(levels), lengths, len(ordinary))
        if warp is not None:
            plan = snap_to_groups(plan, group_starts(candidates), lengths)
        mine = plan[comm.rank]
        guesses = candidates[mine.candidates.start:mine.candidates.stop]
        rnd = build_round(ordinary, len(tokens) - 1, levels, guesses, columns=mine.columns)
        ids, pos, mask, keep = pack(rnd, past, model.dtype, device)

        forward_start = time.perf_counter()
        logits = forward_logits(model, ids, pos, mask, cache, keep)
        predicted = logits.argmax(-1)            # the window stays greedy whatever the sampling
        at = {row: k for k, row in enumerate(rnd.logit_rows)}
        if warp is None:         # candidates padded to `width`: -1 guesses never match
            cand_logits = padded([[at[r] for r in rows] for rows in rnd.cand_rows], width, 0)
            head, after = greedy_verdict(
                predicted[at[rnd.last_ordinary]], padded(guesses, width, -1).to(device),
                predicted[cand_logits.to(device)], mine.candidates.start)
        else:
            first = mine.candidates.start
            sampled = verify_sampling(
                distribution(logits[at[rnd.last_ordinary]], warp), candidates,
                lambda c, o: distribution(logits[at[rnd.cand_rows[c - first][o]]], warp),
                draws, result.forwards, owned=lambda c: c in mine.candidates)
            head = torch.tensor([sampled.emitted[0], sampled.hits, sampled.survivor])
            after = torch.tensor((sampled.emitted[1:] + [0] * width)[:width])
        deep = predicted[torch.tensor([at[r] for r in rnd.deep_rows], dtype=torch.long, device=device)]
        payload = pack_payload(head, after, deep, deep_slots, ids.shape[1])   # rows really fed
        decision = decide(comm.all_gather(payload).tolist(), width)   # the round's one sync
        forward_seconds = time.perf_counter() - forward_start

        if window is not None:
            if pool is not None:
                pool.update(window.ngrams(x_t, decision.deepest))
            window.advance(decision.deepest)
            levels = window.levels
        emitted = []
        for token in decision.emitted:
            emitted.append(token)
            if stopper.push(token):
                break
        tokens += emitted
        if lookup is not None:
            lookup.extend(emitted)
        if comm.world == 1:      # publish the accepted rows' K/V; the last token is next round's row
            accepted = [past + r for r in rnd.cand_rows[decision.candidate][:decision.hits]] if decision.hits else []
            publish(cache, past + len(ordinary), accepted)
            ordinary = decision.emitted[-1:]
        else:                    # re-feed: the accepted rows live on one rank only
            crop(cache, past + len(ordinary))
            ordinary = list(decision.emitted)
        if pool is not None and lookahead.pool_seeding:
            pool.update(sequence_ngrams(tokens, n, start=seeded))
            seeded = max(len(tokens) - n + 1, seeded)

        result.forwards += 1
        result.emitted_per_round.append(len(emitted))
        result.rows_per_round.append(ids.shape[1])
        result.max_rows_per_round.append(max(decision.rows))
        result.host_seconds += time.perf_counter() - round_start - forward_seconds

    result.decode_seconds = time.perf_counter() - start
    result.token_ids = stopper.tokens
    result.text = stopper.text
    result.finish_reason = stopper.reason
    result.collectives = comm.collectives - collectives
    result.bytes_moved = comm.bytes_moved - bytes_moved
    return result
