"""Every call that touches the transformers cache or the model forward, in one place.

`RoundCache` is a static K/V cache sized once (prompt + max_new_tokens + the
largest round, rounded up to a power of two): each layer's keys and values are preallocated
[1, heads, length, dim] tensors at fixed addresses, in the heads and head sizes that layer writes
(read off the model by one probe forward: MLA keys and values differ in head size). A round writes its rows
to cache slots [past, past + Q) in place (`index_copy_`), the model attends
over all `length` slots through the round's mask (which hides every slot
past the round), and publication copies the accepted rows to the frontier
in place: no per-layer concatenation, no reallocation, fixed shapes, so
the forward can be captured by torch.compile and CUDA graphs. The engine
tracks how many slots are committed; stale slots beyond are masked and
overwritten later.

Supported range: transformers 5.17 .. 5.x. Differences handled here:
- 5.24 names the forward's cache argument `cache` (the old `past_key_values`
  still works there with a deprecation warning); 5.17 only knows
  `past_key_values`. We pick the name from the forward's signature once.
- Both call `cache.update(key_states, value_states, layer_idx)` from the
  attention layers and take a 4-D float attention mask as it is; our layers
  implement `CacheLayerMixin` (the same abstract methods in both).
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import NamedTuple

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

SLOT_QUANTUM = 256      # the smallest cache; lengths are powers of two: few distinct shapes per job
COMPILE_MODES = ("off", "default", "reduce-overhead")


class _RoundLayer(CacheLayerMixin):
    is_compileable = True

    def __init__(self, owner: "RoundCache", shape: "LayerShape", dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.owner = owner
        self.keys = torch.zeros(1, shape.key_heads, owner.length, shape.key_dim, dtype=dtype, device=device)
        self.values = torch.zeros(1, shape.value_heads, owner.length, shape.value_dim, dtype=dtype, device=device)
        torch._dynamo.mark_static_address(self.keys)     # fixed addresses: CUDA graphs replay against them
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True                       # allocated up front: no branch inside a graph

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.owner.slots, key_states)
        self.values.index_copy_(2, self.owner.slots, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length, 0

    def get_seq_length(self) -> int:
        return 0     # the engine tracks the committed length; transformers only asks without position_ids

    def get_max_length(self) -> int:
        return self.owner.length


class LayerShape(NamedTuple):
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int


def layer_shapes(model) -> list[LayerShape]:
    """What each layer of `model` writes to its cache per position, as the model itself writes it: one
    forward of one token through a DynamicCache, read back (MLA layers write keys and values of different
    head sizes; multi-query, grouped and per-layer head counts all come out as they are). Made once
    per model."""
    shapes = model.__dict__.get("_lp_layer_shapes")
    if shapes is None:
        device = next(model.parameters()).device
        probe = DynamicCache()
        with torch.inference_mode():
            forward(model, probe, input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
                    position_ids=torch.zeros(1, 1, dtype=torch.long, device=device))
        shapes = [LayerShape(layer.keys.shape[1], layer.keys.shape[-1], layer.values.shape[1],
                             layer.values.shape[-1]) for layer in probe.layers]
        model._lp_layer_shapes = shapes
    return shapes


class RoundCache(Cache):
    """Static cache of `length` slots for every layer of `model`, allocated at once in the model's
    dtype on its device, each layer in the shape it writes (`layer_shapes`); `slots` (a device
    tensor) says where the next forward's rows go."""

    def __init__(self, model, length: int):
        param = next(model.parameters())
        self.length = length
        self.slots: torch.Tensor | None = None
        super().__init__(layers=[_RoundLayer(self, shape, param.dtype, param.device)
                                 for shape in layer_shapes(model)])


def round_cache(model, need: int) -> RoundCache:
    """A cache of at least `need` slots: the smallest power of two from SLOT_QUANTUM up, one cache per
    size kept on the model, so a request always gets the same cache (the same shapes for compiled
    rounds, the same addresses for CUDA graphs) whatever ran before it."""
    length = max(SLOT_QUANTUM, 1 << (need - 1).bit_length())
    caches = model.__dict__.setdefault("_lp_round_caches", {})
    if length not in caches:
        caches[length] = RoundCache(model, length)
    return caches[length]


def publish(cache: RoundCache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy the K/V of slots `src` to slots `dst` in every layer, in place (device index tensors
    of one fixed length; a pair with src == dst is a no-op)."""
    for layer in cache.layers:
        layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
        layer.values.index_copy_(2, dst, layer.values.index_select(2, src))


def compiled_forward(model, mode: str):
    """`torch.compile(model.forward, fullgraph=True, dynamic=False, mode=...)`, made once per
    model and mode (None for "off"). fullgraph: a graph break is an error, not a slow path;
    dynamic=False: one graph per round shape (rounds are padded to a few sizes)."""
    if mode == "off":
        return None
    made = getattr(model, "_lp_compiled", {})
    if mode not in made:
        # one graph per round shape (a few buckets x cache lengths): allow more than dynamo's default
        for key in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, key):
                setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), 64))
        made[mode] = torch.compile(model.forward, fullgraph=True, dynamic=False,
                                   mode=None if mode == "default" else mode)
        model._lp_compiled = made
    return made[mode]


@lru_cache(maxsize=None)
def _cache_kwarg(forward_cls: type) -> str:
    params = inspect.signature(forward_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(model, cache, **kwargs):
    """`model(**kwargs)` with `cache` passed under the name this transformers knows."""
    kwargs[_cache_kwarg(type(model))] = cache
    return model(use_cache=True, **kwargs)


def forward_logits(model, input_ids, position_ids, mask, cache, logit_rows, slots=None,
                   compiled=None) -> torch.Tensor:
    """One forward over a round's rows; logits [K, V] for `logit_rows` only. With a RoundCache,
    `slots` are the cache slots the rows are written to; `compiled` is a compiled model call."""
    if slots is not None:
        cache.slots = slots
    call = compiled or model
    kwargs = {_cache_kwarg(type(model)): cache}
    out = call(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, logits_to_keep=logit_rows,
               use_cache=True, **kwargs)
    return out.logits[0]
