"""The architecture matrix: a tiny random model of every decoder family in lp/tiny.py decodes, in
float64, to exactly `model.generate(do_sample=False)`'s ids, with the default job's lookahead and with
a window + lookup + tree config whose trees run deeper than the sliding window; sequences pass every
window (a 16-token window; prompts of 20 and 6 tokens, 44 new tokens); LP at P = 2 on the windowed,
soft-capped, chunked and MLA families; recurrent and encoder-decoder models are refused with one line.

Mixture-of-experts families run transformers' eager expert loop in float64 (its grouped matmul has no
float64 kernel): that is how lp.models loads them in float64 too.
"""
import pytest
import torch
import transformers

from lp.decode import arch
from lp.decode.arch import SLIDING, attention_kinds, rope_threshold, windowed
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.jobs.config import JOB_LOOKAHEAD
from lp.models import ModelLoadError, load_model
from lp.tiny import FAMILIES, REFUSED, SLIDING as WINDOW, family_config, tiny_random
from reference import full_forward_greedy
from test_lp import torchrun

PROMPTS = [[5, 9, 12, 5, 9, 30, 41, 5, 9, 12, 7, 7, 18, 22, 5, 9, 12, 40, 3, 11],   # 20 > the window already
           [33, 8, 33, 8, 14, 60]]                                                  # passes it while decoding
NEW = 44
CONFIGS = {
    "job": LookaheadParams(**JOB_LOOKAHEAD),
    # Jacobi window, pool, lookup spans and suffix drafts of up to 24 nodes: deeper than the window
    "window+lookup+tree": LookaheadParams(window=4, ngram=4, guesses=4, lookup_candidates=2, lookup_tokens=6,
                                          suffix_factor=6, suffix_tokens=24),
}
WINDOWED = [f for f in FAMILIES if windowed(attention_kinds(family_config(f)))]


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = tiny_random(family, dtype=torch.float64, experts_implementation="eager")
        return cache[family]
    return get


def generate(model, prompt, new=NEW):
    x = torch.tensor([prompt])
    return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                          pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_is_identical_to_generate(models, family):
    model = models(family)
    assert model.dtype == torch.float64
    multi = 0
    for prompt in PROMPTS:
        reference = generate(model, prompt)
        assert len(set(reference)) >= 3, f"{family}: a degenerate reference proves nothing"
        for name, params in CONFIGS.items():
            r = lookahead_generate(model, prompt, params, GenerationParams(NEW))
            assert r.token_ids == reference, (family, name, prompt)
            multi += sum(e > 1 for e in r.emitted_per_round)
    assert multi >= 2, f"{family}: no round accepted a draft"


MOE = [f for f in FAMILIES if "output_router_logits" in family_config(f).to_dict()]


@pytest.mark.parametrize("family", MOE)
def test_a_mixture_of_experts_that_asks_for_router_logits_is_generates(family):
    """A fine-tuned MoE checkpoint often keeps output_router_logits: true; the model then computes its
    load-balancing loss from the attention mask, which it takes for a 2-D padding mask. lp's round mask
    is 4-D (or a dict per layer type) and the forward failed; lp now asks for no router logits, which
    changes no logit: the ids are generate's, through the engine and the drop-in."""
    import lp
    model = tiny_random(family, dtype=torch.float64, experts_implementation="eager", output_router_logits=True)
    assert model.config.output_router_logits
    reference = generate(model, PROMPTS[0], new=16)
    assert lookahead_generate(model, PROMPTS[0], CONFIGS["job"], GenerationParams(16)).token_ids == reference
    x = torch.tensor([PROMPTS[0]])
    drop_in = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=16,
                             pad_token_id=0, eos_token_id=None, custom_generate=lp.lookahead)
    assert drop_in[0, len(PROMPTS[0]):].tolist() == reference


@pytest.mark.parametrize("family", ["qwen2-swa", "gemma2", "gpt2", "deepseek-v3"])
def test_processors_on_other_families_are_generates(models, family):
    """A repetition penalty and min_new_tokens (with an EOS it holds back) on a windowed, a soft-capped
    (its final logits too), a learned-position and an MLA family: generate's ids, which the knobs change."""
    model = models(family)
    for prompt in PROMPTS:
        free = generate(model, prompt)
        eos = free[5]           # a token the free run meets early
        x = torch.tensor([prompt])
        want = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                              eos_token_id=eos, repetition_penalty=1.3, min_new_tokens=12)[0, len(prompt):].tolist()
        assert want != free[:len(want)] and len(want) > 12, (family, prompt)
        r = lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"],
                               GenerationParams(NEW, repetition_penalty=1.3, min_new_tokens=12), eos_token_ids=[eos])
        assert r.token_ids == want, (family, prompt)


