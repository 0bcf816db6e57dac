"""A round's own work outside the model forward is a fixed handful of ops (at most ROUND_OPS launching
aten ops, counted on the CPU by lp.measure.round_ops; on a GPU each is at least one kernel launch),
whatever the tree's depth, the round's size or the batch: greedy rounds with the window, lookup
spans and token trees at depths 4, 16 and 32, the default job's suffix trees, and batches of 4; sampled
rounds too, whatever the tree's width or the batch (transformers' top-k and top-p warpers add their own)."""
from pathlib import Path

import pytest
import torch
from conftest import own_completion_corpus

import lp.engine as engine
from lp.engine import GenerationParams, LookaheadParams, decode_batch, lookahead_generate
from lp.jobs.config import load_config
from lp.measure.round_ops import RoundOps

ROUND_OPS = 30
PROMPT = [1, 2, 3, 4, 5, 6, 7] * 8
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(model16):
    return own_completion_corpus(model16, PROMPT, 48)


@pytest.fixture
def depths(monkeypatch):
    """The deepest tree of each round, as the leader shares it."""
    seen = []
    share = engine.Rounds.share_trees

    def recorded(self, trees, n):
        shared = share(self, trees, n)
        seen.append(max(t.max_depth for t in shared))
        return shared
    monkeypatch.setattr(engine.Rounds, "share_trees", recorded)
    return seen


def default_job_lookahead() -> LookaheadParams:
    return load_config(ROOT / "configs" / "humaneval-smollm2.yaml").lookahead


CASES = {f"window, lookup, tree of depth {d}": (LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=d), d)
         for d in (4, 16, 32)}


@pytest.mark.parametrize("name", list(CASES))
def test_round_ops_are_bounded_at_every_tree_depth(model16, depths, name):
    params, depth = CASES[name]
    with RoundOps().counting() as ops:
        r = lookahead_generate(model16, PROMPT, params, GenerationParams(48))
    assert len(ops.rounds) == r.forwards > 3 and max(depths) == depth      # the deep trees were verified
    assert max(ops.rounds) <= ROUND_OPS, (ops.rounds, ops.ops)


def test_round_ops_of_the_default_jobs_tree(model16, corpus, depths):
    params = default_job_lookahead()
    assert params.suffix and params.job_cache
    with RoundOps().counting() as ops:
        r = lookahead_generate(model16, PROMPT, params, GenerationParams(48), corpus=corpus)
    assert max(r.emitted_per_round) > 4 and max(depths) > 4                # deep suffix drafts hit
    assert max(ops.rounds) <= ROUND_OPS, (ops.rounds, ops.ops)


def test_round_ops_do_not_grow_with_the_batch(model16, corpus, depths):
    prompts = [(i, PROMPT[i:], i) for i in range(6)]
    params = LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=16)
    with RoundOps().counting() as ops:
        results = dict(decode_batch(model16, prompts, params, GenerationParams(32), batch_size=4))
    assert len(results) == 6 and all(not isinstance(r, Exception) for r in results.values()) and max(depths) == 16
    assert max(ops.rounds) <= ROUND_OPS, (ops.rounds, ops.ops)
    assert max(results[0].batch_per_round) == 4


def test_the_counter_sees_ops_and_leaves_out_views_and_the_forward(model16):
    """The counter itself: launching ops are counted, views are not, the model forward is not."""
    with RoundOps() as ops:
        ops._in_round, ops.rounds = True, [0]
        x = torch.arange(6)                  # 1
        x.view(2, 3)[0].t()                  # views: 0
        (x + 1).sum()                        # 2
        x.index_copy_(0, torch.tensor([0]), torch.tensor([5]))   # 1 (the two small tensors are host data)
    assert ops.rounds == [4], ops.ops
    with RoundOps().counting() as ops:
        lookahead_generate(model16, PROMPT[:8], LookaheadParams(0, 3, 0), GenerationParams(4))
    assert "scaled_dot_product_attention" not in ops.ops and "mm" not in ops.ops and "embedding" not in ops.ops
    assert "max" in ops.ops and sum(ops.ops.values()) == sum(ops.rounds) > 0      # greedy_ids on the CPU


