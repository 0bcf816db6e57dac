"""Every causal-LM type of the installed transformers that lp.tiny does not build, against generate in float64.

The architecture matrix (tests/test_architectures.py) decodes lp.tiny's families, each configured by hand;
this sweeps the rest of transformers' causal-LM auto mapping with one generic recipe: a config of the
type's own class at small sizes (`SMALL`, each key set only where the class has it; `OVERRIDES`: the few
keys some types need to build at those sizes or to run as decoders), 2 layers, random float64 weights
at std 1.2/sqrt(hidden) as lp.tiny draws them, four prompts (the last one runs to the end of a 128-position
table), each decoded with lp.generate under two lookahead settings, then all four in one batched call,
and compared with `model.generate(do_sample=False)` on the same model; and the drop-in on a left-padded
batch of the first three against `generate` on that batch. Verdicts:

    exact           every token of every prompt equal to generate's
    refused         lp refuses the model before decoding (lp.decode.arch.refusal: one line naming why)
    WRONG           lp's ids differ from generate's
    LP-ERROR        lp raised (or hung) where generate decoded
(where generate's left-padded batch gives other ids than a row alone, as transformers' eager attention with
a sliding window does on 5.17, the drop-in is held to the row alone, as docs/library.md says it decodes,
and the type's line notes it)
    no model        the small config does not build (transformers' own checks, or past the child's 8 GiB
                    address space), or the type is composite (vision, audio, ... sub-configs: its text
                    model is swept under its own type where transformers has one): no verdict
    generate fails  generate itself fails on every prompt (e.g. float64 kernels it lacks): no verdict

Each type runs in a child process with a time limit (a type that hangs while it builds is "no model";
one that hangs in lp's decode is LP-ERROR). Prints a line per type and a count per verdict; exits 1 if
any type is WRONG or LP-ERROR, so a transformers release that brings a type whose attention a round's
mask cannot reach shows here before a user meets it.

    python scripts/arch_sweep.py                      # every type, 2 at a time (about 10 minutes here)
    python scripts/arch_sweep.py --types olmo mpt -v  # some types, with each prompt's outcome
    python scripts/arch_sweep.py --json sweep.json    # the verdicts as JSON too

tests/test_arch_sweep.py runs a few types in the default suite and the whole sweep under -m slow.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILING = ("WRONG", "LP-ERROR")
TABLE = 128          # the position table of every swept model (max_position_embeddings and its aliases)
NEW = 40
MEMORY = 8 << 30     # a child's address space

# the small sizes, under every name transformers' config classes use for them
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=TABLE,
             n_embd=64, n_layer=2, n_head=4, n_positions=TABLE, n_inner=128, n_ctx=TABLE,
             d_model=64, ffn_dim=128, num_layers=2, num_heads=4, n_heads=4, n_layers=2, max_seq_len=TABLE,
             moe_intermediate_size=64, num_experts=4, num_local_experts=4, n_routed_experts=4,
             num_experts_per_tok=2, shared_expert_intermediate_size=64, sliding_window=16,
             kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
             rotary_dim=8, n_group=1, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
             bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
             window_size=16, attention_window_size=16, local_window_size=16,
             decoder_layers=2, encoder_layers=2, decoder_attention_heads=4, encoder_attention_heads=4,
             decoder_ffn_dim=128, encoder_ffn_dim=128)
_MLA = dict(head_dim=8, num_key_value_heads=4)     # MLA types whose rope head must equal head_dim
_DECODER = dict(is_decoder=True)                   # encoder families' causal-LM heads: causal only as decoders
OVERRIDES: dict[str, dict] = {
    **{t: _MLA for t in ("minicpm3", "axk1", "axk2", "deepseek_v32", "longcat_flash", "sarvam_mla", "youtu",
                         "glm4_moe_lite", "glm_moe_dsa")},
    **{t: _DECODER for t in ("bert", "bert-generation", "camembert", "data2vec-text", "roberta",
                             "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl", "ernie", "rembert",
                             "electra", "megatron-bert", "xmod", "roformer", "roc_bert")},
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "big_bird": dict(is_decoder=True, attention_type="original_full"),
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2)),
    "gemma3n_text": dict(num_kv_shared_layers=0, layer_types=["sliding_attention", "full_attention"],
                         altup_num_inputs=2, laurel_rank=8, hidden_size_per_layer_input=16,
                         activation_sparsity_pattern=[0.0, 0.0]),
    "reformer": dict(is_decoder=True),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    "dots3_note_text": dict(num_key_value_heads=4),
    "zaya": dict(num_experts_per_tok=1),
    "kolibri1_1": dict(index_num_heads=2),
    "mamba2": dict(head_dim=32),
    "dory": dict(num_hidden_layers=3, n_input_layers=1, n_recurrent_layers=1, n_output_layers=1,
                 n_recurrent_loops=2, layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
}
SETTINGS = {"default": {},
            "tree": dict(window=4, ngram=4, guesses=4, lookup_candidates=2, lookup_tokens=6, suffix_factor=6,
                         suffix_tokens=24)}


def swept_types() -> list[str]:
    """The causal-LM model types of the installed transformers that lp.tiny's families do not cover."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from lp.tiny import FAMILIES, REFUSED
    covered = {getattr(transformers, cls).model_type for cls, *_ in [*FAMILIES.values(), *REFUSED.values()]}
    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t not in covered)