def test_matrix_covers_the_families_people_run():
    assert len(FAMILIES) >= 15
    kinds = {f: attention_kinds(family_config(f)) for f in FAMILIES}
    assert {"qwen2-swa", "mistral-swa", "gemma2", "gemma3", "gpt-oss", "llama4"} <= set(WINDOWED)
    assert any(len(k) > 1 for k in kinds.values()) and any(len(k) == 1 and windowed(k) for k in kinds.values())
    shapes = {f: family_config(f) for f in ("deepseek-v2", "deepseek-v3")}
    assert all(c.qk_nope_head_dim + c.qk_rope_head_dim != c.v_head_dim for c in shapes.values())   # MLA


@pytest.mark.parametrize("family", WINDOWED)
def test_the_window_changes_the_output(models, family):
    """Each windowed family's reference differs from the same model with the window opened wide: the
    matrix's sequences really pass the window, so a round that ignored it would fail above."""
    model = models(family)
    config = model.config
    key = "sliding_window" if any(k.rule == SLIDING for k in attention_kinds(config).values()) \
        else "attention_chunk_size"
    assert getattr(config, key) == WINDOW
    windowed_ids = [generate(model, p) for p in PROMPTS]
    setattr(config, key, 4096)
    try:
        wide = [generate(model, p) for p in PROMPTS]
    finally:
        setattr(config, key, WINDOW)
    assert windowed_ids != wide, family


def test_sliding_window_16_over_60_tokens(models):
    """The issue's case: a 16-token window and a 60-token sequence, identical throughout (the engine
    before per-layer masks differed from about position 17)."""
    model = models("mistral-swa")
    prompt = PROMPTS[1]
    reference = generate(model, prompt, 60 - len(prompt))
    for params in CONFIGS.values():
        assert lookahead_generate(model, prompt, params, GenerationParams(60 - len(prompt))).token_ids == reference


@pytest.mark.parametrize("family", list(REFUSED))
def test_recurrent_families_are_refused(family):
    with pytest.raises(ModelLoadError, match="recurrent-state layers"):
        load_model(f"tiny-random-{family}", dtype="float32", device="cpu")
    model = tiny_random(family)
    with pytest.raises(ValueError, match=model.config.model_type):
        lookahead_generate(model, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))


def test_encoder_decoder_is_refused():
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match="t5 is an encoder-decoder"):
        lookahead_generate(model, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))


OWN_MASKS = {     # found wrong (mpt, gpt_neo) or failing deep in transformers (the others) before their refusal
    "mpt": lambda: transformers.MptConfig(d_model=32, n_heads=4, n_layers=1, max_seq_len=64, vocab_size=96),
    "bloom": lambda: transformers.BloomConfig(hidden_size=32, n_head=4, n_layer=1, vocab_size=96),
    "falcon": lambda: transformers.FalconConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                                                alibi=True, vocab_size=96),
    "gpt_neo": lambda: transformers.GPTNeoConfig(hidden_size=32, num_heads=4, num_layers=2, window_size=8,
                                                 attention_types=[[["global", "local"], 1]],
                                                 max_position_embeddings=64, vocab_size=96),
    "openai-gpt": lambda: transformers.OpenAIGPTConfig(n_embd=32, n_head=4, n_layer=1, n_positions=64, vocab_size=96),
    "cpmant": lambda: transformers.CpmAntConfig(hidden_size=32, num_attention_heads=4, dim_head=8, dim_ff=64,
                                                num_hidden_layers=1, prompt_length=4, vocab_size=96),
    "xlm": lambda: transformers.XLMConfig(emb_dim=32, n_layers=1, n_heads=4, vocab_size=96, causal=True),
    "xlnet": lambda: transformers.XLNetConfig(d_model=32, n_layer=1, n_head=4, d_inner=64, vocab_size=96),
    "reformer": lambda: transformers.ReformerConfig(hidden_size=32, num_attention_heads=2, attention_head_size=16,
                                                    feed_forward_size=32, is_decoder=True, vocab_size=96,
                                                    attn_layers=["local"], axial_pos_embds=False,
                                                    local_attn_chunk_length=4, max_position_embeddings=128),
}


@pytest.mark.parametrize("kind", list(OWN_MASKS))
def test_attention_that_builds_its_own_mask_is_refused(kind):
    model = transformers.AutoModelForCausalLM.from_config(OWN_MASKS[kind]()).eval()
    with pytest.raises(ValueError, match=f"{kind} builds its own position bias or causal mask"):
        lookahead_generate(model, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))


