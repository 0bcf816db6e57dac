"""Lookahead decoding: the decode loop (`decode_batch`: requests join, one round, requests leave;
`lookahead_generate` is its batch of one) and one round's work (`Rounds.run`).

Each round is ONE forward (for every request of the batch, lp/decode/batch.py)
over: the ordinary rows (committed tokens not yet in the cache; the whole
prompt in the first round, so prefill is a round too), the Jacobi window, and
the round's token tree: every candidate source (pool suffixes, lookup spans,
suffix drafts from this request and the job's earlier completions;
lp/decode/propose.py) merged into one trie rooted after the last committed
token. The round commits z* plus the tokens along the deepest accepted tree
path plus the target's next prediction, moves the window one column,
harvests n-grams into the pool and publishes the accepted rows' K/V (one
worker) or re-feeds the emitted tokens (LP). Greedy output is identical to
plain greedy decoding.
"""
from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import torch

from lp.decode.arch import (check_model, draft_ceiling, input_vocab, logits_size, outside_vocabulary,
                            reencode_position, rope_threshold)
from lp.decode.batch import Packed, forward_round, pack_round
from lp.decode.budget import Acceptance, DraftBackoff, ranked_chances, rows_per_request
from lp.decode.device import Uploader
from lp.decode.kv_cache import (COMPILE_MODES, attended, compiled_forward, copy_prefix, publish,
                                round_cache)
from lp.decode.layout import bucket
from lp.decode.params import GenerationParams, LookaheadParams, check
from lp.decode.prefix import RowPrefixes
from lp.decode.processors import Processors, RowProcessor, SeenPrompt, process_by_input
from lp.decode.request import GenerationResult, RequestState, RoundPlan, cache_need, round_rows_bound, window_seed
from lp.decode.stopping import StopTest
from lp.decode.sampling import Draws, NoDistribution, distribution, tree_sampling_verdict, verify_tree_sampling, warpers
from lp.decode.suffix import SuffixIndex
from lp.decode.tree import EMPTY, TokenTree
from lp.decode.verify import decide, greedy_ids, node_mismatch, pack_payloads, path_verdicts
from lp.parallel.dist import Comm
from lp.parallel.shard import shard_plan

logger = logging.getLogger(__name__)

__all__ = ["BatchStats", "GenerationParams", "GenerationResult", "LookaheadParams", "Prompt", "check",
           "decode_batch", "lookahead_generate", "round_rows_bound", "window_seed"]


class Prompt(NamedTuple):
    """One request for `decode_batch`: `key` (what its result is yielded under), its prompt `ids`,
    `request` (its name in the sampling draws) and `seen`, the prompt as generate's processors and
    stopping criteria see it when that is not `ids` (lp.decode.processors.SeenPrompt: the generate
    drop-in's left-padded rows; None: `ids`). A plain (key, ids, request) tuple is one too."""
    key: Any
    ids: Sequence[int]
    request: str | int
    seen: SeenPrompt | None = None


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
    compile_mode: str = "off",
    sampling_on_device: bool | None = None,
    streamer=None,
    seen_prompt: SeenPrompt | None = None,
    row_processor: RowProcessor | None = None,
    stop_when: StopTest | None = None,
) -> GenerationResult:
    """Decode `input_ids` with lookahead: greedy, or exact sampling when
    `generation.temperature` > 0 (`request` names the request in the random
    draws). With a multi-worker `comm` every rank calls this with the same
    arguments; rank 0 alone proposes candidates (and reads `corpus`, the job's
    index of earlier completions, when `lookahead.job_cache` is on).

    A round is one upload (the rows' descriptors and what verification needs),
    device work only (mask, forward, verification, payload, publication of the
    accepted K/V) and one read of the gathered payload. `compile_mode` (off,
    default, reduce-overhead) runs the forward through torch.compile on rounds
    padded to a few fixed sizes. Sampling walks the tree on the device
    (`sampling_on_device`, the default except on a CPU, where reading rows
    lazily costs no sync and warps only the rows the walk visits). A transformers `streamer`
    (put / end) gets each round's committed tokens as the round commits them, then `end()`; the
    prompt is the caller's to put, as `generate` puts it before decoding. `seen_prompt`: the prompt
    as generate's processors see it (lp.decode.processors.SeenPrompt; default: `input_ids`);
    `row_processor` and `stop_when`: the caller's own processing of every verified row and stopping test
    (decode_batch; the key is `request`). This is `decode_batch` with one request."""
    if not len(input_ids):
        raise ValueError("input_ids is empty: lookahead needs at least one prompt token")
    (_, result), = decode_batch(model, [Prompt(request, input_ids, request, seen_prompt)], lookahead, generation,
                                eos_token_ids=eos_token_ids, tokenizer=tokenizer, comm=comm, corpus=corpus,
                                compile_mode=compile_mode,
                                sampling_on_device=sampling_on_device, streamer=streamer,
                                row_processor=row_processor, stop_when=stop_when)
    if isinstance(result, Exception):
        raise result
    return result


