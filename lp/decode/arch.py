"""What a decoder architecture asks of a round, read from its config: the attention rule of each layer
type, and whether lookahead can be exact on it at all.

A round's rows see cache slots and each other by the visibility rule (lp/decode/layout.py). Layers of a
sliding-window type (Mistral, Qwen2 with `use_sliding_window`, Gemma 2/3 local layers, GPT-OSS, ...) also
hide every key whose position is `size` or more before the row's own position; chunked layers (Llama 4)
hide every key outside the row's chunk of `size` positions. Positions, not cache slots: a tree node at
position p + d stands for the token the model would see at p + d in plain decoding, and transformers'
rules (masking_utils: `kv_idx > q_idx - sliding_window`, `kv_idx // chunk == q_idx // chunk`) compare
sequence indices, which are positions there.

The layer types come from `config.layer_types` where the config has it; otherwise every layer is
sliding when `sliding_window` is set, chunked when `attention_chunk_size` is, else full (the rule the
single-mask models apply: `create_sliding_window_causal_mask` whenever `sliding_window` is not None).
Models with one layer type take one mask; models with several take a mapping from layer type to mask.

Refused (`refusal`): layers with recurrent state (Mamba/SSM, linear attention, short convolutions:
their state is not per-position K/V, so a round's rejected rows would pollute it), layers sharing
another layer's K/V, encoder-decoders, bidirectional attention (also encoder families' causal-LM heads
without `is_decoder`, and the types of BIDIRECTIONAL_BEFORE on older transformers), attention that
builds its own position bias or causal mask (ALiBi, a mask table, virtual tokens, no cache), forwards
that take no `position_ids` (the decoders of BART-style encoder-decoders, Whisper, TrOCR, ...: they
number a forward's rows from the cache's length; read off the class's signature, which the sweep and
the matrix would catch moving), Dory's 'last_loop' cache, and attention implementations other than SDPA
and eager (they ignore an explicit 4-D mask). And, read from the model rather than its config, weights
offloaded to the meta device and modules in training mode.
"""
from __future__ import annotations

import inspect
import itertools
from typing import Callable, NamedTuple, Sequence

FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")     # the two that take a round's explicit 4-D float mask
_RULES = {"full_attention": FULL, "sliding_attention": SLIDING, "chunked_attention": CHUNKED}
# families whose state is recurrent, named in case a config does not list its layer types
RECURRENT_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma", "jamba", "bamba", "zamba", "zamba2",
    "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2", "lfm2_moe", "qwen3_next", "minimax"})
# families whose attention builds its own position bias or causal mask from query/key lengths or cache
# slots (ALiBi: mpt, bloom; a fixed causal-mask table: gpt_neo; masks of their own: xlm, xlnet's
# permutations, reformer's chunks), prepends virtual tokens (cpmant) or keeps no cache (openai-gpt): a
# round's mask and slot cache cannot reach them (found wrong or failing in float64)
OWN_MASK_MODEL_TYPES = frozenset({"mpt", "bloom", "gpt_neo", "openai-gpt", "cpmant", "xlm", "xlnet", "reformer"})
# model types whose forward over several tokens attends both ways in transformers before the version given
# (their model built no causal mask, or dropped it: fixed there), so generate's ids are not a causal LM's and
# no lookahead round can match them (found by scripts/arch_sweep.py on 5.17)
BIDIRECTIONAL_BEFORE = {"big_bird": "5.18", "megatron-bert": "5.18", "rembert": "5.18", "doge": "5.18"}
# encoder families whose causal-LM head attends causally only with `is_decoder: true` (else both ways)
DECODER_FLAG_MODEL_TYPES = frozenset({
    "bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert",
    "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm-roberta", "xlm-roberta-xl", "xmod"})


class LayerAttention(NamedTuple):
    rule: str       # FULL, SLIDING or CHUNKED
    size: int = 0   # the window (SLIDING) or chunk (CHUNKED), in positions


