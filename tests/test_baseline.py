"""Autoregressive decoding (generation.method: autoregressive, the in-run baseline) stops exactly
where lookahead does and is pure greedy whatever the checkpoint's generation config says."""
from __future__ import annotations

import pytest

from lp.baseline import autoregressive_generate
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import load_model

TINY = "tiny-random-llama?vocab=64&seed=0"


@pytest.fixture(scope="module")
def loaded():
    return load_model(TINY, dtype="float64", device="cpu")


def both(loaded, prompt, gen, eos):
    ids = loaded.tokenizer.encode(prompt)
    la = lookahead_generate(loaded.model, ids, LookaheadParams(4, 3, 4), gen, eos_token_ids=eos,
                            tokenizer=loaded.tokenizer)
    ar = autoregressive_generate(loaded.model, ids, gen, eos_token_ids=eos, tokenizer=loaded.tokenizer)
    return la, ar


def test_length(loaded):
    la, ar = both(loaded, "def add(a, b):\n    return", GenerationParams(20), loaded.eos_token_ids)
    assert ar.finish_reason == la.finish_reason == "length"
    assert ar.token_ids == la.token_ids and ar.new_tokens == 20
    assert ar.forwards == 20 and ar.compression == 1.0 and ar.emitted_per_round == [1] * 20
    assert ar.decode_seconds > 0 and ar.text == la.text


def test_eos_inside_the_output(loaded):
    free, _ = both(loaded, "abc abc abc", GenerationParams(24), [])
    eos = free.token_ids[6]
    first = free.token_ids.index(eos)
    la, ar = both(loaded, "abc abc abc", GenerationParams(24), [eos])
    assert la.finish_reason == ar.finish_reason == "eos"
    assert ar.token_ids == la.token_ids == free.token_ids[:first + 1]  # EOS included, as generate does


def test_stop_string(loaded):
    free, _ = both(loaded, "Once upon a time", GenerationParams(24), [])
    stop = free.text[8:10]
    la, ar = both(loaded, "Once upon a time", GenerationParams(24, stop=(stop,)), [])
    assert la.finish_reason == ar.finish_reason == "stop"
    assert ar.token_ids == la.token_ids and len(ar.token_ids) < 24
    assert ar.text == la.text == free.text[:free.text.index(stop)]


def test_checkpoint_generation_config_is_ignored_and_restored(loaded):
    ids = loaded.tokenizer.encode("abc abc abc")
    reference = autoregressive_generate(loaded.model, ids, GenerationParams(16), eos_token_ids=[],
                                        tokenizer=loaded.tokenizer)
    own = loaded.model.generation_config
    saved = own.repetition_penalty, own.no_repeat_ngram_size, own.suppress_tokens, own.min_new_tokens
    # keys generate merges into an explicit config (suppress_tokens, min_new_tokens) and keys it does not
    own.repetition_penalty, own.no_repeat_ngram_size = 5.0, 2
    own.suppress_tokens, own.min_new_tokens = [reference.token_ids[0]], 20
    try:
        again = autoregressive_generate(loaded.model, ids, GenerationParams(16), eos_token_ids=[],
                                        tokenizer=loaded.tokenizer)
        assert loaded.model.generation_config is own
        # the processors would change this output: prove it with a plain generate call
        import torch
        x = torch.tensor([ids])
        penalised = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16,
                                          do_sample=False)[0, len(ids):].tolist()
    finally:
        own.repetition_penalty, own.no_repeat_ngram_size, own.suppress_tokens, own.min_new_tokens = saved
    assert again.token_ids == reference.token_ids
    assert penalised != reference.token_ids


def test_processors_reach_generate(loaded):
    """The job's processor keys reach generate: greedy with them is lookahead's (float64), and they change
    the output; sampling takes every warper key generate has (its config accepts them as lp passes them)."""
    free, _ = both(loaded, "abc abc abc", GenerationParams(20), [])
    gen = GenerationParams(20, suppress_tokens=tuple(free.token_ids[:2]), no_repeat_ngram_size=2,
                           bad_words_ids=((free.token_ids[3], free.token_ids[4]),), repetition_penalty=1.3,
                           sequence_bias=(((free.token_ids[5],), -2.0), ((free.token_ids[5], free.token_ids[6]), 3.0)),
                           forced_eos_token_id=(free.token_ids[7],))
    la, ar = both(loaded, "abc abc abc", gen, [])
    assert ar.token_ids == la.token_ids != free.token_ids
    sampled = GenerationParams(12, temperature=0.9, top_h=0.9, top_k=20, top_p=0.95, min_p=0.01, typical_p=0.9,
                               epsilon_cutoff=0.001, eta_cutoff=0.001, seed=3)
    assert autoregressive_generate(loaded.model, [5, 6, 7], sampled, eos_token_ids=[]).new_tokens == 12


def test_sampling_with_top_k_0_is_not_cut_to_generates_top_50(loaded):
    """A job's `top_k: 0` is off for the autoregressive method and the in-run baseline, as for lookahead:
    their generate gets 0, since an unset top_k in a GenerationConfig is filled with generate's 50, which
    would leave 14 of this model's 64 tokens out. With top_k 50 none of those is drawn (the control)."""
    import torch
    x = torch.tensor([[5, 6, 7]])
    scores = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=3.0,
                                   max_new_tokens=1, pad_token_id=0, output_scores=True,
                                   return_dict_in_generate=True).scores[0][0]
    kept = set(torch.isfinite(scores).nonzero().flatten().tolist())
    assert len(kept) == 50

    def firsts(top_k):
        return {autoregressive_generate(loaded.model, [5, 6, 7], GenerationParams(1, temperature=3.0, top_k=top_k,
                                                                                  seed=seed)).token_ids[0]
                for seed in range(300)}
    assert firsts(0) - kept
    assert firsts(50) <= kept


def test_empty_prompt_is_rejected(loaded):
    with pytest.raises(ValueError, match="empty"):
        autoregressive_generate(loaded.model, [], GenerationParams(4))
