"""Tiny random models of transformers' decoder families, built from their config classes (no download).

`tiny_random(family, ...)` builds e.g. a 2-layer Gemma 2 with soft-capping and a 16-token sliding window,
or a DeepSeek-V3 with MLA (keys and values of different head sizes) and routed experts, from
`FAMILIES`: the config class and the few keys that make the family what it is. Sizes are shared (hidden
64, 4 heads, 2 K/V heads, vocab 64 unless asked), weights are seeded and drawn at std 1.2/sqrt(hidden)
(see `lp.models.tiny_random_llama`: at transformers' 0.02 greedy output collapses to one repeated token).

The architecture matrix (tests/test_architectures.py) decodes every family against `generate`; the names
`tiny-random-<family>?layers=..&seed=..` load them in jobs (`lp.models.load_model`). `REFUSED` are families
whose cache is not per-position K/V (recurrent layers): the engine refuses them (lp.decode.arch).
"""
from __future__ import annotations

import torch
import transformers

from lp.decode.arch import attention_implementation

SLIDING = 16    # the sliding window (and Llama 4's attention chunk) of the windowed families: tests pass it
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
_QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            num_key_value_heads=4, head_dim=8)
_DEEPSEEK_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1,
                     n_shared_experts=1, n_group=1, topk_group=1)

# family -> (config class name, keys beyond the shared sizes, what makes it differ from Llama)
FAMILIES: dict[str, tuple[str, dict, str]] = {
    "llama": ("LlamaConfig", {}, "reference: RoPE, GQA, SwiGLU"),
    "qwen2": ("Qwen2Config", {}, "q/k/v biases"),
    "qwen2-swa": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=SLIDING, max_window_layers=1),
                  "sliding window on the layers past max_window_layers (a mask per layer type)"),
    "qwen3": ("Qwen3Config", dict(head_dim=16), "q/k norms"),
    "mistral": ("MistralConfig", dict(sliding_window=None), "no window"),
    "mistral-swa": ("MistralConfig", dict(sliding_window=SLIDING), "sliding window on every layer"),
    "phi3": ("Phi3Config", {}, "fused qkv and gate/up projections"),
    "phi": ("PhiConfig", dict(partial_rotary_factor=0.5), "Phi-2: partial rotary, parallel block, biases"),
    "starcoder2": ("Starcoder2Config", dict(sliding_window=None), "LayerNorm, biases, GELU MLP"),
    "starcoder2-swa": ("Starcoder2Config", dict(sliding_window=SLIDING), "sliding window on every layer"),
    "gpt-neox": ("GPTNeoXConfig", dict(rotary_pct=0.5), "partial rotary, parallel residual"),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128),
             "learned positions, Conv1D"),
    "gpt-bigcode": ("GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128,
                                             multi_query=True), "StarCoder 1: multi-query attention"),
    "gptj": ("GPTJConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128, rotary_dim=8),
             "GPT-J: rotary on part of each head, parallel block"),
    "opt": ("OPTConfig", dict(ffn_dim=128, word_embed_proj_dim=64, enable_bias=True),
            "learned positions offset by 2, ReLU MLP"),
    "stablelm": ("StableLmConfig", dict(partial_rotary_factor=0.25, qk_layernorm=True, use_qkv_bias=True),
                 "partial rotary, per-head q/k LayerNorms, q/k/v biases"),
    "codegen": ("CodeGenConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, n_ctx=512, rotary_dim=8),
                "rotary on part of each head, parallel block"),
    "gemma": ("GemmaConfig", dict(head_dim=16), "scaled embeddings, GeGLU"),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=SLIDING, attn_logit_softcapping=50.0,
                                    final_logit_softcapping=30.0, query_pre_attn_scalar=16),
               "soft-capped attention (eager), sliding and full layers alternating"),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=SLIDING, query_pre_attn_scalar=16,
                                        layer_types=["sliding_attention", "full_attention"]),
               "local (sliding, own RoPE base) and global layers, q/k norms"),
    "cohere2": ("Cohere2Config", dict(sliding_window=SLIDING, layer_types=["sliding_attention", "full_attention"]),
                "Command R7B: sliding and full layers, parallel block"),
    "olmo2": ("Olmo2Config", {}, "q/k norms, norms after the block"),
    "olmo3": ("Olmo3Config", dict(sliding_window=SLIDING, layer_types=["sliding_attention", "full_attention"]),
              "sliding and full layers"),
    "granite": ("GraniteConfig", dict(embedding_multiplier=2.0, residual_multiplier=0.5,
                                      attention_multiplier=0.2, logits_scaling=2.0), "scaled residuals and logits"),
    "cohere": ("CohereConfig", {}, "parallel block, LayerNorm, logit scale"),
    "falcon": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2), "grouped K/V, parallel block"),
    "smollm3": ("SmolLM3Config", dict(no_rope_layers=[1, 0]), "layers without RoPE"),
    "mixtral": ("MixtralConfig", dict(sliding_window=None, **_MOE), "routed experts"),
    "qwen2-moe": ("Qwen2MoeConfig", dict(shared_expert_intermediate_size=64, **_QWEN_MOE),
                  "routed and shared experts"),
    "qwen3-moe": ("Qwen3MoeConfig", dict(head_dim=16, **_QWEN_MOE), "routed experts, q/k norms"),
    "phimoe": ("PhimoeConfig", dict(sliding_window=None, **_MOE), "Phi-3.5-MoE: routed experts"),
    "deepseek-v2": ("DeepseekV2Config", dict(**_MLA, **_DEEPSEEK_MOE),
                    "MLA (key head 24, value head 12), routed and shared experts"),
    "deepseek-v3": ("DeepseekV3Config", dict(**_MLA, **_DEEPSEEK_MOE), "MLA, sigmoid-routed experts"),
    "gpt-oss": ("GptOssConfig", dict(head_dim=16, sliding_window=SLIDING, num_local_experts=4,
                                     num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"]),
                "attention sinks (eager), sliding and full layers, routed experts"),
    "llama4": ("Llama4TextConfig", dict(head_dim=16, attention_chunk_size=SLIDING, num_local_experts=2,
                                        num_experts_per_tok=1, intermediate_size_mlp=128, interleave_moe_layer_step=1,
                                        no_rope_layers=[1, 0], layer_types=["chunked_attention", "full_attention"]),
               "chunked attention on RoPE layers, full attention without RoPE, experts"),
}
# families whose layers keep recurrent state (not per-position K/V): refused by the engine
REFUSED: dict[str, tuple[str, dict]] = {
    "jamba": ("JambaConfig", dict(num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
                                  expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
                                  use_mamba_kernels=False)),
    "mamba": ("MambaConfig", dict(state_size=8, expand=2, use_mambapy=True)),
    "bamba": ("BambaConfig", dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8,
                                  mamba_n_groups=1)),
    "qwen3-next": ("Qwen3NextConfig", dict(head_dim=16, layer_types=["linear_attention", "full_attention"],
                                           linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                           linear_value_head_dim=16, **_QWEN_MOE)),
    "lfm2": ("Lfm2Config", dict(layer_types=["conv", "full_attention"])),
}
_SHARED = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               tie_word_embeddings=False)