def text_config(config):
    """The decoder's config (a multimodal or composite config's text part)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def layer_types(config) -> list[str]:
    """Each layer's attention type name, as the model's own code reads it."""
    config = text_config(config)
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    if getattr(config, "sliding_window", None) is not None:
        kind = "sliding_attention"
    elif getattr(config, "attention_chunk_size", None) is not None:
        kind = "chunked_attention"
    else:
        kind = "full_attention"
    return [kind] * config.num_hidden_layers


def attention_kinds(config) -> dict[str, LayerAttention]:
    """Layer type name -> its rule, for every type the model has (in first-layer order). Raises
    ValueError for a type that is not full, sliding or chunked attention (see `refusal`)."""
    config = text_config(config)
    kinds: dict[str, LayerAttention] = {}
    for name in layer_types(config):
        if name in kinds:
            continue
        rule = _RULES.get(name)
        if rule is None:
            raise ValueError(f"{config.model_type}: layers of type {name!r} keep state that is not per-position "
                             f"K/V, so lookahead cannot be exact on this model")
        size = getattr(config, "sliding_window", None) if rule == SLIDING else \
            getattr(config, "attention_chunk_size", None) if rule == CHUNKED else 0
        if size is None or size < 0:
            raise ValueError(f"{config.model_type}: layers of type {name!r} need a window size, the config has "
                             f"{size!r}")
        kinds[name] = LayerAttention(rule, int(size))
    return kinds


def windowed(kinds: dict[str, LayerAttention]) -> bool:
    """Whether any layer hides keys beyond the visibility rule (a round then builds a mask per type)."""
    return any(k.rule != FULL for k in kinds.values())


def position_limit(config) -> int | None:
    """The model's context length in positions, when its config says."""
    config = text_config(config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


# families whose generate drops the cache and re-encodes the whole sequence once it reaches
# original_max_position_embeddings + 1 tokens (their prepare_inputs_for_generation), so that a longrope model's
# keys are all in the long factors from there on
REENCODING_MODEL_TYPES = frozenset({"phi3", "phimoe", "phi4_multimodal"})


def _rope_types(config) -> list[dict]:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return list(rope.values()) if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]


def _rope_kind(params: dict) -> str:
    """A RoPE parameter set's type ("default", "dynamic", "longrope", ...; older configs say "type")."""
    return str(params.get("rope_type", params.get("type", "")))


def rope_threshold(config) -> int | None:
    """The position T from which the model's RoPE changes every row of a forward whose largest position
    reaches it (transformers' dynamic_rope_update), or None: "longrope" switches to its long factors at
    original_max_position_embeddings, "dynamic" rescales past max_position_embeddings."""
    config = text_config(config)
    thresholds = [_rope_switch(config, params) for params in _rope_types(config)]
    return min((t for t in thresholds if t), default=None)


def rope_switches_once(config) -> bool:
    """Whether every RoPE with a threshold (rope_threshold) only switches there between two fixed sets of
    frequencies ("longrope"), rather than rescaling by the largest position itself ("dynamic")."""
    config = text_config(config)
    return all(_rope_kind(p) == "longrope" for p in _rope_types(config) if _rope_switch(config, p))


def _rope_switch(config, params: dict) -> int | None:
    """One RoPE parameter set's switch position (see rope_threshold), or None when it has none."""
    kind = _rope_kind(params)
    if kind == "longrope":
        return (params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None))
    if "dynamic" in kind:
        return getattr(config, "max_position_embeddings", None)
    return None


def reencode_position(config) -> int | None:
    """Where generate re-encodes the whole sequence (see REENCODING_MODEL_TYPES): the first round whose
    last committed token is at this position re-feeds every token (None: never)."""
    config = text_config(config)
    if getattr(config, "model_type", None) in REENCODING_MODEL_TYPES and \
            any(_rope_kind(p) == "longrope" for p in _rope_types(config)):
        return getattr(config, "original_max_position_embeddings", None) or rope_threshold(config)
    return None


