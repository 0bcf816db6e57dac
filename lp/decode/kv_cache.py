"""Every call that touches the transformers cache or the model forward, in one place.

Supported range: transformers 5.17 .. 5.x. Differences handled here:
- 5.24 names the forward's cache argument `cache` (the old `past_key_values`
  still works there with a deprecation warning); 5.17 only knows
  `past_key_values`. We pick the name from the forward's signature once.
- `DynamicCache.crop` takes a negative count (tokens to drop) in both; a
  positive argument raises in 5.24, so we only ever pass negatives.
"""
from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions."""
    drop = cache_length(cache) - length
    if drop < 0:
        raise ValueError(f"cannot crop a cache of {cache_length(cache)} positions to {length}")
    if drop:
        cache.crop(-drop)


def publish(cache: DynamicCache, committed: int, accepted: list[int]) -> None:
    """Keep positions [0, committed) plus the `accepted` positions (increasing, all
    >= committed), moved to sit right after the committed prefix; drop the rest."""
    if accepted:
        src = torch.tensor(accepted, dtype=torch.long)
        dst = slice(committed, committed + len(accepted))
        for layer in cache.layers:
            s = src.to(layer.keys.device)
            layer.keys[:, :, dst] = layer.keys.index_select(2, s)
            layer.values[:, :, dst] = layer.values.index_select(2, s)
    crop(cache, committed + len(accepted))


@lru_cache(maxsize=None)
def _cache_kwarg(forward_cls: type) -> str:
    params = inspect.signature(forward_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(model, cache, **kwargs):
    """`model(**kwargs)` with `cache` passed under the name this transformers knows."""
    kwargs[_cache_kwarg(type(model))] = cache
    return model(use_cache=True, **kwargs)


def forward_logits(model, input_ids, position_ids, mask, cache, logit_rows) -> torch.Tensor:
    """One forward over the round's rows; logits [K, V] for `logit_rows` only."""
    out = forward(model, cache, input_ids=input_ids, position_ids=position_ids,
                  attention_mask=mask, logits_to_keep=logit_rows)
    return out.logits[0]
