"""Single-worker Lookahead decoding: the whole decode loop in one function.

Each round is ONE forward over: the ordinary rows (committed tokens not yet in
the cache; the whole prompt in the first round, so prefill is a round too),
the Jacobi window, and the candidate suffixes that the n-gram pool holds for
the last committed token. The round commits z* plus the longest verified
candidate prefix plus the target's next prediction, moves the window one
column, harvests n-grams into the pool and publishes the accepted rows' K/V.
Greedy output is identical to plain greedy decoding.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lp.kv_cache import cache_length, forward_logits, new_cache, publish
from lp.layout import build_round, pack
from lp.pool import NGramPool, sequence_ngrams
from lp.stopping import StopChecker
from lp.verify import verify_greedy
from lp.window import JacobiWindow


@dataclass
class LookaheadParams:
    """Config section `lookahead`: W columns, N-gram size, G guesses per round."""
    window: int = 15
    ngram: int = 5
    guesses: int = 15
    pool_seeding: bool = True  # seed the pool from the prompt and the committed output

    def problems(self) -> list[str]:
        out = []
        if self.window < 1:
            out.append(f"lookahead.window: {self.window!r} must be >= 1")
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

    def problems(self) -> list[str]:
        out = []
        if self.max_new_tokens < 1:
            out.append(f"generation.max_new_tokens: {self.max_new_tokens!r} must be >= 1")
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
    rows_per_round: list[int] = field(default_factory=list)
    decode_seconds: float = 0.0
    host_seconds: float = 0.0

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
) -> GenerationResult:
    check(lookahead, generation)
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: lookahead needs at least one prompt token")
    n, w, g = lookahead.ngram, lookahead.window, lookahead.guesses
    dtype = model.dtype
    device = next(model.parameters()).device

    pool = NGramPool(n - 1, g)
    window = JacobiWindow.seeded(n, w, window_seed(prompt, w + n - 3))
    stopper = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer)
    cache = new_cache(model)
    tokens = list(prompt)        # committed: prompt + output
    ordinary = list(prompt)      # committed but not yet in the cache
    seeded = 0                   # n-grams of `tokens` already in the pool
    if lookahead.pool_seeding:
        pool.update(sequence_ngrams(tokens, n))
        seeded = max(len(tokens) - n + 1, 0)
    result = GenerationResult([], None, "", 0)
    start = time.perf_counter()

    while stopper.reason is None:
        round_start = time.perf_counter()
        x_t = tokens[-1]
        past = cache_length(cache)
        candidates = pool.candidates(x_t, g)
        rnd = build_round(ordinary, len(tokens) - 1, window.levels, candidates)
        ids, pos, mask, keep = pack(rnd, past, dtype, device)

        forward_start = time.perf_counter()
        logits = forward_logits(model, ids, pos, mask, cache, keep)
        predicted = dict(zip(rnd.logit_rows, logits.argmax(-1).tolist()))  # the one sync
        forward_seconds = time.perf_counter() - forward_start

        verdict = verify_greedy(
            predicted[rnd.last_ordinary],
            candidates,
            [[predicted[i] for i in rows] for rows in rnd.cand_rows],
        )
        deepest = [predicted[i] for i in rnd.deep_rows]
        pool.update(window.ngrams(x_t, deepest))
        window.advance(deepest)

        emitted = []
        for token in verdict.emitted:
            emitted.append(token)
            if stopper.push(token):
                break
        tokens += emitted
        accepted = [past + i for i in rnd.cand_rows[verdict.candidate][:verdict.hits]] if verdict.hits else []
        publish(cache, past + len(ordinary), accepted)
        ordinary = [verdict.emitted[-1]]
        if lookahead.pool_seeding:
            pool.update(sequence_ngrams(tokens, n, start=seeded))
            seeded = max(len(tokens) - n + 1, seeded)

        result.forwards += 1
        result.emitted_per_round.append(len(emitted))
        result.rows_per_round.append(len(rnd))
        result.host_seconds += time.perf_counter() - round_start - forward_seconds

    result.decode_seconds = time.perf_counter() - start
    result.token_ids = stopper.tokens
    result.text = stopper.text
    result.finish_reason = stopper.reason
    return result
