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

from lp.decode.arch import check_model
from lp.decode.device import Uploader, uniforms
from lp.decode.kv_cache import COMPILE_MODES, compiled_forward, forward_logits, publish, round_cache
from lp.decode.layout import bucket, build_round, descriptors, round_mask
from lp.decode.params import GenerationParams, LookaheadParams, check
from lp.decode.propose import Proposer
from lp.decode.sampling import (Draws, children_lists, distribution, tree_sampling_verdict, verify_tree_sampling,
                                warpers)
from lp.decode.stopping import StopChecker
from lp.decode.suffix import SuffixIndex
from lp.decode.tree import TokenTree
from lp.decode.verify import decide, pack_payload, path_verdict, tree_verdict
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
    rows_per_round: list[int] = field(default_factory=list)       # rows this worker fed (the round it packed)
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
    corpus: SuffixIndex | None = None,
    compile_mode: str = "off",
    sampling_on_device: bool | None = None,
    streamer=None,
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
    prompt is the caller's to put, as `generate` puts it before decoding."""
    check(lookahead, generation)
    kinds = check_model(model)      # each layer type's attention rule; refuses what cannot be exact
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode {compile_mode!r} must be one of {', '.join(COMPILE_MODES)}")
    comm = comm or Comm()
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: lookahead needs at least one prompt token")
    n, w = lookahead.ngram, lookahead.window
    width, capacity = lookahead.width, lookahead.capacity   # deepest node; most nodes
    deep_slots = w + n - 2 if w else 0  # widest deepest level a rank can hold (first warmup round)
    device = next(model.parameters()).device
    compiled = compiled_forward(model, compile_mode)
    fit = bucket if compiled is not None else (lambda q: q)
    on_device = device.type != "cpu" if sampling_on_device is None else sampling_on_device

    proposer = Proposer(lookahead, prompt, corpus) if comm.rank == 0 else None
    window = JacobiWindow.seeded(n, w, window_seed(prompt, w + n - 3)) if w else None
    levels = window.levels if window is not None else []
    stopper = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer)
    bound = round_rows_bound(lookahead, width)     # slots a round may write past the committed ones
    cache = round_cache(model, max(fit(len(prompt) + bound), len(prompt) + generation.max_new_tokens + fit(bound)))
    uploader = Uploader(device)
    tokens = list(prompt)        # committed: prompt + output
    ordinary = list(prompt)      # committed but not yet in the cache
    cached = 0                   # cache slots holding committed tokens
    warp = warpers(generation.temperature, generation.top_k, generation.top_p) if generation.sampling else None
    draws = Draws(generation.seed, request)
    result = GenerationResult([], None, "", 0)
    collectives, bytes_moved = comm.collectives, comm.bytes_moved
    start = time.perf_counter()

    while stopper.reason is None:
        round_start = time.perf_counter()
        x_t = tokens[-1]
        tree = proposer.tree() if proposer else None       # rank 0 proposes, the others receive
        shared = comm.share_rows((tree.tokens, tree.parents) if tree is not None else None, capacity)
        tree = tree if tree is not None else TokenTree.from_parents(*shared)
        columns = window.columns if window is not None else 0
        units = tree.units()                                   # whole root subtrees: the shard unit
        plan = shard_plan(comm.world, columns, len(levels), units, len(ordinary))
        mine = plan[comm.rank]
        starts = list(accumulate(units, initial=0))
        nodes = range(starts[mine.subtrees.start], starts[mine.subtrees.stop])
        rnd = build_round(ordinary, len(tokens) - 1, levels, tree, nodes, columns=mine.columns)
        q, keep = fit(len(rnd)), rnd.logit_rows
        sections = descriptors(rnd, q)
        sections["keep"] = keep + keep[-1:] * ((q if compiled else len(keep)) - len(keep))   # one shape: Q
        if warp is not None and on_device:
            sections.update(sampling_tables(tree, nodes, draws, result.forwards))
        first_row, deep = (rnd.node_rows[0] if nodes else len(rnd)), len(rnd.deep_rows)

        forward_start = time.perf_counter()      # from here on: the upload, device work, one read
        dev = uploader.send(sections)
        mask = round_mask(dev, cached, cache.length, tree.max_depth, model.dtype, kinds)
        slots = torch.arange(cached, cached + q, device=device)
        logits = forward_logits(model, dev["ids"][None], dev["pos"][None], mask.attention, cache, dev["keep"],
                                slots, compiled)[:len(keep)]
        predicted = logits.argmax(-1)            # the window stays greedy whatever the sampling
        node_tensors = _node_tensors(dev, mask.visible, first_row, len(nodes))
        if warp is None:
            head, after, path = tree_verdict(predicted[0], *node_tensors, predicted[1 + deep:],
                                             first_node=nodes.start, width=width)
        elif on_device:
            _, parents, depths, anc = node_tensors
            token, accepted, emitted = tree_sampling_verdict(
                distribution(torch.cat([logits[:1], logits[1 + deep:]]), warp), dev["child_tokens"].view(
                    1 + len(nodes), -1), dev["child_local"].view(1 + len(nodes), -1), dev["child_count"],
                depths, parents, anc, uniforms(dev["draws"]).view(tree.max_depth + 1, -1))
            head, after, path = path_verdict(token, accepted, depths, emitted, nodes.start, width)
        else:
            sampled = verify_tree_sampling(
                distribution(logits[0], warp), tree,
                lambda u: distribution(logits[1 + deep + u - nodes.start], warp),
                draws, result.forwards, owned=lambda u: u in nodes)
            walked = [u - nodes.start for u in tree.path(sampled.node)] if sampled.hits else []
            verdict = torch.tensor([sampled.emitted[0], sampled.hits, sampled.node,      # on the rows' device:
                                    *(sampled.emitted[1:] + [0] * width)[:width],      # the payload joins it
                                    *(walked + [0] * width)[:width]], device=device)  # with device tensors
            head, after, path = verdict[:3], verdict[3:3 + width], verdict[3 + width:]
        payload = pack_payload(head, after, predicted[1:1 + deep], deep_slots, len(rnd))   # rows really fed
        frontier = cached + len(ordinary)
        if comm.world == 1 and len(nodes):       # the accepted path's K/V to the frontier, on the device
            step = torch.arange(width, device=device)
            dst = frontier + step
            publish(cache, torch.where(step < head[1], cached + first_row + path, dst), dst)
        decision = decide(comm.all_gather(payload).tolist(), width)   # the round's one read
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
        if streamer is not None and emitted:
            streamer.put(torch.tensor(emitted))
        if proposer is not None:
            proposer.commit(emitted, ngrams)
        if comm.world == 1:      # the accepted rows' K/V were published; the last token is next round's row
            cached = frontier + decision.hits
            ordinary = decision.emitted[-1:]
        else:                    # re-feed: the accepted rows live on one rank only
            cached = frontier
            ordinary = list(decision.emitted)

        result.forwards += 1
        result.emitted_per_round.append(len(emitted))
        result.rows_per_round.append(len(rnd))
        result.max_rows_per_round.append(max(decision.rows))
        result.host_seconds += time.perf_counter() - round_start - forward_seconds

    result.decode_seconds = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    result.token_ids = stopper.tokens
    result.text = stopper.text
    result.finish_reason = stopper.reason
    result.collectives = comm.collectives - collectives
    result.bytes_moved = comm.bytes_moved - bytes_moved
    return result