def draft_ceiling(config) -> Callable[[int], int | None]:
    """position -> the highest position a draft row (window cell, tree node) may take in a round whose
    last committed token x_t is at `position` (None: no bound; `position` itself: no draft row). The
    config is read once here; the function is called every round.

    Plain decoding's forward holds no position past the one it predicts from; a round's must not
    reach where that changes the forward: past the context length (learned position tables such as
    GPT-2's and CodeGen's rotary table end there) or across `rope_threshold`. Below such a threshold T
    a round's rows stay at or below T - 2, so that its emitted tokens (each draft row predicts the
    next position) stay below T too and LP's re-fed rows never straddle it; at T - 1, and past the
    context length, a round is plain decoding's one row; past a longrope threshold rows are free."""
    config = text_config(config)
    limit, threshold = position_limit(config), rope_threshold(config)
    if threshold == limit:
        threshold = None         # dynamic RoPE: the context length already bounds it

    def ceiling(position: int) -> int | None:
        bounds = [max(t - 2, position) for t in (limit, threshold)
                  if t is not None and (t == limit or position < t)]
        return min(bounds) if bounds else None
    return ceiling


def refusal(model) -> str | None:
    """Why lookahead cannot be exact on `model` (one line naming its type), or None when it can."""
    config = text_config(model.config)
    kind = getattr(config, "model_type", type(model).__name__)
    if getattr(model.config, "is_encoder_decoder", False):
        return f"{kind} is an encoder-decoder: lookahead decodes decoder-only causal LMs"
    if kind in RECURRENT_MODEL_TYPES:
        return f"{kind} has recurrent-state layers (Mamba/SSM, linear attention or convolutions): their state is " \
               f"not per-position K/V, so a round's rejected rows cannot be dropped; lookahead cannot be exact on it"
    if getattr(config, "use_bidirectional_attention", False) or \
            (kind in DECODER_FLAG_MODEL_TYPES and not getattr(config, "is_decoder", False)):
        return f"{kind} is configured with bidirectional attention: lookahead decodes causal LMs" + \
            (" (set is_decoder: true in its config for causal attention)" if kind in DECODER_FLAG_MODEL_TYPES else "")
    if _transformers_before(BIDIRECTIONAL_BEFORE.get(kind)):
        import transformers
        return f"{kind} attends both ways in a forward of several tokens in transformers {transformers.__version__} " \
               f"(a causal mask came in {BIDIRECTIONAL_BEFORE[kind]}), so generate's ids there are not a causal " \
               f"LM's and lookahead cannot match them; use transformers >= {BIDIRECTIONAL_BEFORE[kind]}"
    if kind in OWN_MASK_MODEL_TYPES or getattr(config, "alibi", False):
        return f"{kind} builds its own position bias or causal mask (ALiBi, a mask table, virtual tokens or no " \
               f"cache), which a lookahead round's mask and slot cache cannot feed; lookahead cannot be exact on it"
    if _numbers_positions_itself(model):
        return f"{kind}'s forward takes no position_ids: it numbers a forward's rows from the cache's length, so " \
               f"a round's window and tree rows (several at one position) would get wrong positions; lookahead " \
               f"cannot be exact on it"
    if getattr(config, "recurrent_kv_cache_mode", None) == "last_loop":
        return f"{kind} with recurrent_kv_cache_mode 'last_loop' lets earlier loops read the last loop's cache, so " \
               f"generate's cached decoding is not the model's forward; lookahead cannot match it ('per_loop' can)"
    if getattr(config, "num_kv_shared_layers", 0) or any(getattr(config, "kv_sharing_modes", None) or ()):
        return f"{kind} shares K/V between layers, which lp's round cache does not model"
    try:
        attention_kinds(config)
    except ValueError as e:
        return str(e)
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        return f"{kind} runs attn_implementation {implementation!r}: lookahead rounds need one of " \
               f"{', '.join(ATTENTION_IMPLEMENTATIONS)} (an explicit 4-D mask); load it with one of those"
    return _state_refusal(model, kind)


