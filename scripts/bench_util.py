"""What the benchmark scripts share: transformers `generate` with its target forwards and their rows
counted, so S and rows per round compare across systems; the check of an output file's path; signals
that end a script as Ctrl-C does, so that lp.processes.stop_tree stops what it launched."""
from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

import click
import torch


def writable_file(ctx, param, value):
    """click callback of a file option the script writes at its end: the path is checked before the
    benchmark runs (a long run must not end in a traceback and no figures)."""
    if value is None:
        return value
    path = Path(value)
    parent = path.parent
    if path.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or \
            (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{value}: cannot write a file there (its directory must exist and be writable)")
    return value


def seconds(ctx, param, value):
    """click callback of a duration option: a finite number of seconds > 0 (NaN passes a FloatRange)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value}: must be a finite number of seconds > 0")
    return value


class ForwardCounter:
    """Counts calls of the model's forward and the rows (query tokens) each one fed."""

    def __init__(self, model):
        self.model, self.count, self.rows, self.handle = model, 0, 0, None

    def _hook(self, module, args, kwargs, output):
        self.count += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += ids.shape[-1] if ids is not None else 0

    def __enter__(self):
        self.count = self.rows = 0
        self.handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class Generated(NamedTuple):
    ids: list[int]       # new tokens
    seconds: float
    forwards: int        # target forwards, prefill included
    rows: int            # rows fed over all forwards, prompt included


def generate(model, ids, max_new_tokens, eos, sampling: dict | None = None, **extra) -> Generated:
    """`model.generate`: greedy unless `sampling` holds do_sample=True and its settings;
    `extra` goes to generate as is (e.g. prompt_lookup_num_tokens)."""
    x = torch.tensor([ids], device=model.device)
    with ForwardCounter(model) as counter:
        start = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=eos[0], **(sampling or dict(do_sample=False)),
                             **extra)
        seconds = time.perf_counter() - start
    return Generated(out[0, len(ids):].tolist(), seconds, counter.count, counter.rows)


class Simulated(NamedTuple):
    tokens: int
    forwards: int        # prefill counted
    decode_rows: int     # rows of the decoding rounds (prefill round left out)
    decode_rounds: int


def walk_draft(token_ids, parents, target) -> int:
    """Draft nodes accepted along `target` (the tokens greedy decoding emits next):
    the root's child must be target[0], its child target[1], and so on."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    node, accepted = -1, 0
    while accepted < len(target):
        nxt = [c for c in kids.get(node, ()) if token_ids[c] == target[accepted]]
        if not nxt:
            return accepted
        node, accepted = nxt[0], accepted + 1
    return accepted


def suffix_decoding_peer(requests, budget: int, factor: float, min_prob: float = 0.0,
                         global_cache: bool = True) -> Simulated:
    """SuffixDecoding (arctic-inference's SuffixDecodingCache, the proposer behind vLLM's
    suffix decoding) simulated on greedy outputs: `requests` is a list of (prompt ids, greedy
    ids) in job order. Each forward emits the longest draft path that matches the greedy ids
    plus one token, feeds 1 + draft-size rows, and the cache learns the emitted tokens; with
    `global_cache` earlier requests' outputs are drafted from too. Raises ImportError when
    arctic-inference is not installed."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1 if global_cache else 0)
    tokens = forwards = rows = rounds = 0
    for k, (prompt, output) in enumerate(requests):
        cache.start_request(k, list(prompt))
        context, i = list(prompt), 0
        while i < len(output):
            draft = cache.speculate(k, context[-64:], max_spec_tokens=budget, max_spec_factor=factor,
                                    min_token_prob=min_prob, use_tree_spec=True)
            emitted = min(walk_draft(draft.token_ids, draft.parents, output[i:]) + 1, len(output) - i)
            if i:                                  # the first forward is the prefill round
                rows += 1 + len(draft.token_ids)
                rounds += 1
            forwards += 1
            cache.add_active_response(k, output[i:i + emitted])
            context += output[i:i + emitted]
            i += emitted
        cache.stop_request(k)
        tokens += len(output)
    return Simulated(tokens, forwards, rows, rounds)


def exit_on_term_and_hangup() -> None:
    """SIGTERM and SIGHUP end this script as Ctrl-C does, by an exception (exit status 128 + the signal),
    so that the cleanup around a child it runs in a session of its own (stop_tree) stops the child too;
    a signal that was ignored (nohup) stays ignored, and the first one's cleanup is not cut short by
    another (they are ignored from then on)."""
    def leave(sig, frame):
        for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        raise SystemExit(128 + sig)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, leave)