# decoders whose forward takes no position_ids (found by scripts/arch_sweep.py giving other ids than generate)
NO_POSITION_IDS = {
    "bart": lambda: transformers.BartConfig(d_model=64, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
                                            encoder_attention_heads=4, decoder_ffn_dim=128, encoder_ffn_dim=128,
                                            max_position_embeddings=128, vocab_size=64, init_std=0.15),
    "trocr": lambda: transformers.TrOCRConfig(d_model=64, decoder_layers=2, decoder_attention_heads=4,
                                              decoder_ffn_dim=128, max_position_embeddings=128, vocab_size=64,
                                              init_std=0.15),
}


@pytest.mark.parametrize("kind", list(NO_POSITION_IDS))
def test_a_decoder_that_takes_no_position_ids_is_refused(kind, monkeypatch):
    """BART's and TrOCR's decoders number a forward's rows from the cache's length whatever positions lp
    means: refused, and without the refusal lp's ids are not generate's."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(NO_POSITION_IDS[kind]()).double().eval()
    run = lambda: lookahead_generate(model, PROMPTS[0], CONFIGS["window+lookup+tree"], GenerationParams(NEW))
    with pytest.raises(ValueError, match=f"{kind}'s forward takes no position_ids"):
        run()
    monkeypatch.setattr(arch, "_numbers_positions_itself", lambda model: False)
    assert run().token_ids != generate(model, PROMPTS[0])


BIDIRECTIONAL_BEFORE_CONFIGS = {     # the models of arch.BIDIRECTIONAL_BEFORE, small
    "megatron-bert": lambda: transformers.MegatronBertConfig(is_decoder=True),
    "rembert": lambda: transformers.RemBertConfig(is_decoder=True, input_embedding_size=64),
    "big_bird": lambda: transformers.BigBirdConfig(is_decoder=True, attention_type="original_full"),
    "doge": lambda: transformers.DogeConfig(num_key_value_heads=2, keep_window_size=2048),
}


@pytest.mark.parametrize("kind", list(BIDIRECTIONAL_BEFORE_CONFIGS))
def test_a_model_that_attends_both_ways_in_this_transformers_is_refused(kind, monkeypatch):
    """On transformers 5.17 these forwards over several tokens attend both ways, so lp's causal rounds gave
    other ids than generate: refused there, naming the version that fixed them; from 5.18 on, generate's
    ids and lp's are the causal forward's. Runs on either end of the declared range."""
    sizes = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128, vocab_size=64,
                 initializer_range=0.15, max_position_embeddings=128)
    config = BIDIRECTIONAL_BEFORE_CONFIGS[kind]()
    config.update(sizes)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    run = lambda prompt: lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"],
                                            GenerationParams(NEW)).token_ids
    if arch._transformers_before(arch.BIDIRECTIONAL_BEFORE[kind]):
        with pytest.raises(ValueError, match=f"{kind} attends both ways .* use transformers >= 5.18"):
            run(PROMPTS[0])
        monkeypatch.setitem(arch.BIDIRECTIONAL_BEFORE, kind, "0")
        assert any(run(prompt) != generate(model, prompt) for prompt in PROMPTS)
    else:
        for prompt in PROMPTS:
            want = generate(model, prompt)
            assert want == full_forward_greedy(model, prompt, NEW) and run(prompt) == want


def test_the_version_gate_reads_the_installed_transformers(monkeypatch):
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    assert arch._transformers_before("5.18") and not arch._transformers_before(None)
    monkeypatch.setattr(transformers, "__version__", "5.18.0")
    assert not arch._transformers_before("5.18")


def test_a_users_pass_through_subclass_is_read_as_its_transformers_class(models):
    """The position_ids check reads transformers' own forward in the class's MRO: a subclass whose forward
    passes `*args, **kwargs` through is still llama (generate's ids), one of BART's decoder still refused."""
    def subclass(model):
        class Mine(type(model)):
            def forward(self, *args, **kwargs):
                return super().forward(*args, **kwargs)
        model.__class__ = Mine
        return model
    model = subclass(tiny_random("llama", dtype=torch.float64))
    assert arch.refusal(model) is None
    run = lookahead_generate(model, PROMPTS[0], CONFIGS["window+lookup+tree"], GenerationParams(NEW))
    assert run.token_ids == generate(model, PROMPTS[0])
    bart = subclass(transformers.AutoModelForCausalLM.from_config(NO_POSITION_IDS["bart"]()))
    assert "bart's forward takes no position_ids" in arch.refusal(bart)
    # torch.compile(model)'s wrapper is no PreTrainedModel: the check passed it (the model's is read now)
    compiled = torch.compile(transformers.AutoModelForCausalLM.from_config(NO_POSITION_IDS["bart"]()))
    assert "bart's forward takes no position_ids" in arch.refusal(compiled)


def test_an_encoder_family_is_decoded_only_as_a_decoder():
    """BERT's causal-LM head attends both ways unless is_decoder is set: refused so (lp's ids differed from
    generate's at the fourth new token), and generate's ids with is_decoder: true."""
    config = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128, vocab_size=64,
                  initializer_range=0.15)
    both_ways = transformers.AutoModelForCausalLM.from_config(transformers.BertConfig(**config)).eval()
    with pytest.raises(ValueError, match="bert is configured with bidirectional attention.*is_decoder: true"):
        lookahead_generate(both_ways, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.BertConfig(**config, is_decoder=True))
    model = model.double().eval()
    for prompt in PROMPTS:
        r = lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"], GenerationParams(NEW))
        assert r.token_ids == generate(model, prompt)


def test_gemma3n_runs_unless_its_layers_share_k_v():
    """Gemma 3n's later layers may read earlier layers' K/V (num_kv_shared_layers), which lp's cache does not
    model: refused. Without sharing its config still lists a mode per layer ([None, None]), which was
    refused as sharing too; it gives generate's ids."""
    config = dict(vocab_size=64, vocab_size_per_layer_input=64, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16,
                  layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=16,
                  altup_num_inputs=2, laurel_rank=8, activation_sparsity_pattern=[0.0, 0.0])
    shared = {**config, "num_hidden_layers": 4, "layer_types": config["layer_types"] * 2,
              "activation_sparsity_pattern": [0.0] * 4}
    sharing = transformers.AutoModelForCausalLM.from_config(
        transformers.Gemma3nTextConfig(**shared, num_kv_shared_layers=2)).eval()
    with pytest.raises(ValueError, match="shares K/V between layers"):
        lookahead_generate(sharing, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Gemma3nTextConfig(**config, num_kv_shared_layers=0)).double().eval()
    for prompt in PROMPTS:
        r = lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"], GenerationParams(NEW))
        assert r.token_ids == generate(model, prompt)


@pytest.mark.skipif(not hasattr(transformers, "DoryConfig"), reason="no Dory in this transformers")
def test_dorys_last_loop_cache_is_refused():
    """Dory's 'last_loop' cache lets earlier loops read the last loop's keys: generate's cached ids are not
    the model's forward (nor lp's, which were); its default 'per_loop' runs."""
    config = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, n_input_layers=1, n_recurrent_layers=1, n_output_layers=1,
                  n_recurrent_loops=2)
    last = transformers.AutoModelForCausalLM.from_config(
        transformers.DoryConfig(**config, recurrent_kv_cache_mode="last_loop")).eval()
    with pytest.raises(ValueError, match="recurrent_kv_cache_mode 'last_loop'"):
        lookahead_generate(last, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))
    per = transformers.AutoModelForCausalLM.from_config(transformers.DoryConfig(**config)).double().eval()
    assert lookahead_generate(per, PROMPTS[0], CONFIGS["job"], GenerationParams(8)).token_ids == \
        generate(per, PROMPTS[0], 8)