@dataclass
class BatchStats:
    """What a `decode_batch` run did as a whole (filled in as it goes)."""
    rounds: int = 0             # forwards, solo first rounds included
    occupancy: int = 0          # requests summed over rounds (mean batch: occupancy / rounds)
    rows: int = 0               # rows fed, padding included, summed over rounds
    prefills: int = 0           # of the rounds: solo first rounds (a joining request's prefill)
    prefill_rows: int = 0       # of the rows: those of the prefills

    @property
    def decoding_rows_per_round(self) -> float | None:
        """Rows fed per decoding round (the prefills left out), padding included."""
        rounds = self.rounds - self.prefills
        return (self.rows - self.prefill_rows) / rounds if rounds else None


@torch.inference_mode()
def decode_batch(
    model,
    prompts: Iterable[Prompt | tuple[Any, Sequence[int], str | int]],
    lookahead: LookaheadParams = LookaheadParams(),
    generation: GenerationParams = GenerationParams(),
    *,
    batch_size: int = 1,
    prompt_tokens: int | None = None,
    eos_token_ids: Sequence[int] = (),
    tokenizer=None,
    comm: Comm | None = None,
    corpus: SuffixIndex | None = None,
    compile_mode: str = "off",
    sampling_on_device: bool | None = None,
    streamer=None,
    stats: BatchStats | None = None,
    row_cost: Callable[[int, int], float] | None = None,
    draft_cost: float = 0.0,
    row_processor: RowProcessor | None = None,
    stop_when: StopTest | None = None,
) -> Iterator[tuple[Any, GenerationResult | Exception]]:
    """Decode `prompts` (each a Prompt: key, prompt ids, request, and optionally what generate's
    processors see) with up to `batch_size` requests per forward, yielding (key, result) as each request ends, or
    (key, ValueError) for a prompt that cannot be decoded and (key, NoDistribution) for a request whose
    sampling finds no token to draw (the others go on). Continuous batching:
    a request that ends leaves the batch at once; the next prompt is taken then and its first round
    (the prefill) runs alone into its own cache row before it joins the batched rounds; with
    `lookahead.prefix_reuse` (and `batch_size` > 1) it starts after the longest prefix of the prompt
    whose K/V a cache row already holds (lp/decode/prefix.py), copied into its row. The cache
    holds `batch_size` rows of slots for prompts of up to `prompt_tokens` tokens (default: the
    first prompt's). With a multi-worker `comm` every rank calls this with the same prompts in the
    same order (the iterator is only advanced when a slot is free, at the same round on every
    rank); a request's greedy tokens never depend on what shares its forwards. `row_cost` (seconds of
    one forward of n requests of q rows each: the device's measured grid,
    lp.measure.cost_model.batch_forward_time) turns on the row budget (lp/decode/budget.py): each
    round the leader cuts every request's tree to the rows that pay for themselves, and for their
    drafting, `draft_cost` host seconds per request (lp.measure.cost_model.draft_time). `row_processor`
    (key, input ids, scores) -> scores processes every verified row after generate's processors lp
    applies itself and before the warpers (lp.decode.processors.process_by_input): exact for a
    processor that treats each row on its own. `stop_when` (key, seen prompt + output) -> bool ends a
    request at the committed token after which it first returns True (finish reason "stop"), as
    generate's stopping criteria end a row."""
    check(lookahead, generation)
    kinds = check_model(model)      # each layer type's attention rule; refuses what cannot be exact
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode {compile_mode!r} must be one of {', '.join(COMPILE_MODES)}")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be >= 1")
    threshold = rope_threshold(model.config)
    if threshold is not None and batch_size > 1:   # one request's rows past it would change every request's RoPE
        logger.warning("%s's RoPE changes for a whole forward once a position in it reaches %d: requests are "
                       "decoded one at a time (batch_size %d -> 1) to stay exact", type(model).__name__, threshold,
                       batch_size)
        batch_size = 1
    ceiling, reencode_at = draft_ceiling(model.config), reencode_position(model.config)
    comm = comm or Comm()
    stats = stats if stats is not None else BatchStats()
    pending = iter(prompts)
    rounds = Rounds(model, lookahead, generation, comm, compile_mode, sampling_on_device, kinds, row_cost,
                    batch_size, draft_cost, eos_token_ids, row_processor)
    active: list[RequestState] = []
    prefixes = RowPrefixes(batch_size) if lookahead.prefix_reuse and batch_size > 1 else None
    vocab = input_vocab(model)

    def start(key, ids, request, seen=None) -> RequestState | ValueError:
        nonlocal prompt_tokens
        ids = [int(t) for t in ids]
        if not ids:
            return ValueError("input_ids is empty: lookahead needs at least one prompt token")
        outside = outside_vocabulary(ids, vocab)
        if outside is not None:
            return ValueError(outside)
        if rounds.cache is None:
            prompt_tokens = prompt_tokens or len(ids)
            rounds.cache = round_cache(model, cache_need(prompt_tokens, lookahead, generation.max_new_tokens,
                                                         rounds.fit), batch_size)
            rounds.cache.busy = True     # a decode started from a callback of this one gets a cache of its own
        need = cache_need(len(ids), lookahead, generation.max_new_tokens, rounds.fit)
        if need > rounds.cache.length:
            return ValueError(f"prompt has {len(ids)} tokens: with max_new_tokens={generation.max_new_tokens} it "
                              f"needs {need} cache slots, more than the {rounds.cache.length} this batch's cache "
                              f"holds (sized for prompts of up to {prompt_tokens} tokens)")
        state = RequestState(key, ids, lookahead, generation, request=request, leader=comm.rank == 0,
                             corpus=corpus, eos_token_ids=eos_token_ids, tokenizer=tokenizer, row=len(active),
                             streamer=streamer, ceiling=ceiling, reencode_at=reencode_at,
                             seen_prompt=seen, stop_when=stop_when)
        if prefixes is not None:         # its prefill starts after the longest prefix a cache row holds
            source, slots = prefixes.best(ids, state.row, {s.row: s.in_cache for s in active})
            if slots:
                if source != state.row:
                    copy_prefix(rounds.cache, source, state.row, slots)
                state.reuse(slots)
        return state

    def ended() -> Iterator[tuple[Any, GenerationResult | Exception]]:
        """The requests that ended leave; the others move down to the lowest cache rows (their
        committed slots: a round writes the slots after them before it reads them)."""
        nonlocal active
        for state in [s for s in active if s.done]:
            if prefixes is not None:
                prefixes.left(state.row, state.in_cache)
            yield state.key, state.finish()
        active = [s for s in active if not s.done]
        for row, state in enumerate(active):
            if state.row != row:
                copy_prefix(rounds.cache, state.row, row, state.cached)
                if prefixes is not None:     # the row it left still holds a copy
                    prefixes.left(state.row, state.in_cache)
                state.row = row

    more = True
    try:
        with heap_frozen():
            while True:
                while more and len(active) < batch_size:
                    item = next(pending, None)
                    if item is None:
                        more = False
                        break
                    state = start(*item)
                    if isinstance(state, ValueError):
                        yield item[0], state
                        continue
                    active.append(state)
                    rounds.run([state], stats)          # its prefill, alone: no other request pads to its length
                    yield from ended()
                if not active:
                    return
                rounds.run(active, stats)
                yield from ended()
    finally:
        if rounds.cache is not None:
            rounds.cache.busy = False


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Python's cyclic garbage collector leaves the objects that exist on entry alone until exit
    (gc.freeze, then gc.unfreeze). The drafts' indexes make long-lived objects as a job goes, so full
    collections come while it decodes, and each walked the model and its libraries too (about 400,000
    objects), stopping every request in the batch: 230-270 ms each on the 2-core CPU, against 2-9 ms
    frozen (scripts/bench_gc.py). Nothing changes where the caller froze objects itself before the decode
    or turned the collector off (the unfreeze would thaw its objects too); a caller that freezes while a
    decode is suspended has that freeze undone when the decode ends. A caller that stops reading the
    decode early should close it (the thaw runs then, or when it is collected)."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Rounds:
    """Runs one round for a list of requests (their rows packed into one forward): the tree shared
    across the LP group, this rank's rows of each request, one upload, the forward, verification
    and the payload per request on the device, publication, one gathered read, and each request's
    commit."""

    def __init__(self, model, lookahead: LookaheadParams, generation: GenerationParams, comm: Comm,
                 compile_mode: str, sampling_on_device: bool | None, kinds,
                 row_cost: Callable[[int, int], float] | None = None, batch_size: int = 1, draft_cost: float = 0.0,
                 eos_token_ids: Sequence[int] = (), row_processor: RowProcessor | None = None):
        self.model, self.comm, self.kinds, self.draft_cost, self.batch_size = model, comm, kinds, draft_cost, batch_size
        # the budget reads the same (requests, rows) cells round after round: each read off the grid once
        self.row_cost = lru_cache(maxsize=None)(row_cost) if row_cost is not None else None
        self.backoff = DraftBackoff()
        self.tree_budget = lookahead.tree_budget or None
        self.acceptance, self.offered = Acceptance(), None      # the row budget's learned chances
        self.width, self.capacity = lookahead.width, lookahead.capacity   # deepest node; most nodes
        w, n = lookahead.window, lookahead.ngram
        self.deep_slots = w + n - 2 if w else 0  # widest deepest level a rank can hold (first warmup round)
        self.device = next(model.parameters()).device
        self.compiled = compiled_forward(model, compile_mode)
        self.fit = bucket if self.compiled is not None else (lambda q: q)
        self.on_device = self.device.type != "cpu" if sampling_on_device is None else sampling_on_device
        self.warp = warpers(generation, self.device) if generation.sampling else None
        self.processors = (Processors(generation, eos_token_ids, self.device, logits_size(model))
                           if Processors.wanted(generation, eos_token_ids) else None)
        self.row_processor = row_processor
        self.uploader = Uploader(self.device)
        # the payload's fixed operands, made once: its zeros and its deepest level's padding
        self.zeros = torch.zeros(batch_size, self.width + 1, dtype=torch.long, device=self.device)
        self.filler = torch.full((batch_size, self.deep_slots), -1, dtype=torch.long, device=self.device)
        self.cache = None

    def run(self, states: list[RequestState], stats: BatchStats) -> None:
        comm, cache, n, width = self.comm, self.cache, len(states), self.width
        round_start, collectives, bytes_moved = time.perf_counter(), comm.collectives, comm.bytes_moved
        prefill = n == 1 and states[0].result.forwards == 0      # a joining request's first round, alone
        trees = self.share_trees(self.propose(states, prefill) if comm.rank == 0 else None, n)
        plans = []
        for state, tree in zip(states, trees):
            mine = shard_plan(comm.world, state.columns, len(state.levels), tree.units(), len(state.ordinary))
            plans.append(state.plan(tree, mine[comm.rank].columns, mine[comm.rank].subtrees))
        sections, shape = pack_round(plans, [s.cached for s in states], [s.row for s in states], width, self.fit,
                                     self.compiled is not None)
        if self.warp is not None and self.on_device:      # the walk's draws, every request padded alike
            sections["draws"] = draw_words(plans, [s.draws for s in states], [s.generated for s in states],
                                           shape.nodes)
        if self.processors is not None:     # what generate's processors need: fresh tokens, held rows, bans
            sections.update(self.processors.sections(states, plans, shape.deep, shape.nodes))

        forward_start = time.perf_counter()      # from here on: the upload, device work, one read
        dev = self.uploader.send(sections)
        span = attended(max(s.cached for s in states) + shape.q, cache.length, self.compiled is not None)
        logits, seen, slots = forward_round(self.model, dev, n, shape, states[0].row, cache, self.kinds, self.compiled,
                                            span)
        frame = logits[:, shape.k - shape.frame:]        # [n, D + 1 + N, V]: deep frame, z*'s row, node frame
        v = {name: dev[name].view(n, -1) for name in ("tok", "par", "depth", "step", "dst", "meta", "rows")}
        nodes, d = shape.nodes, shape.deep
        v["nslot"] = slots[:, shape.q - nodes:]         # the node frame's cache slots
        ancestors = None
        if nodes or self.warp is not None or self.processors is not None:
            ancestors = seen[:, shape.q - nodes:].gather(2, v["nslot"][:, None, :].expand(n, nodes, nodes))
        logits_frame = frame
        if self.processors is not None:                 # each row's own penalty and EOS hold-back
            frame = self.processors.apply(frame, d, states, dev, v["tok"], ancestors)
        processing = 0.0
        if self.row_processor is not None:              # then the caller's, each row after its own input
            if self.device.type == "cuda":   # its calls read rows back anyway: their time is the host's
                torch.cuda.synchronize(self.device)
            processing = time.perf_counter()
            frame = process_by_input(frame, d, states, plans, self.row_processor,   # eager logits are ours
                                     writable=self.compiled is None or frame is not logits_frame)
            processing = time.perf_counter() - processing
        predicted = greedy_ids(frame)                   # the window stays greedy whatever the sampling
        if ancestors is not None:   # z*'s row and the node frame's: what verification reads
            first, off_path, emitted = self.verdict(states, plans, shape, dev, v, frame[:, d:], predicted[:, d:],
                                                    ancestors)
        else:        # greedy, no tree on this rank: z* alone
            first, off_path, emitted = predicted[:, d], v["tok"] < 0, v["tok"]
        hits, node, after, slot = path_verdicts(first, off_path, emitted, v["depth"], v["step"], v["meta"][:, 0],
                                                width, self.zeros)
        payload = pack_payloads(first, hits, node, v["meta"][:, 1:], after, predicted[:, :shape.deep],
                                self.deep_slots, self.filler)
        if comm.world == 1 and nodes:      # the accepted paths' K/V to their frontiers, on the device
            reach = max(p.tree.max_depth for p in plans)      # no path is deeper than its tree
            publish(cache, v["dst"].scatter(1, slot, v["nslot"])[:, :reach], v["dst"][:, :reach], v["rows"])
        gathered = comm.all_gather(payload.flatten()).tolist()   # the round's one read
        forward_seconds = time.perf_counter() - forward_start - processing

        size, vocab = len(gathered[0]) // n, frame.shape[-1]
        for i, (state, plan) in enumerate(zip(states, plans)):
            decision = decide([row[i * size:(i + 1) * size] for row in gathered], width)
            if self.warp is not None and max(decision.emitted) >= vocab:      # `draw` found no total
                state.fail(NoDistribution(state.generated + decision.emitted.index(max(decision.emitted))))
                continue
            if self.offered is not None:        # the budget learns which of the offered nodes were accepted
                self.acceptance.observe(self.offered[i], plan.tree.depths,
                                        set(plan.tree.path(decision.node)) if decision.hits else set())
            state.commit(decision, plan, comm.world)
        self.offered = None
        host = time.perf_counter() - round_start - forward_seconds
        for state in states:
            state.result.host_seconds += host
            state.result.collectives += comm.collectives - collectives     # the round's, for each request in it
            state.result.bytes_moved += comm.bytes_moved - bytes_moved
            state.result.batch_per_round.append(n)
            state.result.fed_rows_per_round.append(shape.q)
        stats.rounds += 1
        stats.occupancy += n
        stats.rows += n * shape.q
        if prefill:
            stats.prefills += 1
            stats.prefill_rows += shape.q

    def propose(self, states: list[RequestState], prefill: bool = False) -> list[TokenTree]:
        """The leader's trees for the round: each request's candidates, cut by the row budget when
        there is one (the rows of one worker: base rows, then the best nodes)."""
        if self.row_cost is None:
            return [s.proposer.tree(s.draft_depth) for s in states]
        if not self.backoff.drafts():           # the last rounds' trees did not pay: no drafting either
            return [EMPTY] * len(states)
        builders = [s.proposer.candidates(s.draft_depth) for s in states]
        chances = [ranked_chances(b, self.acceptance, self.tree_budget) for b in builders]
        # a joining request's prefill holds up the batch: its nodes must earn what a full batch's plain
        # decoding round earns in the same seconds
        floor = self.batch_size / self.row_cost(self.batch_size, 1) if prefill and self.batch_size > 1 else 0.0
        _, keep = rows_per_request([s.base_rows() for s in states], chances, self.row_cost, self.draft_cost, floor)
        if any(chances):                         # there were nodes to weigh
            self.backoff.kept(any(keep))
        built = [b.build_scored(k) for b, k in zip(builders, keep)]
        self.offered = [scores for _, scores in built]       # observed against the decisions
        return [tree for tree, _ in built]

    def share_trees(self, trees: list[TokenTree] | None, n: int) -> list[TokenTree]:
        """The leader's trees for the round's `n` requests on every rank of the group (one broadcast)."""
        if self.comm.alone:             # the leader's own trees: nothing to flatten or send
            return trees
        rows = None if trees is None else [row for tree in trees for row in (tree.tokens, tree.parents)]
        shared = self.comm.share_rows(rows, self.capacity, 2 * n)
        return trees if trees is not None else [TokenTree.from_parents(shared[2 * i], shared[2 * i + 1])
                                                for i in range(n)]

    def verdict(self, states: list[RequestState], plans: list[RoundPlan], shape: Packed,
                dev: dict[str, torch.Tensor], v: dict[str, torch.Tensor], target: torch.Tensor,
                chosen: torch.Tensor, ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every request's verdict on this rank's nodes, on the device: (the first token [n], which
        node-frame entries are off the accepted path [n, N], what each node emits after itself
        [n, N]), from `target` [n, 1 + N, V] (z*'s row, then the node frame's: scores) and
        `chosen` (their argmax). Greedy: z* and the argmax path, for the whole batch at once;
        sampling: every request's walk at once on the device, or each request's on the host
        reading rows lazily."""
        if self.warp is None:
            return chosen[:, 0], node_mismatch(chosen, v["tok"], v["par"], ancestors), chosen[:, 1:]
        if self.on_device:      # every request's walk at once
            rest = dev["draws"].view(torch.float64).view(len(plans), 1 + shape.nodes)
            return tree_sampling_verdict(distribution(target, self.warp), v["tok"], v["par"], ancestors, rest)
        firsts, off, emits = [], [], []
        for i, (state, plan) in enumerate(zip(states, plans)):
            count, nodes = len(plan.nodes), plan.nodes
            rows = target[i, :1 + count]                 # z*'s row, then the request's nodes
            sampled = verify_tree_sampling(distribution(rows[0], self.warp), plan.tree,
                                           lambda u: distribution(rows[1 + u - nodes.start], self.warp),
                                           state.draws, state.generated, owned=lambda u: u in nodes)
            path = plan.tree.path(sampled.node) if sampled.hits else []
            on, out = [True] * count, [0] * count
            for depth, u in enumerate(path, 1):
                on[u - nodes.start], out[u - nodes.start] = False, sampled.emitted[depth]
            token, off_path, emitted = (torch.tensor(x, dtype=t, device=self.device)  # on the rows' device:
                                        for x, t in ((sampled.emitted[0], torch.long), (on, torch.bool),
                                                     (out, torch.long)))       # the payload joins them
            pad = shape.nodes - count
            firsts.append(token)
            off.append(torch.nn.functional.pad(off_path, (0, pad), value=True))
            emits.append(torch.nn.functional.pad(emitted, (0, pad)))
        return torch.stack(firsts), torch.stack(off), torch.stack(emits)


def draw_words(plans: Sequence[RoundPlan], draws: Sequence[Draws], starts: Sequence[int],
               nodes: int) -> list[int]:
    """The device walk's draws for every request of the round: each row's (the root, then this
    rank's nodes, then PAD rows up to `nodes`) at its position, the request's `start` (new tokens
    so far) plus its depth (the root and PAD rows: 0), as Draws.words writes them."""
    out: list[int] = []
    for plan, draw, start in zip(plans, draws, starts):
        depths = plan.tree.depths
        out += draw.words(start, [0, *(depths[u] for u in plan.nodes), *[0] * (nodes - len(plan.nodes))])
    return out