@pytest.mark.parametrize("candidates", [1, 2, 6])
def test_sampling_round_ops_do_not_grow_with_the_trees_width(model16, depths, candidates):
    """The device walk tests every node's children at once: its ops do not grow with how many
    children a node has (1, 2 or 6 lookup candidates) nor with the tree's depth."""
    params = LookaheadParams(4, 4, 4, lookup_candidates=candidates, lookup_tokens=16)
    gen = GenerationParams(40, temperature=0.8, seed=3)
    with RoundOps().counting() as ops:
        r = lookahead_generate(model16, PROMPT, params, gen, sampling_on_device=True)
    assert len(ops.rounds) == r.forwards > 3 and max(depths) >= 8
    decoding = ops.rounds[1:]                        # the prefill round has no tree
    assert max(decoding) <= ROUND_OPS, (ops.rounds, ops.ops)
    assert max(decoding) - min(decoding) <= 8, ops.rounds   # publication or not: one shape of work otherwise


def test_sampling_round_ops_do_not_grow_with_the_batch(model16, depths, monkeypatch):
    """Every request's walk runs at once: a sampled round of four requests costs what one costs."""
    sizes = []
    run = engine.Rounds.run

    def recorded(self, states, stats):
        sizes.append(len(states))
        return run(self, states, stats)
    monkeypatch.setattr(engine.Rounds, "run", recorded)
    prompts = [(i, PROMPT[i:], i) for i in range(6)]
    params = LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=16)
    gen = GenerationParams(32, temperature=0.8, seed=3)
    with RoundOps().counting() as ops:
        results = dict(decode_batch(model16, prompts, params, gen, batch_size=4, sampling_on_device=True))
    assert len(results) == 6 and all(not isinstance(r, Exception) for r in results.values()) and max(depths) >= 8
    assert sizes.count(4) > 3 and len(sizes) == len(ops.rounds)
    assert max(ops.rounds) <= ROUND_OPS, (ops.rounds, ops.ops)
    one = [k for k, n in zip(ops.rounds, sizes) if n == 1]
    assert max(k for k, n in zip(ops.rounds, sizes) if n == 4) <= max(one) + 2, (ops.rounds, sizes)


def test_top_k_and_top_p_add_only_their_warpers_ops(model16):
    """A round with top-k and top-p costs the temperature-only round plus what transformers' two
    warpers dispatch on their own, nothing more: the walk is the same whatever the warping."""
    from lp.decode.sampling import warpers
    params = LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=16)
    rounds = {}
    for top_k, top_p in ((0, 1.0), (5, 0.9)):
        gen = GenerationParams(24, temperature=0.8, top_k=top_k, top_p=top_p, seed=3)
        with RoundOps().counting() as ops:
            lookahead_generate(model16, PROMPT, params, gen, sampling_on_device=True)
        rounds[top_k] = max(ops.rounds[1:])
    scores = torch.randn(3, 16, dtype=torch.float64)
    with RoundOps() as alone:
        alone._in_round, alone.rounds = True, [0]
        # the top-k and top-p warpers alone
        for warper in warpers(GenerationParams(temperature=0.8, top_k=5, top_p=0.9))[1:]:
            scores = warper(None, scores)
    assert alone.rounds[0] > 0 and rounds[5] == rounds[0] + alone.rounds[0], (rounds, alone.ops)


PROCESSOR_OPS = 30     # the repetition penalty's and the EOS hold-back's own work (lp/decode/processors.py)


@pytest.mark.parametrize("depth", [4, 32])
def test_the_processors_add_a_fixed_handful_of_ops(model16, depths, depth):
    """generate's processors (a repetition penalty, min_new_tokens, n-gram and bad-word bans) add at most
    PROCESSOR_OPS ops to a round, whatever the tree's depth or the batch; with them off a round does no
    processor work (the bounds above)."""
    gen = GenerationParams(40, repetition_penalty=1.2, min_new_tokens=8, no_repeat_ngram_size=3,
                           bad_words_ids=((5, 5), (9,)))
    params = LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=depth)
    with RoundOps().counting() as ops:
        r = lookahead_generate(model16, PROMPT, params, gen, eos_token_ids=[3])
    with RoundOps().counting() as batched:
        results = dict(decode_batch(model16, [(i, PROMPT[i:], i) for i in range(6)], params, gen, batch_size=4,
                                    eos_token_ids=[3]))
    assert len(ops.rounds) == r.forwards > 3 and max(depths) == depth and len(results) == 6
    assert max(ops.rounds + batched.rounds) <= ROUND_OPS + PROCESSOR_OPS, (ops.rounds, batched.rounds, ops.ops)
    assert ops.ops["bmm"] > 0 and batched.ops["bmm"] > 0      # the penalty did run (no other round op is a bmm)
    assert ops.ops["index_fill_"] > 0                          # and the bans (no other round op fills by index)