def family_config(family: str, vocab: int = 64, layers: int = 2, **overrides) -> transformers.PretrainedConfig:
    """The config of a tiny `family` model (FAMILIES or REFUSED), `overrides` last."""
    if family in FAMILIES:
        cls, keys, _ = FAMILIES[family]
    elif family in REFUSED:
        cls, keys = REFUSED[family]
    else:
        raise ValueError(f"unknown tiny family {family!r}; known: {', '.join([*FAMILIES, *REFUSED])}")
    kwargs = {**_SHARED, "vocab_size": vocab, "num_hidden_layers": layers, **keys, **overrides}
    if "layer_types" in kwargs and len(kwargs["layer_types"]) != layers:     # the pattern, repeated
        kwargs["layer_types"] = [kwargs["layer_types"][i % len(kwargs["layer_types"])] for i in range(layers)]
    if "no_rope_layers" in kwargs and len(kwargs["no_rope_layers"]) != layers:
        kwargs["no_rope_layers"] = [kwargs["no_rope_layers"][i % len(kwargs["no_rope_layers"])] for i in range(layers)]
    for alias in ("n_layer",):
        if alias in kwargs:
            kwargs[alias] = layers
    kwargs["initializer_range"] = 1.2 / kwargs["hidden_size"] ** 0.5 if "n_embd" not in kwargs \
        else 1.2 / kwargs["n_embd"] ** 0.5
    return getattr(transformers, cls)(**kwargs)


def tiny_random(family: str, vocab: int = 64, layers: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32,
                attn_implementation: str | None = None, experts_implementation: str | None = None,
                **overrides) -> transformers.PreTrainedModel:
    """A seeded random `family` model in eval mode (weights depend only on the arguments). The attention
    implementation is lp's choice for the family unless given (lp.decode.arch.attention_implementation:
    eager for soft-capped scores and attention sinks, else SDPA), the experts' transformers' default
    (float64 experts need "eager": transformers' grouped expert matmul has no double kernel)."""
    model = random_model(family_config(family, vocab, layers, **overrides), seed, dtype, attn_implementation,
                         experts_implementation)
    model.generation_config.update(eos_token_id=2, pad_token_id=0, bos_token_id=1)
    return model


def random_model(config, seed: int = 0, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None,
                 experts_implementation: str | None = None) -> transformers.PreTrainedModel:
    """transformers' causal LM of `config` in eval mode, its matrices redrawn at std `config.initializer_range`
    from `seed` (the global RNG untouched): tiny_random's families and scripts/arch_sweep.py's types."""
    attn_implementation = attention_implementation(config, attn_implementation or "auto")
    with torch.random.fork_rng(devices=[]):      # seed a saved-and-restored CPU RNG: the global one untouched
        torch.random.default_generator.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                             experts_implementation=experts_implementation)
    std = config.initializer_range
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        for name, p in model.named_parameters():   # matrices at the scale that keeps outputs varied
            if p.dim() >= 2:
                p.normal_(0.0, std)
    model.to(dtype)
    model.config.dtype = dtype
    return model.eval()
