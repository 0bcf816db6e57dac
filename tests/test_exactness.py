"""Greedy lookahead output is token-identical to model.generate(do_sample=False) (float64)."""
import itertools

import pytest
import torch

from lp.engine import GenerationParams, LookaheadParams, lookahead_generate

PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3],
    [7, 7, 8, 9, 7, 7, 8, 9, 10],
    [3],
    [12, 4, 12, 4, 12, 4, 9, 1, 0, 5],
]
NEW = 40
GRID = list(itertools.product([3, 4, 5, 7], [1, 2, 5, 15], [0, 1, 5, 15]))


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


@pytest.mark.parametrize("bad,key", [((2, 5, 5), "ngram"), ((5, -1, 5), "window"), ((5, 5, -1), "guesses")])
def test_bad_params_rejected_before_model_work(bad, key):
    n, w, g = bad

    class NoModel:   # any model access would raise AttributeError, not ValueError
        pass

    with pytest.raises(ValueError, match=f"lookahead.{key}"):
        lookahead_generate(NoModel(), [1, 2], LookaheadParams(w, n, g), GenerationParams(4))


# ---------------------------------------------------------------- lookup candidates

# (W, N, G, lookup candidates, lookup tokens, lookup ngram); W = 0: no Jacobi window
LOOKUP_GRID = [(0, 3, 0, 2, 10, 3), (0, 4, 5, 2, 6, 2), (2, 4, 5, 2, 8, 3), (5, 5, 15, 3, 12, 2),
               (1, 3, 1, 2, 6, 1), (15, 7, 15, 4, 9, 4)]
# prompts that repeat a span: lookup copies it, so a long round holds tokens not yet in the output
# (found by search with this model; EOS can then fall past the N-th token of such a round)
SPAN_PROMPTS = [[4, 9, 4, 3, 12, 13, 1, 8, 15, 12, 9, 15, 11, 6, 8, 4, 9, 3, 2, 12, 13, 1],
                [10, 11, 1, 15, 11, 3, 4, 8, 0, 1, 1, 6, 8, 13, 11, 5, 6, 11, 3],
                [15, 3, 1, 14, 10, 3, 9, 4, 12, 9, 6, 1, 12, 14, 11, 15],
                [0, 13, 2, 3, 13, 13, 13, 0, 15, 13, 2], [9, 8, 8, 7, 0, 3, 3, 5, 13, 7, 13, 8]]


def run_lookup(model, prompt, cfg, max_new=NEW, eos=()):
    w, n, g, lc, k, m = cfg
    return lookahead_generate(model, prompt, LookaheadParams(w, n, g, True, lc, k, m),
                              GenerationParams(max_new), eos_token_ids=list(eos))


@pytest.mark.parametrize("cfg", LOOKUP_GRID)
def test_lookup_candidates_identical_to_generate(model16, references, cfg):
    n, k = cfg[1], cfg[4]
    emitted = []
    for prompt in PROMPTS:
        r = run_lookup(model16, prompt, cfg)
        assert r.token_ids == references[tuple(prompt)], (prompt, cfg)
        assert sum(r.emitted_per_round) == NEW and max(r.emitted_per_round) <= max(n, k + 1)
        emitted += r.emitted_per_round
    if k + 1 > n:   # lookup really wins rounds: some emit more than a Jacobi n-gram can
        assert max(emitted) > n, cfg


def long_round_cuts(model, cfg):
    """For each prompt, the first round that emits more than N tokens:
    (prompt, tokens before it, tokens it emits, the full output)."""
    n = cfg[1]
    for prompt in PROMPTS + SPAN_PROMPTS:
        r = run_lookup(model, prompt, cfg)
        done = 0
        for e in r.emitted_per_round:
            if e > n:
                yield prompt, done, e, r.token_ids
                break
            done += e


def fresh_eos(full, before, emitted):
    """The last offset j (1 <= j < emitted) inside the round whose token has not occurred
    in the output before it: with it as EOS, generation stops at j inside that round."""
    inside = [j for j in range(1, emitted) if full[before + j] not in full[:before + j]]
    return inside[-1] if inside else None


LONG_CUT_CONFIGS = [(0, 3, 0, 2, 10, 3), (2, 4, 5, 2, 8, 3)]


@pytest.mark.parametrize("cfg", LONG_CUT_CONFIGS)
def test_max_new_tokens_and_eos_inside_a_long_round(model16, cfg):
    cases, eos_cases = 0, 0
    for prompt, before, emitted, full in long_round_cuts(model16, cfg):
        limit = before + emitted - 1          # the round loses its last token
        r = run_lookup(model16, prompt, cfg, max_new=limit)
        assert r.token_ids == greedy(model16, prompt, limit) == full[:limit]
        assert r.finish_reason == "length"
        cases += 1
        j = fresh_eos(full, before, emitted)
        if j is not None:
            r = run_lookup(model16, prompt, cfg, eos=[full[before + j]])
            assert r.token_ids == greedy(model16, prompt, NEW, eos=full[before + j]) == full[:before + j + 1]
            assert r.finish_reason == "eos"
            eos_cases += 1
    assert cases >= 3 and eos_cases >= 1


