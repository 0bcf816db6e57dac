"""One request's decoding state, from its prompt to its result (host side, no device work).

A `RequestState` holds everything a request carries from round to round:
its committed tokens, the tokens not yet in its cache, its Jacobi window, its
candidate proposer (rank 0 of an LP group only), its stopper and its sampling
draws. The engine asks it for this round's rows (`plan`), packs the rows of
every request in the round into one forward (lp/decode/batch.py) and hands
each request its decision back (`commit`).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable, NamedTuple, Sequence

import torch

from lp.decode.layout import Round, build_round
from lp.decode.params import GenerationParams, LookaheadParams
from lp.decode.processors import RowBans, SeenPrompt, as_generate_calls
from lp.decode.propose import Proposer
from lp.decode.sampling import Draws
from lp.decode.stopping import StopChecker, StopTest
from lp.decode.suffix import SuffixIndex
from lp.decode.tree import TokenTree
from lp.decode.verify import Decision
from lp.decode.window import JacobiWindow


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    finish_reason: str
    forwards: int
    emitted_per_round: list[int] = field(default_factory=list)
    rows_per_round: list[int] = field(default_factory=list)       # rows this worker fed (the round it packed)
    max_rows_per_round: list[int] = field(default_factory=list)   # rows the busiest worker fed (gathered)
    batch_per_round: list[int] = field(default_factory=list)      # requests in the forward (decode_batch)
    fed_rows_per_round: list[int] = field(default_factory=list)   # rows per request in it, padding included
    decode_seconds: float = 0.0     # from the request's first round to its last (its latency in a batch)
    host_seconds: float = 0.0       # round time outside forward -> verification -> gathered payload (a
    #                                 caller's row processor inside it counted as host time)
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


def round_rows_bound(params: LookaheadParams, width: int) -> int:
    """Most rows a decoding round can feed on one rank: re-fed ordinary rows, the widest
    window (its first warmup round) and the whole tree."""
    w, n = params.window, params.ngram
    window = (w + n - 2) * (n - 2) + (w + n - 3) if w else 0
    return width + 1 + window + params.capacity


def cache_need(prompt_tokens: int, params: LookaheadParams, max_new_tokens: int, fit=lambda q: q) -> int:
    """Cache slots a request of `prompt_tokens` needs: its prefill round, or everything it can commit
    plus the largest round after it (`fit`: the padding rounds get)."""
    bound = round_rows_bound(params, params.width)
    return max(fit(prompt_tokens + bound), prompt_tokens + max_new_tokens + fit(bound))


class RoundPlan(NamedTuple):
    """One request's share of a round on this rank: its rows and what reading them back needs."""
    rnd: Round
    tree: TokenTree
    nodes: range        # this rank's tree nodes (whole root subtrees)


