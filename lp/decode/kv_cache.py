"""Every call that touches the transformers cache or the model forward, in one place.

`RoundCache` is a static K/V cache sized once (prompt + max_new_tokens + the
largest round, rounded up to a power of two): each layer's keys and values are
preallocated [batch, heads, length, dim] views, at fixed addresses, of one
stacked buffer per layer shape (one cache row per request of a batch), in the
heads and head sizes that layer writes (read off the model by one probe
forward: MLA keys and values differ in head size). A round writes its rows to
their cache slots of each request's row in place (`index_copy_`; `index_put_`
for several requests, each at its own slots), the model attends over the
slots in use through the round's mask (which hides every slot past the
round), and publication copies the accepted rows to the frontier in place,
in one gather and one scatter per stacked buffer: no per-layer concatenation,
no reallocation, fixed shapes, so the forward can be captured by
torch.compile and CUDA graphs. The engine tracks how many slots are
committed; stale slots beyond are masked and overwritten later.

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
from contextlib import contextmanager
from functools import lru_cache
from typing import NamedTuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lp.decode.arch import position_limit
from lp.messages import one_line

SLOT_QUANTUM = 256      # the smallest cache; lengths are powers of two: few distinct shapes per job
COMPILE_MODES = ("off", "default", "reduce-overhead")


class _Frame:
    """A RoundCache's fixed sizes and what its next forward writes and reads (`rows`, `slots`, `span`),
    shared by the cache and its layers. Not the cache itself: layers pointing back at it made a cycle,
    so a dropped cache (a deleted model's) kept its buffers until a collection came."""

    def __init__(self, length: int, batch: int, batch_index: torch.Tensor):
        self.length, self.batch, self.batch_index = length, batch, batch_index
        self.span = length                 # slots the next forward attends over (its mask's width)
        self.rows: slice | None = None
        self.slots: torch.Tensor | None = None


class _RoundLayer(CacheLayerMixin):
    is_compileable = True

    def __init__(self, frame: _Frame, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.frame = frame
        self.keys, self.values = keys, values            # views of the cache's stacked buffers
        torch._dynamo.mark_static_address(self.keys)     # fixed addresses: CUDA graphs replay against them
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True                       # allocated up front: no branch inside a graph

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows, slots = self.frame.rows, self.frame.slots
        keys, values = (self.keys, self.values) if rows is None else (self.keys[rows], self.values[rows])
        if slots.dim() == 1:            # one request (or every row at the same slots)
            keys.index_copy_(2, slots, key_states)
            values.index_copy_(2, slots, value_states)
        else:                           # [B, Q]: each request's rows at its own slots
            batch = self.frame.batch_index[:slots.shape[0]]
            keys[batch, :, slots] = key_states.transpose(1, 2)
            values[batch, :, slots] = value_states.transpose(1, 2)
        span = self.frame.span
        return keys[:, :, :span], values[:, :, :span]      # views: attention reads the slots in use only

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.frame.span, 0

    def get_seq_length(self) -> int:
        return 0     # the engine tracks the committed length; transformers only asks without position_ids

    def get_max_length(self) -> int:
        return self.frame.length


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
            # a token other than the pad id: a pad id and no mask draw transformers' padding warning, and a mask
            # costs a host read in its mask creation
            token = 1 if getattr(model.config, "pad_token_id", None) == 0 else 0
            forward(model, probe, input_ids=torch.full((1, 1), token, dtype=torch.long, device=device),
                    position_ids=torch.zeros(1, 1, dtype=torch.long, device=device))
        shapes = [LayerShape(layer.keys.shape[1], layer.keys.shape[-1], layer.values.shape[1],
                             layer.values.shape[-1]) for layer in probe.layers]
        model._lp_layer_shapes = shapes
    return shapes


class RoundCache(Cache):
    """Static cache of `batch` rows of `length` slots for every layer of `model`, allocated at once
    in the model's dtype on its device, each layer in the shape it writes (`layer_shapes`). The
    keys and values of every layer of one shape are views of one stacked buffer
    [tensors, batch, heads, length, dim] (`buffers`: one for most models, two where keys and values
    differ in size), so publication and moving a row are one op per buffer whatever the depth.
    Before a forward, `rows` (a slice; None: all) picks the cache rows its batch uses, in order,
    and `slots` (a device tensor, [Q] or [B, Q]) says where each batch row's rows go, and `span`
    how many leading slots attention reads (`attended`: the slots in use, not the whole
    allocation)."""

    def __init__(self, model, length: int, batch: int = 1):
        param = next(model.parameters())
        self.length, self.batch = length, batch
        self.dtype, self.device = param.dtype, param.device
        self.busy = False                  # a decode is using it (lp.engine.decode_batch)
        shapes = layer_shapes(model)
        kinds = [(s.key_heads, s.key_dim) for s in shapes] + [(s.value_heads, s.value_dim) for s in shapes]
        groups = list(dict.fromkeys(kinds))
        size = cache_bytes(model, length, batch)
        free = free_bytes(param.device)
        if free is not None and size > free:     # refused before torch tries (a CPU process would be killed)
            raise MemoryError(f"the K/V cache of {batch} request row(s) x {length} slots needs {_size(size)} and "
                              f"{param.device} has {_size(free)} free: lower max_new_tokens (a row holds the "
                              f"prompt, max_new_tokens and one round, to a power of two) or batch_size")
        self.batch_index = torch.arange(batch, device=param.device)[:, None]
        self.frame = _Frame(length, batch, self.batch_index)
        self.numbers = torch.arange(length + 1, device=param.device)    # slot numbers for the round's mask
        self.buffers = [torch.zeros(kinds.count(g), batch, g[0], length, g[1], dtype=param.dtype, device=param.device)
                        for g in groups]
        for buffer in self.buffers:
            torch._dynamo.mark_static_address(buffer)
        taken = [0] * len(groups)

        def view(kind):
            g = groups.index(kind)
            taken[g] += 1
            return self.buffers[g][taken[g] - 1]
        keys = [view(k) for k in kinds[:len(shapes)]]
        super().__init__(layers=[_RoundLayer(self.frame, k, view(v)) for k, v in zip(keys, kinds[len(shapes):])])

    # what the next forward writes and reads, kept in the frame its layers share
    rows = property(lambda self: self.frame.rows, lambda self, rows: setattr(self.frame, "rows", rows))
    slots = property(lambda self: self.frame.slots, lambda self, slots: setattr(self.frame, "slots", slots))
    span = property(lambda self: self.frame.span, lambda self, span: setattr(self.frame, "span", span))

    def release(self) -> None:
        """Let go of the buffers and of the layers at once (whoever still holds the cache)."""
        self.layers, self.buffers = [], []


def cache_bytes(model, length: int, batch: int = 1) -> int:
    """The bytes of a RoundCache of `batch` rows of `length` slots on `model`."""
    shapes = layer_shapes(model)
    per_slot = sum(s.key_heads * s.key_dim + s.value_heads * s.value_dim for s in shapes)
    return per_slot * batch * length * next(model.parameters()).element_size()


def free_bytes(device: torch.device) -> int | None:
    """Memory a new allocation on `device` can take: CUDA's free memory plus what torch's allocator holds
    unused; on the CPU, Linux's MemAvailable (None where the system does not say)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


SPAN_QUANTUM = 128      # attention reads the used slots rounded up to this (compiled rounds: a power of two)


def attended(need: int, length: int, compiled: bool = False) -> int:
    """The slots a forward attends over when its rows reach slot `need`: rounded up to SPAN_QUANTUM
    (a power of two from SLOT_QUANTUM for compiled rounds: few shapes), at most `length`."""
    span = cache_length(need) if compiled else -(-need // SPAN_QUANTUM) * SPAN_QUANTUM
    return min(span, length)


def cache_length(need: int) -> int:
    """The slots a cache for `need` gets: the smallest power of two from SLOT_QUANTUM up."""
    return max(SLOT_QUANTUM, 1 << (need - 1).bit_length())


def round_cache(model, need: int, batch: int = 1) -> RoundCache:
    """A cache of `batch` rows of at least `need` slots (`cache_length`), one cache per shape kept
    on the model, so a request always gets the same cache (the same shapes for compiled rounds,
    the same addresses for CUDA graphs) whatever ran before it. A cache of another batch size is
    dropped first: a job holds one batch's cache at a time. One-row caches of other lengths stay
    (a job's requests need a few lengths, and a dropped one would be made, and its compiled rounds
    captured, again), unless the new one does not fit in the free memory beside them: then they are
    dropped, the longest first, until it fits (a library caller's long request does not make a
    later one fail). Caches made before the model moved to another dtype or device are dropped. A
    cache a decode is using (`busy`: a decode called again from its own callbacks, or a decode_batch
    generator read in turns with another on the same model; the library runs threads' calls one at a
    time) is never handed out or dropped: the new decode gets a cache of its own, not kept."""
    key = (batch, cache_length(need))
    caches = model.__dict__.setdefault("_lp_round_caches", {})
    param = next(model.parameters())
    for other in [k for k, c in caches.items() if (c.dtype, c.device) != (param.dtype, param.device) and not c.busy]:
        caches.pop(other).release()
    kept = caches.get(key)
    if kept is not None and not kept.busy:
        return kept
    size = cache_bytes(model, key[1], batch)
    batched = batch > 1 or any(b > 1 for b, _ in caches)
    for other in sorted((k for k, c in caches.items() if not c.busy), key=lambda k: k[1], reverse=True):
        free = None if batched else free_bytes(param.device)
        if not batched and (free is None or size <= free):
            break
        caches.pop(other).release()       # freed now, whoever still holds it
    cache = RoundCache(model, key[1], batch)
    if kept is None:
        caches[key] = cache
    return cache


def publish(cache: RoundCache, src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor) -> None:
    """Copy the K/V of slots `src` to slots `dst` [n, W] of cache rows `rows` [n, 1] in every layer,
    in place (two ops per stacked buffer); a pair with src == dst is a no-op."""
    for buffer in cache.buffers:
        buffer[:, rows, :, dst] = buffer[:, rows, :, src]


def copy_prefix(cache: RoundCache, src: int, dst: int, slots: int) -> None:
    """Copy the K/V of the first `slots` slots of cache row `src` to row `dst` in every layer, in
    place (one op per stacked buffer: lp/decode/prefix.py)."""
    for buffer in cache.buffers:
        buffer[:, dst, :, :slots].copy_(buffer[:, src, :, :slots])


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


def given_cache_tokens(model_kwargs: dict) -> int:
    """How many tokens a caller's cache in generate's `model_kwargs` holds (under either name this
    transformers range uses; generate puts a fresh, empty one there itself)."""
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    return int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0


def forward(model, cache, **kwargs):
    """`model(**kwargs)` with `cache` passed under the name this transformers knows."""
    return model(use_cache=True, **kwargs, **_round_kwargs(model, cache))


def _round_kwargs(model, cache) -> dict:
    """What lp passes every forward besides the round: the cache, under the name this transformers knows,
    and no router logits (a mixture of experts whose config asks for them computes its load-balancing
    loss from the attention mask, which it takes for a 2-D padding mask: lp's is 4-D, or a dict; the
    loss changes no logit)."""
    kwargs = {_cache_kwarg(type(model)): cache}
    if getattr(model.config, "output_router_logits", False):
        kwargs["output_router_logits"] = False
    return kwargs


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention (`sdpa_attention_forward`, same arguments and result) for a
    round on the CPU, with grouped K/V heads never repeated. transformers repeats them whenever a
    mask is given (its `use_gqa_in_sdpa`; 5.17 to 5.25): a copy of the whole attended cache per
    layer and forward. Rows of several queries go to SDPA packed: the query heads that share a
    K/V head are stacked along the rows, [B, kv heads, groups x Q, D], with the mask repeated to
    match (made once per forward: every layer of a round gets the same mask tensor), so each K/V
    head is read once for its whole group; the CPU's flash kernel computes each query row alone,
    so the outputs are the same bits as with `enable_gqa`, which is what single-row queries get
    (it is the faster of the two at one row, slower at several: docs/benchmarks.md, "Grouped heads
    packed"). Anything else (no groups, no tensor mask, unequal key and value sizes as in MLA,
    position bias, softcapping, sinks, dropout) goes to transformers' own function."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, rows, size = query.shape
    plain = (groups == 1 or not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4
             or dropout or key.shape[-1] != value.shape[-1] or key.shape[1] * groups != heads
             or attention_mask.shape[1] not in (1, heads) or attention_mask.shape[2] != rows
             or any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "s_aux", "sinks")))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                      **kwargs)
    if rows == 1:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               scale=scaling, enable_gqa=True)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, heads // groups, groups * rows, size), key, value,
            attn_mask=_packed_mask(attention_mask, groups), scale=scaling)
    return out.reshape(batch, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None


_PACKED: list = [None, None]       # the last mask packed and its packing (a round's layers share it)


def _packed_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """`mask` [b, 1 or heads, Q, S] for query heads stacked by group: [b, 1 or kv heads, groups x Q, S]
    (kept for the next layer's call outside compiled graphs: inside one, the graph keeps it)."""
    if _PACKED[0] is mask:
        return _PACKED[1]
    b, h, q, s = mask.shape
    shared = mask.expand(b, groups, q, s) if h == 1 else mask.view(b, h // groups, groups, q, s)
    packed = shared.reshape(b, 1 if h == 1 else h // groups, groups * q, s)
    if not torch.compiler.is_compiling():
        _PACKED[:] = mask, packed
    return packed


@contextmanager
def _grouped_heads():
    """While a round's forward runs on the CPU, transformers' "sdpa" attention is `grouped_sdpa`
    (set on the shared attention table, restored after, with the packed mask it kept)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS     # heavy: imported when a forward runs
    before = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
    ALL_ATTENTION_FUNCTIONS["sdpa"] = grouped_sdpa
    try:
        yield
    finally:
        if before is None:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
        else:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = before
        _PACKED[:] = None, None


# SDPA's backends for a round on CUDA: every one but cuDNN's fused attention, which torch tries
# first on Hopper and which fails outright on some of a round's shapes with an explicit mask (an
# H200, torch 2.11: `mha_graph.execute(...).is_good()` on the batched row budget's probe rounds;
# pytorch/pytorch#134001). Flash takes no mask; the memory-efficient kernel and math take any.
ROUND_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


@contextmanager
def _round_sdpa(device: torch.device):
    """The attention a round's forward runs with. On CUDA: SDPA limited to ROUND_SDPA_BACKENDS,
    and grouped K/V heads repeated as transformers does with a mask (without cuDNN, the only
    kernels that take grouped heads with a mask on the torch the GPU machine has are math's: the
    memory-efficient kernel learned them only in mid-2026, pytorch/pytorch#191085). Elsewhere:
    grouped heads unrepeated (`grouped_sdpa`)."""
    with sdpa_kernel(list(ROUND_SDPA_BACKENDS)) if device.type == "cuda" else _grouped_heads():
        yield


def forward_logits(model, input_ids, position_ids, mask, cache, logit_rows, slots=None,
                   compiled=None) -> torch.Tensor:
    """One forward over a round's rows [B, Q]; logits [B, K, V] for `logit_rows` only. With a
    RoundCache, `slots` are the cache slots the rows are written to; `compiled` is a compiled model
    call."""
    if slots is not None:
        cache.slots = slots
    if isinstance(cache, RoundCache):       # attention reads as many slots as the mask is wide
        cache.span = next(iter(mask.values())).shape[-1] if isinstance(mask, dict) else mask.shape[-1]
    call = compiled or model
    try:
        with _round_sdpa(input_ids.device):
            out = call(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                       logits_to_keep=logit_rows, use_cache=True, **_round_kwargs(model, cache))
    except torch._dynamo.exc.TorchDynamoException as e:      # tracing or lowering failed (a compiled call)
        if compiled is None or out_of_memory(e.__cause__ or e):     # memory keeps its own error (and advice)
            raise
        raise CompileFailed(f"torch.compile could not compile {type(model).__name__}'s round forward "
                            f"({one_line(e, limit=300)}); known cases: linears packed for oneDNN (lp.models' "
                            f"cpu_linear onednn) and mixture-of-experts layers in transformers' eager expert loop "
                            f"(float64); decode without compiling (model.compile: off in a job, compile_mode='off' "
                            f"in lookahead_generate)") from e
    except (IndexError, RuntimeError) as e:
        raise _past_the_table(model, position_ids, e) or e
    return out.logits


def out_of_memory(e: BaseException) -> bool:
    """A failed allocation: torch's (CUDA, or the CPU allocator's RuntimeError) or Python's."""
    return isinstance(e, (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError)) or (
        isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


class CompileFailed(ValueError):
    """torch.compile could not trace or lower a model's round forward (a job ends with its one line)."""


def _past_the_table(model, position_ids: torch.Tensor, error: Exception) -> ValueError | None:
    """The error to raise, naming the limit, when a forward failed indexing out of range (on the CPU: CUDA
    reports that as a device-side assert) with a row at or past the model's context length (its position
    table ends there: GPT-2's, CodeGen's), where generate fails as well; None for any other failure (a RoPE
    model runs past that length: its errors there are its own). Read on the error path only (it syncs)."""
    text = str(error)
    if "out of range" not in text and "out of bounds" not in text:       # an out-of-memory error, say
        return None
    limit, last = position_limit(model.config), int(position_ids.max())
    if limit is None or last < limit:
        return None
    return ValueError(f"a request reached position {last}, past the model's {limit} positions "
                      f"(max_position_embeddings): its prompt and new tokens must fit in them, as generate's must")