# ---------------------------------------------------------------- token trees

from lp.decode import propose  # noqa: E402
from lp.decode.suffix import SuffixIndex  # noqa: E402

# (W, N, G, extra lookahead keys): suffix drafts from the request and a job corpus, merged with
# the pool and lookup; budgets that cut the tree; window on and off
TREE_GRID = [
    (0, 3, 0, dict(suffix_factor=4, suffix_tokens=12)),
    (0, 4, 4, dict(suffix_factor=8, suffix_tokens=32, suffix_min_score=0.1, job_cache=True)),
    (0, 3, 0, dict(lookup_candidates=2, lookup_tokens=8, suffix_factor=2, suffix_tokens=16, job_cache=True,
                   tree_budget=6)),
    (3, 4, 3, dict(lookup_candidates=2, lookup_tokens=6, suffix_factor=4, suffix_tokens=10, job_cache=True,
                   tree_budget=12)),
    (5, 5, 15, dict(suffix_factor=8, suffix_tokens=24, job_cache=True)),
    (2, 3, 5, dict(suffix_factor=1, suffix_tokens=4, job_cache=True, tree_budget=3)),
]


def job_corpus(model, prompts, new=NEW):
    """A job-wide index holding the greedy completions of `prompts` (earlier tasks of a job)."""
    corpus = SuffixIndex(propose.SUFFIX_NGRAM)
    for p in prompts:
        corpus.add(greedy(model, p, new))
    return corpus


@pytest.fixture
def trees_seen(monkeypatch):
    """Every token tree the proposer builds during the test."""
    seen = []
    original = propose.Proposer.tree

    def tree(self, max_depth=None):
        t = original(self, max_depth)
        seen.append(t)
        return t
    monkeypatch.setattr(propose.Proposer, "tree", tree)
    return seen


def run_tree(model, prompt, cfg, corpus=None, max_new=NEW, eos=()):
    w, n, g, extra = cfg
    return lookahead_generate(model, prompt, LookaheadParams(w, n, g, **extra), GenerationParams(max_new),
                              eos_token_ids=list(eos), corpus=corpus)


@pytest.mark.parametrize("cfg", TREE_GRID)
def test_token_trees_identical_to_generate(model16, references, cfg, trees_seen):
    """Tree rounds (shared prefixes, branches below the root, budget cuts, a job corpus
    built from other prompts' completions) give generate's tokens."""
    emitted = []
    for i, prompt in enumerate(PROMPTS + SPAN_PROMPTS):
        corpus = job_corpus(model16, [p for p in PROMPTS + SPAN_PROMPTS if p != prompt][:3]) \
            if cfg[3].get("job_cache") else None
        r = run_tree(model16, prompt, cfg, corpus)
        assert r.token_ids == greedy(model16, prompt, NEW), (prompt, cfg)
        emitted += r.emitted_per_round
        budget = cfg[3].get("tree_budget")
        assert all(len(t) <= budget for t in trees_seen) if budget else True
    assert max(emitted) > cfg[1] or cfg[3].get("suffix_tokens", 0) < cfg[1]   # longer than an n-gram
    branching = [t for t in trees_seen if any(len(t.children(u)) > 1 for u in range(len(t)))]
    assert branching, "no tree branched below the root"


def tree_cuts(model, cfg):
    """For each prompt, the first round that emits more than 2 tokens: (prompt, corpus,
    tokens before it, tokens it emits, the full output)."""
    for prompt in PROMPTS + SPAN_PROMPTS:
        corpus = lambda: job_corpus(model, [p for p in PROMPTS if p != prompt][:2])  # noqa: E731
        r = run_tree(model, prompt, cfg, corpus())
        done = 0
        for e in r.emitted_per_round:
            if e > 2:
                yield prompt, corpus, done, e, r.token_ids
                break
            done += e


@pytest.mark.parametrize("cfg", [TREE_GRID[1], TREE_GRID[3]])
def test_max_new_tokens_and_eos_inside_an_accepted_path(model16, cfg):
    cases = eos_cases = 0
    for prompt, corpus, before, emitted, full in tree_cuts(model16, cfg):
        limit = before + emitted - 1
        r = run_tree(model16, prompt, cfg, corpus(), max_new=limit)
        assert r.token_ids == greedy(model16, prompt, limit) == full[:limit] and r.finish_reason == "length"
        cases += 1
        j = fresh_eos(full, before, emitted)
        if j is not None:
            r = run_tree(model16, prompt, cfg, corpus(), eos=[full[before + j]])
            assert r.token_ids == greedy(model16, prompt, NEW, eos=full[before + j]) == full[:before + j + 1]
            assert r.finish_reason == "eos"
            eos_cases += 1
    assert cases >= 3 and eos_cases >= 1
