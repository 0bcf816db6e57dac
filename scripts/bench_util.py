"""Baselines the benchmark scripts share: transformers `generate` with its target forwards
and their rows counted, so S and rows per round compare across systems."""
from __future__ import annotations

import time
from typing import NamedTuple

import torch


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