TEXT_PARTS = {"attn_config", "ffn_config"}      # sub-configs that are parts of one text model (DBRX, MPT)


def small_config(model_type: str):
    """`model_type`'s config at SMALL's sizes (only the keys its class has) with OVERRIDES last; ValueError
    for a composite type, whose other parts SMALL does not reach."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    cls = CONFIG_MAPPING[model_type]
    parts = set(getattr(cls, "sub_configs", None) or ()) - TEXT_PARTS
    if parts:
        raise ValueError(f"a composite config ({', '.join(sorted(parts))}): not built small")
    defaults = cls().to_dict()
    aliases = dict(getattr(cls, "attribute_map", {}) or {})
    kwargs = {k: v for k, v in SMALL.items() if k in defaults or k in aliases}
    for k in list(kwargs):       # an alias and the key it names: the key wins
        if aliases.get(k, k) != k and aliases[k] in kwargs:
            del kwargs[k]
    if "layer_types" in defaults:      # the class derives them from the layer count
        kwargs["layer_types"] = None
    kwargs.update(OVERRIDES.get(model_type, {}))
    hidden = kwargs.get("hidden_size", kwargs.get("n_embd", kwargs.get("d_model", 64)))
    kwargs["initializer_range"] = 1.2 / hidden ** 0.5
    return cls(**kwargs)


def small_model(model_type: str):
    """A seeded random float64 model of `model_type` (SDPA, or eager where its class has no SDPA)."""
    import torch
    from lp.tiny import random_model
    model = random_model(small_config(model_type), dtype=torch.float64, experts_implementation="eager")
    model.generation_config.update(eos_token_id=None, pad_token_id=0, bos_token_id=1)
    return model


def prompts(vocab: int, limit: int | None) -> list[list[int]]:
    """A repetitive prompt (drafts get accepted), a short one, a random one, and one that ends NEW tokens
    short of the position table."""
    import random
    draw = random.Random(0)
    top = min(vocab, 500)
    base = [draw.randrange(3, top) for _ in range(7)]
    return [[5, 9, 12, 5, 9, 30, 41, 5, 9, 12, 7, 7, 18, 22, 5, 9, 12, 40, 3, 11], [33, 8, 33, 8, 14, 60],
            [draw.randrange(3, top) for _ in range(50)], (base * 40)[:min(limit or TABLE, TABLE) - NEW]]


def stage(name: str) -> None:
    print(f"STAGE {name}", flush=True)


def _compared(got: list[int], want: list[int]) -> dict:
    first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    return dict(equal=True) if first is None else dict(equal=False, first_difference=first, lp=got, generate=want)


def sweep_one(model_type: str) -> dict:
    """The verdict on `model_type`, with each decode's outcome under `details`: every prompt alone under
    each of SETTINGS, all of them in one batched call (`batch`, the tree setting), and the drop-in on a
    left-padded batch of the first three against generate on that batch (`drop-in`)."""
    import torch
    import lp
    from lp.decode.arch import position_limit, refusal, text_config
    stage("build")
    try:
        model = small_model(model_type)
    except Exception as e:      # transformers' own validation at these sizes
        return dict(type=model_type, verdict="no model", why=f"{type(e).__name__}: {str(e)[:200]}")
    stage("decode")
    why = refusal(model)
    if why is not None:
        return dict(type=model_type, verdict="refused", why=why)
    plain = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0, eos_token_id=None)
    details, wants, notes = [], {}, []
    rows = prompts(text_config(model.config).vocab_size or 512, position_limit(model.config))
    for i, prompt in enumerate(rows):
        x = torch.tensor([prompt])
        try:
            wants[i] = model.generate(x, attention_mask=torch.ones_like(x), **plain)[0, len(prompt):].tolist()
        except Exception as e:
            details.append(dict(prompt=i, generate_error=f"{type(e).__name__}: {str(e)[:200]}"))

    def attempt(setting: str, indices: list[int], decode) -> None:
        """`decode()` -> each index's ids (want: generate's per index, or from the decode's second value)."""
        try:
            got, want = decode()
        except Exception as e:
            details.append(dict(prompt=indices, setting=setting, lp_error=f"{type(e).__name__}: {str(e)[:200]}",
                                where=traceback.format_exc().strip().splitlines()[-3].strip()))
            return
        for i, g, w in zip(indices, got, want):
            details.append(dict(prompt=i, setting=setting, **_compared(g, w)))

    for name, keys in SETTINGS.items():
        for i in wants:
            attempt(name, [i], lambda: ([lp.generate(model, [rows[i]], max_new_tokens=NEW, **keys)[0].token_ids],
                                        [wants[i]]))
    done = list(wants)
    if len(done) > 1:
        attempt("batch", done, lambda: ([r.token_ids for r in lp.generate(
            model, [rows[i] for i in done], max_new_tokens=NEW, batch_size=len(done), **SETTINGS["tree"])],
            [wants[i] for i in done]))
    padded = [i for i in done if i < 3]
    if len(padded) > 1:
        from fuzz_exact import padded as left_padded      # the fuzzer's drop-in batch: pad id 0 on the left
        ids, mask = left_padded([rows[i] for i in padded])
        try:
            want = model.generate(ids, attention_mask=mask, **plain)[:, ids.shape[1]:].tolist()
        except Exception as e:
            details.append(dict(prompt=padded, setting="drop-in", generate_error=f"{type(e).__name__}: {str(e)[:200]}"))
        else:       # where generate's padded row is not its row alone (transformers'), the drop-in gives the latter
            alone = [i for i, w in zip(padded, want) if w != wants[i]]
            if alone:
                notes.append(f"generate's left-padded batch gives other ids than each row alone for prompts {alone} "
                             f"(transformers'); the drop-in is compared with the rows alone there")
            attempt("drop-in", padded, lambda: (model.generate(ids, attention_mask=mask, custom_generate=lp.lookahead,
                                                               **plain, **SETTINGS["tree"])[:, ids.shape[1]:].tolist(),
                                                [wants[i] if i in alone else w for i, w in zip(padded, want)]))
    if any("lp_error" in d for d in details):
        verdict = "LP-ERROR"
    elif any(d.get("equal") is False for d in details):
        verdict = "WRONG"
    elif all("generate_error" in d for d in details):
        verdict = "generate fails"
    else:
        verdict = "exact"
    why = next((d.get("lp_error") or f"prompt {d['prompt']} ({d['setting']}): first difference at new token "
                f"{d['first_difference']}" for d in details if "lp_error" in d or d.get("equal") is False), "")
    if verdict == "generate fails":
        why = details[0]["generate_error"]
    return dict(type=model_type, verdict=verdict, why=why or "; ".join(notes), details=details, notes=notes)


