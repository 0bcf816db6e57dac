"""Greedy lookahead output is token-identical to model.generate(do_sample=False) (float64)."""
import itertools

import pytest
import torch

from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import tiny_random_llama

PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3],
    [7, 7, 8, 9, 7, 7, 8, 9, 10],
    [3],
    [12, 4, 12, 4, 12, 4, 9, 1, 0, 5],
]
NEW = 40
GRID = list(itertools.product([3, 4, 5, 7], [1, 2, 5, 15], [0, 1, 5, 15]))


@pytest.fixture(scope="module")
def model16():
    return tiny_random_llama(vocab=16, seed=1).model.double()


def greedy(model, prompt, max_new_tokens, eos=None):
    out = model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=eos, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def references(model16):
    return {tuple(p): greedy(model16, p, NEW) for p in PROMPTS}


def run(model, prompt, n, w, g, max_new=NEW, eos=(), seeding=True):
    return lookahead_generate(model, prompt, LookaheadParams(w, n, g, seeding),
                              GenerationParams(max_new), eos_token_ids=list(eos))


@pytest.mark.parametrize("n,w,g", GRID)
def test_greedy_identical_to_generate(model16, references, n, w, g):
    emitted = []
    for prompt in PROMPTS:
        r = run(model16, prompt, n, w, g)
        assert r.token_ids == references[tuple(prompt)], (prompt, n, w, g)
        assert r.finish_reason == "length" and r.new_tokens == NEW
        assert sum(r.emitted_per_round) == NEW and r.forwards == len(r.emitted_per_round)
        assert max(r.emitted_per_round) <= n
        emitted += r.emitted_per_round
    if g > 0:   # the test exercises acceptance: multi-token rounds and full N-token rounds
        assert max(emitted) > 1
    if g >= 5:
        assert n in emitted


def test_grid_really_accepts(model16):
    """Across the grid, rounds that emit N tokens occur for every N."""
    for n in (3, 4, 5, 7):
        counts = [e for p in PROMPTS for e in run(model16, p, n, 5, 15).emitted_per_round]
        assert counts.count(n) >= 3, n


def multi_token_cuts(model, n, w, g):
    """For each prompt whose run has a round emitting >= 2 tokens, the first such round:
    (prompt, tokens before it, the full output)."""
    for prompt in PROMPTS:
        r = run(model, prompt, n, w, g)
        done = 0
        for e in r.emitted_per_round:
            if e >= 2:
                yield prompt, done, r.token_ids
                break
            done += e


CUT_CONFIGS = [(3, 2, 5), (4, 5, 15), (5, 15, 15), (7, 5, 5)]


@pytest.mark.parametrize("n,w,g", CUT_CONFIGS)
def test_max_new_tokens_inside_an_accepted_run(model16, n, w, g):
    cases = 0
    for prompt, before, _ in multi_token_cuts(model16, n, w, g):
        limit = before + 1                # stop after the first token of a multi-token round
        r = run(model16, prompt, n, w, g, max_new=limit)
        assert r.token_ids == greedy(model16, prompt, limit)
        assert r.new_tokens == limit and r.finish_reason == "length"
        cases += 1
    assert cases >= 2


@pytest.mark.parametrize("n,w,g", CUT_CONFIGS)
def test_eos_inside_an_accepted_run(model16, n, w, g):
    cases = 0
    for prompt, before, full in multi_token_cuts(model16, n, w, g):
        eos = full[before + 1]            # the second token of the multi-token round
        if eos in full[:before + 1]:
            continue                      # it would stop earlier: not the case we want
        r = run(model16, prompt, n, w, g, eos=[eos])
        assert r.token_ids == greedy(model16, prompt, NEW, eos=eos) == full[:before + 2]
        assert r.finish_reason == "eos"
        cases += 1
    assert cases >= 1


def test_pool_seeding_off_is_exact_too(model16, references):
    for prompt in PROMPTS:
        assert run(model16, prompt, 5, 5, 5, seeding=False).token_ids == references[tuple(prompt)]


@pytest.mark.parametrize("bad,key", [((2, 5, 5), "ngram"), ((5, 0, 5), "window"), ((5, 5, -1), "guesses")])
def test_bad_params_rejected_before_model_work(bad, key):
    n, w, g = bad

    class NoModel:   # any model access would raise AttributeError, not ValueError
        pass

    with pytest.raises(ValueError, match=f"lookahead.{key}"):
        lookahead_generate(NoModel(), [1, 2], LookaheadParams(w, n, g), GenerationParams(4))