def test_attention_that_ignores_the_mask_is_refused():
    model = tiny_random("llama")
    model.config._attn_implementation = "flash_attention_2"    # what a user might have loaded
    with pytest.raises(ValueError, match="attn_implementation 'flash_attention_2'"):
        lookahead_generate(model, [3, 4, 5], LookaheadParams(**JOB_LOOKAHEAD), GenerationParams(4))


@pytest.mark.parametrize("family,attn", [("gemma2", "eager"), ("gpt-oss", "eager"), ("qwen2-swa", "sdpa"),
                                         ("deepseek-v3", "sdpa")])
def test_auto_attention_follows_the_model(family, attn):
    loaded = load_model(f"tiny-random-{family}", dtype="float64", device="cpu")
    assert loaded.model.config._attn_implementation == attn
    eager = load_model(f"tiny-random-{family}", dtype="float64", device="cpu", attn_implementation="eager")
    assert eager.model.config._attn_implementation == "eager"


def test_sdpa_is_refused_for_soft_capped_attention():
    with pytest.raises(ModelLoadError, match="soft-caps its attention scores"):
        load_model("tiny-random-gemma2", dtype="float64", device="cpu", attn_implementation="sdpa")


def test_eager_and_sdpa_rounds_both_match_their_generate(models):
    """The same weights under either implementation: each equals generate on that implementation."""
    for attn in ("eager", "sdpa"):
        model = tiny_random("qwen2-swa", dtype=torch.float64, attn_implementation=attn)
        assert model.config._attn_implementation == attn
        got = lookahead_generate(model, PROMPTS[0], CONFIGS["window+lookup+tree"], GenerationParams(NEW))
        assert got.token_ids == generate(model, PROMPTS[0])


LP_FAMILIES = ["qwen2-swa", "mistral-swa", "gemma2", "gemma3", "llama4", "deepseek-v2", "deepseek-v3"]