def run_child(model_type: str, timeout: float) -> dict:
    """`sweep_one(model_type)` in a child process, within `timeout` seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, __file__, "--child", model_type], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
        out, err, late = done.stdout, done.stderr, None
    except subprocess.TimeoutExpired as e:
        out, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), ""
        late = f"no answer within {timeout:.0f} s"
    for line in out.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    stages = [line.split()[1] for line in out.splitlines() if line.startswith("STAGE ")]
    why = late or (err.strip().splitlines() or ["no output"])[-1][:200]
    if stages and stages[-1] == "decode":      # it built; lp (or generate) did not come back
        return dict(type=model_type, verdict="LP-ERROR", why=why)
    return dict(type=model_type, verdict="no model", why=why)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="+", help="these model types only (default: every swept type)")
    parser.add_argument("--procs", type=int, default=2, help="child processes at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per type (default 300)")
    parser.add_argument("--json", type=Path, help="write the verdicts to this file as well")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each prompt's outcome")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))     # a model built at full size fails here
        import torch
        torch.set_num_threads(1)
        print("RESULT " + json.dumps(sweep_one(args.child)), flush=True)
        return 0
    types = args.types or swept_types()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    unknown = [t for t in types if t not in CONFIG_MAPPING]
    if unknown:
        parser.error(f"--types: not a model type of this transformers: {', '.join(unknown)}")
    results = []
    with ThreadPoolExecutor(max(1, args.procs)) as pool:
        for r in pool.map(lambda t: run_child(t, args.timeout), types):
            results.append(r)
            print(f"{r['type']:28s} {r['verdict']:15s} {r.get('why', '')[:150]}", flush=True)
            if args.verbose:
                for d in r.get("details", []):
                    print("    " + json.dumps(d))
    counts = {v: sum(r["verdict"] == v for r in results) for v in
              ("exact", "refused", "WRONG", "LP-ERROR", "no model", "generate fails")}
    print(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["verdict"] in FAILING for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