def _state_refusal(model, kind: str) -> str | None:
    """Why lookahead cannot run on `model` as it is now, or None: a parameter or buffer on the meta device
    (offloaded weights), or a module in training mode, whose forward (dropout, router noise, gradient
    checkpointing, batch statistics) is not its decoding one."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    if any(t.device.type == "meta" for t in tensors):
        return f"{kind} has weights on the meta device (offloaded by accelerate: cpu_offload, or a device_map " \
               f"putting modules on 'disk' or offloading them): lp's rounds need the model's weights and caches " \
               f"on one device; load it onto one device (device_map='cpu' or 'cuda:0')"
    if any(m.training for m in model.modules()):
        return f"{kind} is in training mode (model.train(), or a module of it; from_config makes a model so): " \
               f"dropout, router noise and gradient checkpointing change its forwards there, so its decoding is " \
               f"not its greedy one; call model.eval() first"
    return None


def _transformers_before(version: str | None) -> bool:
    """Whether the installed transformers is older than `version` (False for None)."""
    if version is None:
        return False
    import transformers
    from packaging.version import Version
    return Version(transformers.__version__) < Version(version)


def _numbers_positions_itself(model) -> bool:
    """A transformers model whose forward takes no `position_ids`: read off the forward of transformers'
    own class in its MRO (a user's subclass may pass everything through `*args, **kwargs`)."""
    from transformers import PreTrainedModel
    model = getattr(model, "_orig_mod", model)          # torch.compile(model)'s wrapper
    if not isinstance(model, PreTrainedModel):
        return False
    own = next((c for c in type(model).__mro__ if "forward" in vars(c) and c.__module__.startswith("transformers.")),
               type(model))
    try:
        return "position_ids" not in inspect.signature(own.forward).parameters
    except (TypeError, ValueError):     # a forward inspect cannot read: not refused on this ground
        return False


def logits_size(model) -> int:
    """The width of the model's logits: its output embedding's rows (the config's vocab_size without one)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(text_config(model.config).vocab_size)


def input_vocab(model) -> int | None:
    """How many token ids the model's input embedding holds (None: a model that does not expose one:
    transformers' get_input_embeddings raises NotImplementedError for those)."""
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return getattr(embedding, "num_embeddings", None)


def outside_vocabulary(ids: Sequence[int], vocab: int | None) -> str | None:
    """Why prompt `ids` cannot be fed to a model of `vocab` input ids (input_vocab), or None."""
    outside = next((t for t in ids if not 0 <= t < vocab), None) if vocab is not None else None
    if outside is None:
        return None
    return f"prompt token id {outside} is outside the model's vocabulary (ids 0 to {vocab - 1})"


def attention_implementation(config, requested: str = "auto") -> str:
    """The attention implementation lp runs a model of `config` with: `requested` ('sdpa', 'eager'), or for
    'auto' SDPA unless its attention modifies the scores in a way SDPA cannot take (soft-capping) or its
    model class does not run SDPA (transformers' `_supports_sdpa`: attention sinks), then eager. ValueError
    for 'sdpa' on a soft-capped model: transformers 5.17's SDPA path drops the cap silently."""
    capped = getattr(text_config(config), "attn_logit_softcapping", None) is not None
    if requested == "sdpa" and capped:
        raise ValueError(f"{config.model_type} soft-caps its attention scores, which SDPA cannot apply: use "
                         f"attn_implementation eager (or auto)")
    if requested != "auto":
        return requested
    from transformers import AutoModelForCausalLM
    try:
        supports = AutoModelForCausalLM._model_mapping[type(config)]._supports_sdpa
    except (KeyError, AttributeError, ValueError):
        supports = True     # not a mapped class: transformers says at load if it cannot
    return "eager" if capped or not supports else "sdpa"


def check_model(model) -> dict[str, LayerAttention]:
    """The model's attention kinds, or ValueError with `refusal`'s line."""
    why = refusal(model)
    if why is not None:
        raise ValueError(why)
    return attention_kinds(model.config)