def test_lp_two_workers_on_windowed_and_mla_families(models, tmp_path):
    """P = 2 (gloo, torchrun) gives generate's ids and the single worker's per-round counts."""
    cases, expected = [], []
    for family in LP_FAMILIES:
        for prompt in PROMPTS:
            for name, p in CONFIGS.items():
                lookup = {k: getattr(p, k) for k in ("lookup_candidates", "lookup_tokens", "suffix_factor",
                                                     "suffix_tokens", "suffix_min_score", "job_cache")}
                cases.append(dict(model=family, prompt=prompt, w=p.window, n=p.ngram, g=p.guesses, max_new=NEW,
                                  lookup=lookup))
                single = lookahead_generate(models(family), prompt, p, GenerationParams(NEW))
                assert single.token_ids == generate(models(family), prompt)
                expected.append(single)
    spec = {"models": {f: {"family": f} for f in LP_FAMILIES}, "cases": cases}
    ranks = torchrun(2, spec, tmp_path)
    for i, ref in enumerate(expected):
        for rank in ranks:
            got = rank["results"][i]
            assert got["tokens"] == ref.token_ids, cases[i]
            assert got["emitted"] == ref.emitted_per_round, cases[i]


def test_gemma2_checkpoint_directory_runs_as_a_job(tmp_path):
    """A saved Gemma 2 (soft-capped attention, 16-token sliding window on every other layer) with its
    tokenizer, run by `python -m lp.run` with `model.name: <dir>`: loaded with eager attention, every
    completion identical to transformers' generate (the job's in-run baseline) and to a direct generate."""
    from click.testing import CliRunner
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    import json
    import yaml

    from lp.run import main

    model = tiny_random("gemma2", dtype=torch.float32)
    model.save_pretrained(tmp_path / "gemma2")
    words = Tokenizer(WordLevel({"<pad>": 0, "<bos>": 1, "<eos>": 2, **{f"w{i}": i for i in range(3, 64)}},
                                unk_token="<pad>"))
    words.pre_tokenizer = Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", pad_token="<pad>") \
        .save_pretrained(tmp_path / "gemma2")
    prompts = [" ".join(f"w{t}" for t in p) for p in PROMPTS]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": p}) + "\n"
                                                    for i, p in enumerate(prompts)))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": str(tmp_path / "gemma2"), "dtype": "float64", "device": "cpu"},
        "lookahead": {"window": 4, "ngram": 4, "guesses": 4, "lookup_candidates": 2, "suffix_factor": 6},
        "generation": {"max_new_tokens": NEW},
        "data": {"source": "jsonl", "path": str(tmp_path / "prompts.jsonl")},
        "output": {"dir": str(tmp_path / "out")},
        "baseline": True,
    }))
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    loaded = load_model(str(tmp_path / "gemma2"), dtype="float64", device="cpu")
    assert loaded.model.config._attn_implementation == "eager"
    assert len(records) == len(PROMPTS)
    for record, prompt in zip(records, PROMPTS):
        assert record["error"] is None and record["baseline_ids_equal"], record
        assert record["prompt_tokens"] == len(prompt) and record["new_tokens"] == NEW
        assert record["token_ids"] == generate(loaded.model, prompt)


def test_a_job_on_a_recurrent_model_exits_1_naming_it(tmp_path):
    from click.testing import CliRunner
    import json
    import yaml

    from lp.run import main

    (tmp_path / "prompts.jsonl").write_text(json.dumps({"task_id": "t0", "prompt": "abc"}) + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "tiny-random-jamba", "device": "cpu"},
                                      "data": {"source": "jsonl", "path": str(tmp_path / "prompts.jsonl")},
                                      "output": {"dir": str(tmp_path / "out")}}))
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "jamba has recurrent-state layers" in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "results.jsonl").exists() or not (tmp_path / "out" / "results.jsonl").read_text()


def test_the_cuda_attention_rule_is_exact_on_grouped_query_families(models, monkeypatch):
    """On CUDA a round's forward runs SDPA without cuDNN and with grouped K/V heads repeated
    (lp.decode.kv_cache._round_sdpa); no CPU can take that branch on its own, so here every round is
    forced through it: each SDPA family with grouped heads still decodes to generate's ids in float64."""
    from lp.decode import kv_cache

    original = kv_cache._round_sdpa
    monkeypatch.setattr(kv_cache, "_round_sdpa", lambda device: original(torch.device("cuda")))
    configs = {f: models(f).config for f in FAMILIES}
    grouped = [f for f, c in configs.items() if c._attn_implementation == "sdpa"
               and getattr(c, "num_key_value_heads", None) not in (None, c.num_attention_heads)]
    assert len(grouped) >= 20, grouped      # 31 of the 35 families today
    for family in grouped:
        model = models(family)
        got = lookahead_generate(model, PROMPTS[0], CONFIGS["window+lookup+tree"], GenerationParams(NEW))
        assert got.token_ids == generate(model, PROMPTS[0]), family