class RequestState:
    """A request being decoded: `key` names it for the caller, `row` is its cache row."""

    def __init__(self, key: Any, prompt: Sequence[int], lookahead: LookaheadParams, generation: GenerationParams, *,
                 request: str | int = 0, leader: bool = True, corpus: SuffixIndex | None = None,
                 eos_token_ids: Sequence[int] = (), tokenizer=None, row: int = 0, streamer=None,
                 ceiling: Callable[[int], int | None] = lambda position: None, reencode_at: int | None = None,
                 seen_prompt: SeenPrompt | None = None, stop_when: StopTest | None = None):
        self.key, self.row, self.streamer, self.ceiling = key, row, streamer, ceiling
        self.reencode_at = reencode_at   # lp.decode.arch.reencode_position: where generate re-encodes everything
        self.max_new_tokens = generation.max_new_tokens
        self.prompt = [int(t) for t in prompt]
        n, w = lookahead.ngram, lookahead.window
        self.proposer = Proposer(lookahead, self.prompt, corpus) if leader else None
        self.window = JacobiWindow.seeded(n, w, window_seed(self.prompt, w + n - 3)) if w else None
        seen_prompt = seen_prompt or SeenPrompt(self.prompt)
        self.seen_prompt = [int(t) for t in seen_prompt.ids]
        criterion = (lambda output: stop_when(key, self.seen_prompt + output)) if stop_when is not None else None
        self.stopper = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer, criterion,
                                   context=self.prompt)
        self.draws = Draws(generation.seed, request)
        self.tokens = list(self.prompt)      # committed: prompt + output
        self.ordinary = list(self.prompt)    # committed but not yet in the cache
        self.cached = 0                      # cache slots holding committed tokens
        # generate's processors (lp/decode/processors.py) see `seen_prompt` (default: the prompt), then the
        # output: the repetition penalty's tokens not yet on the device and the device's presence row of
        # the others; the n-grams and bad words on the host
        self.penalizes = generation.repetition_penalty != 1.0
        self.unseen = [int(t) for t in seen_prompt.ids[seen_prompt.penalty_start:]] if self.penalizes else []
        self.seen: torch.Tensor | None = None
        self.bans = RowBans(generation, seen_prompt.ids) if RowBans.wanted(generation) else None
        self.result = GenerationResult([], None, "", 0)
        self.error: Exception | None = None      # why it ended without a result (fail)
        self.started = time.perf_counter()
        self._fit_window()

    def reuse(self, slots: int) -> None:
        """The K/V of the prompt's first `slots` tokens are already in this request's cache row
        (lp/decode/prefix.py): its prefill feeds the rest."""
        assert 0 <= slots < len(self.prompt) and self.cached == 0
        self.cached, self.ordinary = slots, self.prompt[slots:]

    @property
    def in_cache(self) -> list[int]:
        """The committed tokens whose K/V this request's cache row holds, at slots 0 on."""
        return self.tokens[:self.cached]

    @property
    def generated(self) -> int:
        """New tokens committed so far: the position of the next round's first token (its draw's)."""
        return len(self.tokens) - len(self.prompt)

    @property
    def seen_tokens(self) -> list[int]:
        """The input as generate's processors see it: the seen prompt, then the committed output."""
        return self.seen_prompt + self.tokens[len(self.prompt):]

    @property
    def draft_depth(self) -> int:
        """How deep this round's tree may go: no node past the model's draft ceiling
        (lp.decode.arch.draft_ceiling) and none whose own token is past max_new_tokens."""
        position = len(self.tokens) - 1
        ceiling = self.ceiling(position)
        depth = self.max_new_tokens - self.generated - 1
        return depth if ceiling is None else min(depth, ceiling - position)

    def _fit_window(self) -> None:
        """Drop the Jacobi window for good once its farthest cell would pass the draft ceiling (the
        request is then within a window's reach of a threshold; the tree still drafts)."""
        if self.window is not None:
            position = len(self.tokens) - 1
            ceiling = self.ceiling(position)
            if ceiling is not None and position + self.window.columns + self.window.depth - 2 > ceiling:
                self.window = None

    @property
    def done(self) -> bool:
        return self.stopper.reason is not None or self.error is not None

    def fail(self, error: Exception) -> None:
        """The request ends here with `error` instead of a result (its round commits nothing)."""
        self.error = error

    @property
    def levels(self) -> list[list[int]]:
        return self.window.levels if self.window is not None else []

    def base_rows(self) -> int:
        """Rows this round feeds on one worker besides its tree: the ordinary rows and the window."""
        return len(build_round(self.ordinary, len(self.tokens) - 1, self.levels))

    @property
    def columns(self) -> int:
        return self.window.columns if self.window is not None else 0

    def plan(self, tree: TokenTree, columns: range | None = None, subtrees: range | None = None) -> RoundPlan:
        """This rank's rows of the request's round: its block of window `columns` and of the tree's
        root `subtrees` (lp.parallel.shard; default: all), after the ordinary rows every rank feeds."""
        starts = list(accumulate(tree.units(), initial=0))
        subtrees = subtrees if subtrees is not None else range(len(starts) - 1)
        nodes = range(starts[subtrees.start], starts[subtrees.stop])
        rnd = build_round(self.ordinary, len(self.tokens) - 1, self.levels, tree, nodes, columns=columns)
        return RoundPlan(rnd, tree, nodes)

    def commit(self, decision: Decision, plan: RoundPlan, world: int) -> None:
        """The round's outcome: the window moves, the emitted tokens are committed up to a stop, the
        proposer learns them, and the cache bookkeeping follows publication (one worker: the accepted
        rows' K/V now sit at the frontier) or re-feed (LP: the emitted tokens are next round's rows)."""
        ngrams = []
        if self.window is not None:
            ngrams = self.window.ngrams(self.tokens[-1], decision.deepest)
            self.window.advance(decision.deepest)
        emitted = []
        for token in decision.emitted:
            emitted.append(token)
            if self.stopper.push(token):
                break
        self.tokens += emitted
        if self.penalizes:
            self.unseen += emitted
        if self.bans is not None:
            self.bans.extend(emitted)
        if self.streamer is not None and emitted:
            with as_generate_calls():
                self.streamer.put(torch.tensor(emitted))
        if self.proposer is not None:
            self.proposer.commit(emitted, ngrams)
        frontier = self.cached + len(self.ordinary)
        if world == 1:       # the accepted rows' K/V were published; the last token is next round's row
            self.cached = frontier + decision.hits
            self.ordinary = decision.emitted[-1:]
        else:                # re-feed: the accepted rows live on one rank only
            self.cached = frontier
            self.ordinary = list(decision.emitted)
        self._fit_window()
        if self.reencode_at is not None and len(self.tokens) - 1 >= self.reencode_at > len(self.tokens) - 1 - len(emitted):
            self.cached, self.ordinary = 0, list(self.tokens)     # generate's re-encode, at the same token
        r = self.result
        r.forwards += 1
        r.emitted_per_round.append(len(emitted))
        r.rows_per_round.append(len(plan.rnd))
        r.max_rows_per_round.append(max(decision.rows))

    def finish(self) -> GenerationResult | Exception:
        """The result, or the error the request failed with."""
        if self.error is not None:
            return self.error
        r = self.result
        r.decode_seconds = time.perf_counter() - self.started
        if self.streamer is not None:
            with as_generate_calls():
                self.streamer.end()
        r.token_ids, r.text, r.finish_reason = self.stopper.tokens, self.stopper.text, self.stopper.reason
        return r