def round_rows_bound(params: LookaheadParams, width: int) -> int:
    """Most rows a decoding round can feed on one rank: re-fed ordinary rows, the widest
    window (its first warmup round) and the whole tree."""
    w, n = params.window, params.ngram
    window = (w + n - 2) * (n - 2) + (w + n - 3) if w else 0
    return width + 1 + window + params.capacity


def _node_tensors(dev: dict[str, torch.Tensor], block: torch.Tensor, first_row: int, count: int):
    """This rank's tree nodes from the uploaded rows: tokens, parents (local indices, -1: the
    root), depths and the ancestor-or-self matrix (read off the round's visibility `block`: a
    node sees exactly its ancestors and itself among the nodes), all on the device."""
    rows = slice(first_row, first_row + count)
    parent = dev["parent"][rows]
    parents = torch.where(parent >= 0, parent - first_row, -1)
    return dev["ids"][rows], parents, dev["off"][rows] + 1, block[rows, rows]


def sampling_tables(tree: TokenTree, nodes: range, draws: Draws, round_: int) -> dict[str, list[int]]:
    """What the device walk needs beside the rows: each row's children (root first, then this
    rank's nodes) as tokens and local indices in child order, their counts, and the round's
    draws by (depth, index) for every depth the tree has."""
    kids = children_lists(tree)
    rows = [-1, *nodes]
    most = max((len(kids.get(r, ())) for r in rows), default=0)
    tokens, local = [], []
    for r in rows:
        mine = kids.get(r, [])
        tokens += [tree.tokens[u] for u in mine] + [-1] * (most - len(mine))
        local += [u - nodes.start if u in nodes else -1 for u in mine] + [-1] * (most - len(mine))
    return {"child_tokens": tokens, "child_local": local,
            "child_count": [len(kids.get(r, ())) for r in rows],
            "draws": draws.table(round_, tree.max_depth + 1, most + 1)}