def test_grouped_query_families_decode_through_packed_heads(models, monkeypatch):
    """On the CPU a round's several-row attention goes to SDPA with a group's query heads stacked
    along the rows (lp.decode.kv_cache.grouped_sdpa): a spy on SDPA sees the first six grouped-query
    SDPA families' rounds call it with as many heads as K/V heads and never with repeated K/V, and
    they still decode to generate's ids in float64 (every family: test_family_is_identical_to_generate)."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.shape[1], key.shape[1], query.shape[2]))
        return sdpa(query, key, value, *args, **kwargs)
    configs = {f: models(f).config for f in FAMILIES}
    grouped = [f for f, c in configs.items() if c._attn_implementation == "sdpa"
               and getattr(c, "num_key_value_heads", None) not in (None, c.num_attention_heads)]
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    for family in grouped[:6]:
        seen.clear()
        got = lookahead_generate(models(family), PROMPTS[0], CONFIGS["window+lookup+tree"], GenerationParams(8))
        calls, heads = list(seen), configs[family].num_attention_heads
        assert got.token_ids == generate(models(family), PROMPTS[0], 8), family
        assert calls and all(k < q for q, k, _ in calls if q == heads), (family, calls[:3])   # never repeated
        assert any(q == k and rows > 1 for q, k, rows in calls), family                       # packed rows


@pytest.mark.parametrize("rows,heads,mask_heads,dtype", [(1, 6, 1, torch.float32), (5, 6, 1, torch.float32),
                                                          (5, 6, 6, torch.float64), (7, 4, 1, torch.bool)])
def test_grouped_sdpa_is_transformers_sdpa(rows, heads, mask_heads, dtype):
    """grouped_sdpa gives transformers' own SDPA attention (grouped heads repeated) for float and
    boolean masks shared by all heads or per head, at one row and several; with a float32 additive mask
    (a round's) the same bits as SDPA with enable_gqa (the CPU kernel computes each query row alone)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from lp.decode.kv_cache import grouped_sdpa

    gen = torch.Generator().manual_seed(rows * 10 + heads)
    value_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    batch, kv, span, size = 3, 2, 40, 8
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv, True
    q = torch.randn(batch, heads, rows, size, generator=gen, dtype=value_dtype)
    k, v = (torch.randn(batch, kv, span, size, generator=gen, dtype=value_dtype) for _ in range(2))
    hidden = torch.rand(batch, mask_heads, rows, span, generator=gen) < 0.3
    hidden[..., 0] = False                       # every row sees a slot
    mask = ~hidden if dtype == torch.bool else torch.zeros(hidden.shape, dtype=value_dtype).masked_fill(
        hidden, torch.finfo(value_dtype).min)
    got, _ = grouped_sdpa(module, q, k, v, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (batch, rows, heads, size)
    assert torch.allclose(got, want, rtol=0, atol=1e-12 if value_dtype == torch.float64 else 1e-6)
    if dtype == torch.float32 and mask_heads == 1:
        gqa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
        assert torch.equal(got, gqa.transpose(1, 2))


# Models whose forward changes with the largest position it holds: a round's draft rows must not reach
# where plain decoding's forward does not (lp.decode.arch.draft_ceiling). Each case: (family, overrides,
# prompt length, new tokens): at the end of a 64-position table (the old engine's drafts indexed past it),
# and across a RoPE threshold (dynamic: 64; longrope: 32, where Phi-3's generate also re-encodes everything).
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
            "original_max_position_embeddings": 32, "rope_theta": 10000.0}
POSITION_CASES = {
    "gpt2-table-end": ("gpt2", dict(max_position_embeddings=64), 52, 12),
    "codegen-table-end": ("codegen", dict(max_position_embeddings=64, n_ctx=64), 52, 12),
    "llama-dynamic-rope": ("llama", dict(max_position_embeddings=64, rope_parameters={
        "rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}), 30, 50),
    "llama-longrope": ("llama", dict(max_position_embeddings=128, rope_parameters=LONGROPE), 20, 40),
    "phi3-longrope-reencode": ("phi3", dict(max_position_embeddings=128, original_max_position_embeddings=32,
                                            rope_parameters=LONGROPE), 20, 40),
}
PATTERN = [5, 9, 12, 30, 41, 7, 18, 22]     # repeated: long suffix drafts right up to the threshold


def position_case(name):
    family, overrides, length, new = POSITION_CASES[name]
    return tiny_random(family, dtype=torch.float64, **overrides), (PATTERN * 8)[:length], new


def position_reference(name, model, prompt, new):
    """generate's ids; for Phi-3 across its re-encode, those of a full forward per token where the two
    differ (they agree on 5.25): transformers 5.17's re-encode step drops the cache but still feeds
    only the last token (its generic prepare_inputs_for_generation slices by next_sequence_length;
    5.25 clears that), so there
    generate itself is not the model's computation."""
    reference = generate(model, prompt, new)
    if name == "phi3-longrope-reencode":
        full = full_forward_greedy(model, prompt, new)
        if full != reference:    # 5.17 (equal on 5.25)
            reference = full
    return reference


@pytest.mark.parametrize("name", list(POSITION_CASES))
def test_drafts_stay_below_position_thresholds(name):
    model, prompt, new = position_case(name)
    reference = position_reference(name, model, prompt, new)
    multi = 0
    for params in CONFIGS.values():
        r = lookahead_generate(model, prompt, params, GenerationParams(new))
        assert r.token_ids == reference, (name, params)
        multi += sum(e > 1 for e in r.emitted_per_round)
    assert multi >= 1, f"{name}: no round accepted a draft"


@pytest.mark.parametrize("name", ["gpt2-table-end", "codegen-table-end"])
def test_running_past_a_position_table_names_the_limit(name):
    """Past the end of a learned position table generate fails with a bare IndexError; lp says where and why
    (a job refuses such a prompt before decoding). One token fewer is generate's ids."""
    model, prompt, _ = position_case(name)
    room = 64 - len(prompt) + 1         # the last new token is never fed
    with pytest.raises(IndexError):
        generate(model, prompt, room + 1)
    with pytest.raises(ValueError, match="a request reached position 64, past the model's 64 positions"):
        lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"], GenerationParams(room + 1))
    assert lookahead_generate(model, prompt, CONFIGS["window+lookup+tree"], GenerationParams(room)).token_ids == \
        generate(model, prompt, room)


def test_the_row_budget_measures_inside_a_short_position_table():
    """The row budget's grid was measured over 256 cached tokens whatever the model: on a 64-position table
    lp.generate at batch_size 2 failed before decoding anything, blaming the request. It measures over
    what the table holds, and the batch is generate's."""
    import lp

    model, _, _ = position_case("gpt2-table-end")
    prompts = [PATTERN * 2 + [3, 4, 5, 6], PATTERN * 2 + [7, 8, 9, 10, 11]]
    got = lp.generate(model, prompts, max_new_tokens=20, eos_token_id=None, batch_size=2)
    assert [r.token_ids for r in got] == [generate(model, p, 20) for p in prompts]


def test_other_failures_past_the_context_length_keep_their_own_error():
    """A RoPE model runs past max_position_embeddings (generate too); a failure there that is no index out of
    range (here an out-of-memory error) is raised as it is, not as a position-table error."""
    model = tiny_random("llama", dtype=torch.float64, max_position_embeddings=32)
    prompt = (PATTERN * 5)[:40]
    assert lookahead_generate(model, prompt, CONFIGS["job"], GenerationParams(8)).token_ids == \
        generate(model, prompt, 8)

    def boom(module, args, kwargs):
        raise torch.cuda.OutOfMemoryError("out of memory (a test's)")
    hook = model.model.layers[1].register_forward_pre_hook(boom, with_kwargs=True)
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError, match="a test's"):
            lookahead_generate(model, prompt, CONFIGS["job"], GenerationParams(8))
    finally:
        hook.remove()


def test_a_batch_on_a_threshold_rope_model_is_decoded_one_at_a_time(caplog):
    """One request past a dynamic RoPE's threshold would rescale every request of a shared forward: the
    batch is decoded one request at a time (a warning says so), each identical to generate."""
    from lp.engine import decode_batch

    model, prompt, new = position_case("llama-dynamic-rope")
    prompts = [prompt, prompt[3:], prompt[:20]]
    with caplog.at_level("WARNING", logger="lp.engine"):
        got = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(prompts)], CONFIGS["window+lookup+tree"],
                                GenerationParams(new), batch_size=3))
    assert "one at a time (batch_size 3 -> 1)" in caplog.text
    assert [got[i].token_ids for i in range(3)] == [generate(model, p, new) for p in prompts]


def padded_generate(model, rows, new, **kwargs):
    """generate's new ids for a left-padded batch of `rows` (pad 0, no EOS); its whole output where
    kwargs ask for a dict."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0,
                         eos_token_id=None, **kwargs)
    return out if kwargs.get("return_dict_in_generate") else out[:, width:].tolist()


@pytest.mark.parametrize("name", ["llama-dynamic-rope", "llama-longrope"])
def test_the_drop_in_refuses_a_padded_batch_that_shares_a_threshold_rope(name):
    """generate's padded batch shares one dynamic or longrope RoPE across its rows: once its longest row
    reaches the threshold T, a shorter row's ids are not those it has alone (lp's, row by row), so the
    drop-in refuses such a batch; rows of one length, a batch that stays below T, and under longrope a
    batch whose rows all start past T are generate's."""
    import lp

    model, _, _ = position_case(name)
    threshold = rope_threshold(model.config)
    short, long = PATTERN[:6], (PATTERN * 16)[:threshold - 4]
    new = 16                            # the long row's forwards reach threshold - 4 + 14 >= T
    batch = padded_generate(model, [short, long], new, output_scores=True, return_dict_in_generate=True)
    alone = model.generate(torch.tensor([short]), do_sample=False, max_new_tokens=new, pad_token_id=0,
                           eos_token_id=None, output_scores=True, return_dict_in_generate=True)
    apart = [(b[0] - a[0]).abs().max().item() for b, a in zip(batch.scores, alone.scores)]
    assert max(apart[:threshold - len(long) + 1]) < 1e-9 < min(apart[-2:])   # why: coupled from T on
    with pytest.raises(ValueError, match=f"RoPE follows the largest position of a forward from position "
                                         f"{threshold} on"):
        padded_generate(model, [short, long], new, custom_generate=lp.lookahead)
    assert padded_generate(model, [long, long[::-1]], new, custom_generate=lp.lookahead) == \
        padded_generate(model, [long, long[::-1]], new)                 # one length: every position shared
    below = threshold - len(long) + 1                                   # the longest forward ends at T - 1
    assert padded_generate(model, [short, long], below, custom_generate=lp.lookahead) == \
        padded_generate(model, [short, long], below)
    past = [(PATTERN * 16)[:threshold + 1], (PATTERN * 16)[:threshold + 8]]     # both rows start past T
    if name == "llama-longrope":        # one switch, which both rows alone have made too: generate's ids
        assert padded_generate(model, past, 6, custom_generate=lp.lookahead) == padded_generate(model, past, 6)
    else:                               # dynamic: rescaled by the longest row's very position, so refused
        with pytest.raises(ValueError, match="RoPE follows the largest position"):
            padded_generate(model, past, 6, custom_generate=lp.lookahead)


def test_lp_two_workers_across_position_thresholds(tmp_path):
    """P = 2 re-feeds the emitted tokens: across a dynamic or longrope threshold (and Phi-3's re-encode) the
    re-fed rows never straddle it, and every rank writes generate's ids and the single worker's rounds."""
    names = ["gpt2-table-end", "llama-dynamic-rope", "llama-longrope", "phi3-longrope-reencode"]
    cases, expected = [], []
    for name in names:
        model, prompt, new = position_case(name)
        p = CONFIGS["window+lookup+tree"]
        lookup = {k: getattr(p, k) for k in ("lookup_candidates", "lookup_tokens", "suffix_factor", "suffix_tokens")}
        cases.append(dict(model=name, prompt=prompt, w=p.window, n=p.ngram, g=p.guesses, max_new=new, lookup=lookup))
        single = lookahead_generate(model, prompt, p, GenerationParams(new))
        assert single.token_ids == position_reference(name, model, prompt, new)
        expected.append(single)
    spec = {"models": {n: {"family": POSITION_CASES[n][0], **POSITION_CASES[n][1]} for n in names}, "cases": cases}
    for rank in torchrun(2, spec, tmp_path):
        for i, ref in enumerate(expected):
            assert (rank["results"][i]["tokens"], rank["results"][i]["emitted"]) == \
                (ref.token_ids, ref.emitted_per_round), names[i]


def test_measuring_a_models_cache_layout_logs_no_padding_warning():
    """lp reads each layer's K/V shapes with a one-token forward (kv_cache.layer_shapes): fed the pad id
    without a mask, GPT-2-style models logged transformers' 'We strongly recommend passing in an
    `attention_mask`' at a user's first lp.generate call."""
    from transformers.utils import logging as hf_logging

    from lp.decode.kv_cache import layer_shapes

    class Seen(__import__("logging").Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())
    seen, logger = Seen(), hf_logging.get_logger("transformers")
    if hasattr(hf_logging.warning_once, "cache_clear"):   # a warning logged once per process: let it log again
        hf_logging.warning_once.cache_clear()
    logger.addHandler(seen)
    try:
        model = tiny_random("gpt2", dtype=torch.float64)
        assert model.config.pad_token_id == 0 and len(layer_shapes(model)) == 2
    finally:
        logger.removeHandler(seen)
    assert not [line for line in seen.lines if "attention_mask" in line], seen.lines
