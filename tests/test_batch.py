"""Batched rounds (lp.engine.decode_batch): in float64 every request of a batch decodes exactly its own
`model.generate(do_sample=False)` ids, whatever shares its forwards (requests joining mid-run, more
slots than prompts, prompts of 1 to 60 tokens, EOS and max_new_tokens inside rounds, the Jacobi window
and token trees on, sliding-window, soft-capped and MLA families); a packed round's logits equal each
request's round run alone; sampling at batch 2 reproduces the model's joint; a prompt the batch's cache
cannot hold fails alone; LP splits a batch's rows with the same tokens and per-round counts, greedy and
sampled."""
from collections import Counter

import pytest
import torch

from lp.decode.batch import forward_round, pack_round
from lp.decode.device import Uploader
from lp.decode.kv_cache import RoundCache
from lp.decode.layout import build_round
from lp.decode.request import RoundPlan
from lp.decode.tree import EMPTY, tree_of
from lp.engine import BatchStats, GenerationParams, LookaheadParams, decode_batch
from lp.jobs.config import JOB_LOOKAHEAD
from lp.models import tiny_random_llama
from lp.tiny import tiny_random
from transformers import DynamicCache
from test_architectures import models  # noqa: F401  (the float64 tiny models of lp.tiny, by family)
from test_lp import torchrun
from test_sampling import NEW as SAMPLED_NEW, PROMPT as SAMPLED_PROMPT, chi_square_p, exact_joint, model8  # noqa: F401

BASE = [5, 9, 12, 5, 9, 30, 41, 5, 9, 12, 7, 7, 18, 22, 5, 9, 12, 40, 3, 11]
PROMPTS = [BASE, [33, 8, 33, 8, 14, 60], BASE * 3, [7], BASE[:9], [4, 4, 4, 4, 5, 6] * 5, BASE[3:]]   # 1..60 tokens
NEW = 40
CONFIGS = {
    "job": LookaheadParams(**JOB_LOOKAHEAD),
    "window+lookup+tree": LookaheadParams(window=4, ngram=4, guesses=4, lookup_candidates=2, lookup_tokens=6,
                                          suffix_factor=6, suffix_tokens=24),
}


def generate(model, prompt, new=NEW, eos=None):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                         pad_token_id=0, eos_token_id=eos)[0, len(prompt):].tolist()
    return out[:out.index(eos) + 1] if eos is not None and eos in out else out


def run_batch(model, prompts, params, batch_size, new=NEW, eos=(), stats=None, **kw):
    return dict(decode_batch(model, [(i, p, i) for i, p in enumerate(prompts)], params, GenerationParams(new),
                             batch_size=batch_size, prompt_tokens=max(map(len, prompts)), eos_token_ids=eos,
                             stats=stats, **kw))


@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen2-swa", "deepseek-v3"])
def test_every_request_of_a_batch_is_its_own_generate(models, family):
    """B = 2 (five requests join mid-run) and B = 8 (more slots than prompts), both configs; the EOS is a
    token from the middle of one reference, so some requests end on it inside a round."""
    model = models(family)
    plain = [generate(model, p) for p in PROMPTS]
    # the EOS: a token that some references reach after a few tokens and others never produce
    seen = Counter(t for r in plain for t in set(r[5:]) - set(r[:5]))
    eos = min(seen, key=lambda t: (seen[t], t))
    references = [generate(model, p, eos=eos) for p in PROMPTS]
    assert sum(len(r) < NEW for r in references) >= 1 and sum(len(r) == NEW for r in references) >= 1
    for name, params in CONFIGS.items():
        for batch_size in (2, 8):
            stats = BatchStats()
            out = run_batch(model, PROMPTS, params, batch_size, eos=[eos], stats=stats)
            for i, reference in enumerate(references):
                assert out[i].token_ids == reference, (family, name, batch_size, i)
            assert stats.occupancy > stats.rounds, "rounds really packed several requests"
            assert any(e > 1 for r in out.values() for e in r.emitted_per_round), "drafts were accepted"
            assert {r.finish_reason for r in out.values()} == {"eos", "length"}


@pytest.mark.parametrize("rows_cost", ["free", "ruinous"])
def test_row_budget_rounds_are_exact_and_stop_drafting_when_trees_do_not_pay(models, rows_cost, monkeypatch):
    """The budgeted round (row_cost, draft_cost) keeps every request its own generate. Where rows are
    free every round drafts; where every row costs as much as a forward's ten requests, the budget keeps
    no node and the leader drafts in fewer and fewer rounds (lp.decode.budget.DraftBackoff)."""
    from lp.decode.propose import Proposer
    model = models("llama")
    references = [generate(model, p) for p in PROMPTS]
    drafted = []
    monkeypatch.setattr(Proposer, "candidates", lambda self, *a, f=Proposer.candidates: drafted.append(1) or f(self, *a))
    cost = (lambda n, q: 1.0) if rows_cost == "free" else (lambda n, q: 1.0 + 10.0 * n * (q - 1))
    stats = BatchStats()
    out = run_batch(model, PROMPTS, CONFIGS["job"], 4, stats=stats, row_cost=cost, draft_cost=1e-4)
    assert [out[i].token_ids for i in range(len(PROMPTS))] == references
    if rows_cost == "free":       # every request drafts in every round, its prefill included
        assert len(drafted) == stats.occupancy and any(e > 1 for r in out.values() for e in r.emitted_per_round)
    else:
        assert all(e == 1 for r in out.values() for e in r.emitted_per_round)     # no node kept, ever
        assert 0 < len(drafted) < stats.occupancy / 3


def test_only_a_joining_requests_prefill_gets_the_budgets_floor(models, monkeypatch):
    """The leader gives the row budget a floor rate only in a joining request's prefill round (which
    holds up the batch), and it is a full batch's plain decoding rate, batch_size / cost(batch_size, 1);
    every other round, a lone request's at the end included, gets none; tokens stay each generate's."""
    import lp.engine
    model = models("llama")
    references = [generate(model, p) for p in PROMPTS]
    calls, first = [], [False]         # (a prefill round?, requests, floor) for each budget call
    budget = lp.engine.rows_per_request
    monkeypatch.setattr(lp.engine, "rows_per_request", lambda bases, scores, cost, drafting, floor:
                        calls.append((first[0], len(bases), floor)) or budget(bases, scores, cost, drafting, floor))
    run = lp.engine.Rounds.run

    def marked(self, states, stats):
        first[0] = len(states) == 1 and states[0].result.forwards == 0
        return run(self, states, stats)
    monkeypatch.setattr(lp.engine.Rounds, "run", marked)
    cost = lambda n, q: 1.0 + 0.01 * n * q  # noqa: E731
    out = run_batch(model, PROMPTS, CONFIGS["job"], 3, row_cost=cost)
    assert [out[i].token_ids for i in range(len(PROMPTS))] == references
    floors = [floor for prefill, _, floor in calls if prefill]       # (a round the backoff skips drafts not)
    assert len(floors) >= len(PROMPTS) - 1 and set(floors) == {3 / cost(3, 1)}
    assert all(floor == 0.0 for prefill, _, floor in calls if not prefill)
    assert any(n == 1 for prefill, n, _ in calls if not prefill)        # lone rounds at the end


def test_packed_round_logits_equal_each_round_alone():
    """Three requests at different pasts with different rounds (a prefill with a window, one ordinary
    row with a tree, a window and a tree) packed into one forward over a 3-row cache: every logit row
    equals the same round run alone on a one-row cache (< 1e-9)."""
    model = tiny_random("llama", dtype=torch.float64)
    vocab = model.config.vocab_size
    prompts = [[3, 5, 7, 9, 11, 13, 2, 4], [6, 1, 6, 1, 8], [(7 * i) % vocab for i in range(1, 15)]]
    pre = [0, 4, 13]     # cached prefix of each request before the round
    rounds = [
        (prompts[0], [[11, 12, 13], [21, 22, 23, 24]], EMPTY),
        (prompts[1][4:], [], tree_of([(41, 42, 43), (41, 44), (51,)])),
        (prompts[2][13:], [[11, 12], [21, 22, 23], [31, 32, 33]], tree_of([(45, 46), (47,)])),
    ]
    batched, alone = RoundCache(model, 64, batch=3), [RoundCache(model, 64) for _ in prompts]
    up = Uploader("cpu")

    def run(plans, pasts, first_row, cache):
        """Each request's logits in its round's logit order: z*'s row, the deep cells, the nodes."""
        sections, shape = pack_round(plans, pasts, list(range(first_row, first_row + len(plans))), 4)
        logits, *_ = forward_round(model, up.send(sections), len(plans), shape, first_row, cache)
        frame, d = logits[:, shape.k - shape.frame:], shape.deep
        return [torch.cat([frame[i, d:d + 1], frame[i, :len(p.rnd.deep_rows)], frame[i, d + 1:d + 1 + len(p.nodes)]])
                for i, p in enumerate(plans)]

    def plan(ordinary, position, levels=(), tree=EMPTY):
        rnd = build_round(ordinary, position, list(levels), tree)
        return RoundPlan(rnd, tree, range(len(tree)))

    with torch.inference_mode():
        for i, (prompt, past) in enumerate(zip(prompts, pre)):
            if past:     # the committed prefix, written by a prefill round alone into each cache
                prefix = plan(prompt[:past], past - 1)
                run([prefix], [0], i, batched)
                run([prefix], [0], 0, alone[i])
        plans = [plan(ordinary, past + len(ordinary) - 1, [[t % vocab for t in lv] for lv in levels],
                      tree_of([tuple(t % vocab for t in c) for c in tree.chains()]) if len(tree) else EMPTY)
                 for (ordinary, levels, tree), past in zip(rounds, pre)]
        packed = run(plans, pre, 0, batched)
        for i, p in enumerate(plans):
            single = run([p], [pre[i]], 0, alone[i])[0]
            assert packed[i].shape == single.shape and len(p.rnd.logit_rows) > 1
            assert (packed[i] - single).abs().max().item() < 1e-9, i


def test_a_prompt_the_cache_cannot_hold_fails_alone(models):
    model = models("llama")
    prompts = [BASE[:6], BASE * 20, BASE[:8]]
    out = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(prompts)], CONFIGS["job"],
                            GenerationParams(16), batch_size=2, prompt_tokens=8))
    assert isinstance(out[1], ValueError) and "400 tokens" in str(out[1]) and "cache slots" in str(out[1])
    for i in (0, 2):
        assert out[i].token_ids == generate(model, prompts[i], 16)


def test_a_prompt_id_outside_the_vocabulary_fails_alone(models):
    """A prompt holding an id the embedding has no row for (or a negative one) is that request's error
    naming the id, not an IndexError from inside the forward; the other requests decode as plain."""
    model = models("llama")
    vocab = model.get_input_embeddings().num_embeddings
    prompts = [BASE[:6], BASE[:5] + [vocab], BASE[:8], [-1] + BASE[:3]]
    out = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(prompts)], CONFIGS["job"],
                            GenerationParams(12), batch_size=2))
    for i, bad in ((1, vocab), (3, -1)):
        assert isinstance(out[i], ValueError)
        assert str(out[i]) == f"prompt token id {bad} is outside the model's vocabulary (ids 0 to {vocab - 1})"
    for i in (0, 2):
        assert out[i].token_ids == generate(model, prompts[i], 12)


def test_a_model_that_does_not_expose_its_embedding_decodes_unchecked(models, monkeypatch):
    """input_vocab: the embedding's rows, or None for a model whose get_input_embeddings is missing or raises
    (transformers' NotImplementedError) or holds no num_embeddings; decoding then skips the id check."""
    from types import SimpleNamespace

    from lp.decode.arch import input_vocab

    model = models("llama")
    assert input_vocab(model) == model.get_input_embeddings().num_embeddings
    assert input_vocab(SimpleNamespace()) is None
    assert input_vocab(SimpleNamespace(get_input_embeddings=lambda: object())) is None

    def unexposed():
        raise NotImplementedError
    monkeypatch.setattr(model, "get_input_embeddings", unexposed)
    assert input_vocab(model) is None
    out = dict(decode_batch(model, [(0, BASE[:6], 0)], CONFIGS["job"], GenerationParams(12)))
    assert out[0].token_ids == generate(model, BASE[:6], 12)


@pytest.mark.parametrize("on_device", [False, True])
def test_sampling_at_batch_2_matches_the_models_joint(model8, on_device):
    """Pairs of requests share every forward; each request's first tokens follow the model's joint."""
    n = 1500
    gen = GenerationParams(SAMPLED_NEW, temperature=1.0, seed=11)
    params = LookaheadParams(3, 3, 4)
    outs, multi = [], 0
    for key, r in decode_batch(model8, [(i, SAMPLED_PROMPT, i) for i in range(n)], params, gen, batch_size=2,
                               sampling_on_device=on_device):
        outs.append(tuple(r.token_ids))
        multi += sum(e > 1 for e in r.emitted_per_round)
    assert multi > n // 10
    joint = exact_joint(model8, SAMPLED_PROMPT, 1.0, 0, 1.0)
    cells = sorted(joint)
    counts = Counter(outs)
    assert set(counts) <= set(cells)
    p_value = chi_square_p([counts[c] for c in cells], [n * joint[c] for c in cells])
    print(f"batch 2, on_device={on_device}: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3


@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow), 4])
def test_lp_splits_a_batch_with_the_same_tokens_and_rounds(models, nproc, tmp_path):
    """P = 2, 3, 4 (torchrun, gloo) on batches of 2 and 3: every request's tokens and per-round emitted counts
    equal the single worker's batch (and its own generate)."""
    model = models("qwen2-swa")
    params = {"w": 4, "n": 4, "g": 4, "lookup": {"lookup_candidates": 2, "lookup_tokens": 6, "suffix_factor": 6,
                                                   "suffix_tokens": 24}}
    cases = [{"model": "m", "batch": b, "prompts": PROMPTS[:5], "max_new": 24, **params} for b in (2, 3)]
    sampled = {"model": "m", "batch": 3, "prompts": PROMPTS[:5], "max_new": 24, **params, "on_device": True,
               "sampling": {"temperature": 0.9, "seed": 5}}     # every request's device walk at once
    ranks = torchrun(nproc, {"models": {"m": {"family": "qwen2-swa"}}, "cases": [*cases, sampled]}, tmp_path)
    for case, got in zip(cases, zip(*[r["results"] for r in ranks])):
        single = run_batch(model, case["prompts"], LookaheadParams(4, 4, 4, **params["lookup"]), case["batch"], 24)
        for rank in got:
            for i, r in enumerate(rank["batch"]):
                assert r["tokens"] == single[i].token_ids == generate(model, case["prompts"][i], 24)
                assert r["emitted"] == single[i].emitted_per_round, (nproc, case["batch"], i)
    single = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(sampled["prompts"])],
                               LookaheadParams(4, 4, 4, **params["lookup"]), GenerationParams(24, **sampled["sampling"]),
                               batch_size=3, prompt_tokens=max(map(len, sampled["prompts"])), sampling_on_device=True))
    assert any(e > 1 for r in single.values() for e in r.emitted_per_round)
    for rank in ranks:      # sampled: the same draws give the same tokens and rounds at every world size
        for i, r in enumerate(rank["results"][-1]["batch"]):
            assert (r["tokens"], r["emitted"]) == (single[i].token_ids, single[i].emitted_per_round), (nproc, i)


def test_rounds_on_cuda_leave_cudnn_attention_out(monkeypatch):
    """A round's forward on CUDA runs SDPA without cuDNN's fused attention (it fails on some masked
    round shapes on Hopper; the first H200 run of gpu_check hit it), with the other backends on, grouped
    K/V heads repeated as transformers does, and the global settings restored after; on the CPU the
    backends are left alone and transformers' "sdpa" attention is lp's grouped one (heads unrepeated)
    until the forward ends. A spy on the context sees forward_logits enter it with the rows' device,
    so a forward_logits that stops using it fails here."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from lp.decode import kv_cache

    cuda = torch.backends.cuda
    before = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
              cuda.math_sdp_enabled())
    stock = ALL_ATTENTION_FUNCTIONS["sdpa"]     # transformers' own: grouped heads repeated with a mask
    assert stock is not kv_cache.grouped_sdpa
    with kv_cache._round_sdpa(torch.device("cuda")):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled() and cuda.math_sdp_enabled()
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is stock     # on CUDA, heads repeated for the memory-efficient kernel
    with kv_cache._round_sdpa(torch.device("cpu")):
        assert cuda.cudnn_sdp_enabled() == before[0]
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is kv_cache.grouped_sdpa
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is stock
    assert (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled()) == before

    devices = []
    original = kv_cache._round_sdpa
    monkeypatch.setattr(kv_cache, "_round_sdpa", lambda device: devices.append(device) or original(device))
    model = tiny_random("llama", dtype=torch.float32)
    ids = torch.tensor([[3, 5, 7]])
    kv_cache.forward_logits(model, ids, torch.arange(3)[None], None, DynamicCache(), 1)
    assert devices == [ids.device]


def test_the_collector_leaves_the_heap_of_before_the_decode_alone(models, monkeypatch):
    """While decode_batch runs, the objects that existed before it are frozen (full collections walked the
    model and its libraries mid-batch: 230-270 ms pauses, scripts/bench_gc.py); they thaw when it ends,
    also when the caller stops early. A caller's own freeze, or a collector turned off, is left alone."""
    import gc
    model = models("llama")
    assert gc.get_freeze_count() == 0
    counts = [gc.get_freeze_count() for _ in decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS[:3])],
                                                           CONFIGS["job"], GenerationParams(8), batch_size=2)]
    assert min(counts) > 0 and gc.get_freeze_count() == 0
    early = decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS[:3])], CONFIGS["job"], GenerationParams(8))
    next(early)
    assert gc.get_freeze_count() > 0
    early.close()
    assert gc.get_freeze_count() == 0
    calls = []
    for name in ("freeze", "unfreeze"):
        monkeypatch.setattr(gc, name, lambda name=name, real=getattr(gc, name): (calls.append(name), real())[1])
    for caller_froze in (True, False):       # the caller's own freeze; then the collector off
        gc.freeze() if caller_froze else gc.disable()
        calls.clear()
        try:
            list(decode_batch(model, [(0, PROMPTS[0], 0)], CONFIGS["job"], GenerationParams(8)))
            during = list(calls)
        finally:
            gc.unfreeze() if caller_froze else gc.enable()
        assert during == [], caller_froze


def test_a_raised_prompt_error_thaws_the_heap_and_dropped_caches_are_freed(models, monkeypatch):
    """lp.generate raises a prompt's error from inside its loop over decode_batch: the generator stayed
    suspended, its frozen heap frozen for good (every later decode then froze nothing). And a cache of
    another shape, dropped while the heap was frozen, stayed alive through its layer <-> cache cycle.
    (lp.generate now refuses such a prompt before decoding: its check is left out here.)"""
    import gc
    import weakref
    import lp
    import lp.library
    monkeypatch.setattr(lp.library, "_check_inputs", lambda model, prompts: None)
    model = models("llama")
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        lp.generate(model, [BASE[:6], [vocab], BASE[:4]], max_new_tokens=6, batch_size=2, row_budget=False)
    assert gc.get_freeze_count() == 0
    lp.generate(model, [BASE[:6], BASE[:4]], max_new_tokens=6, batch_size=2, row_budget=False)
    dropped = [weakref.ref(c) for c in model.__dict__["_lp_round_caches"].values()]
    lp.generate(model, [BASE * 20, BASE[:4]], max_new_tokens=6, batch_size=2, row_budget=False)   # another length
    assert dropped and all(ref() is None for ref in dropped)


def test_one_row_caches_stay_until_a_new_one_does_not_fit_beside_them(monkeypatch):
    """A library call of 4M new tokens left its 7 GiB cache on the model, and a later long call then
    allocated beside it until the OOM killer came. One-row caches of other lengths stay (a job's
    requests alternate between a few, and a dropped one would be made, and captured, again), but when a
    new one does not fit in the free memory beside them they are dropped, the longest first."""
    import weakref

    import lp.decode.kv_cache as kv_cache
    from lp.decode.kv_cache import cache_bytes, round_cache

    model = tiny_random_llama(vocab=64, seed=0).model
    kept = model.__dict__.setdefault("_lp_round_caches", {})
    budget = cache_bytes(model, 8192) + cache_bytes(model, 1024) + cache_bytes(model, 512)
    monkeypatch.setattr(kv_cache, "free_bytes", lambda device: budget - sum(
        cache_bytes(model, length, batch) for batch, length in kept))
    long, short = round_cache(model, 5000), round_cache(model, 300)
    assert round_cache(model, 5000) is long and round_cache(model, 300) is short     # alternating: the same
    middle = weakref.ref(round_cache(model, 600))
    assert sorted(kept) == [(1, 512), (1, 1024), (1, 8192)]
    long = weakref.ref(long)
    round_cache(model, 2000)            # 2048 slots do not fit beside the rest: the longest goes first
    assert sorted(kept) == [(1, 512), (1, 1024), (1, 2048)] and long() is None and middle() is not None


def test_a_decode_inside_another_makes_room_for_its_own_cache(monkeypatch):
    """A cache in use is never handed out: the decode started inside it gets its own. That one skipped the
    drop of idle caches that makes room, so it failed with a MemoryError where they held the memory."""
    import lp.decode.kv_cache as kv_cache
    from lp.decode.kv_cache import cache_bytes, round_cache

    model = tiny_random_llama(vocab=64, seed=0).model
    kept = model.__dict__.setdefault("_lp_round_caches", {})
    budget = cache_bytes(model, 4096) + cache_bytes(model, 256)
    monkeypatch.setattr(kv_cache, "free_bytes", lambda device: budget - sum(
        cache_bytes(model, length, batch) for batch, length in kept))
    round_cache(model, 4000)
    outer = round_cache(model, 200)
    outer.busy = True
    inner = round_cache(model, 200)
    assert inner is not outer and sorted(kept) == [(1, 256)] and kept[(1, 256)] is outer   # the idle one went
    outer.busy = False
    assert round_cache(model, 200) is outer


def test_a_huge_cache_is_refused_before_anything_of_its_size_is_allocated():
    """Its slot numbers (8 bytes a slot) were allocated before the free-memory check: a bare allocator
    RuntimeError (or the out-of-memory killer) instead of the MemoryError that names the cache's size."""
    from lp.decode.kv_cache import RoundCache

    model = tiny_random_llama(vocab=64, seed=0).model
    with pytest.raises(MemoryError, match=r"the K/V cache of 1 request row\(s\) x 1099511627776 slots needs"):
        RoundCache(model, 2 ** 40)


def test_a_dropped_model_frees_its_caches_without_a_collection():
    """A kept cache's layers pointed back at it: after any lp call, deleting the model left the K/V
    buffers to the next collection (for good with the collector off, as some servers run), so on a
    GPU `del model; torch.cuda.empty_cache()` gave nothing back."""
    import gc
    import weakref
    import lp
    tiny_random("llama", dtype=torch.float32)      # transformers' first model leaves a cycle of its own
    gc.collect()
    gc.disable()
    try:
        for batch_size in (1, 2):
            model = tiny_random("llama", dtype=torch.float32)
            lp.generate(model, [BASE[:6], BASE[:4]], max_new_tokens=6, batch_size=batch_size, row_budget=False)
            buffers = [weakref.ref(b) for c in model.__dict__["_lp_round_caches"].values() for b in c.buffers]
            del model
            assert buffers and all(ref() is None for ref in buffers), batch_size
    finally:
        gc.enable()


@pytest.mark.parametrize("move", ["float32", "bfloat16"])
def test_a_model_moved_to_another_dtype_decodes_again(move):
    """The kept caches were keyed by (batch, length) only: after `model.float()` (or `.half()`, `.cuda()`)
    the next lp call wrote the new dtype's K/V into the old dtype's buffers and raised."""
    import copy
    import lp
    model = tiny_random("llama", dtype=torch.float64)
    moved = copy.deepcopy(model).to(getattr(torch, move))       # never decoded by lp
    want = [r.token_ids for r in lp.generate(moved, [BASE[:6], BASE[:4]], max_new_tokens=8)]
    lp.generate(model, [BASE[:6], BASE[:4]], max_new_tokens=8)
    model.to(getattr(torch, move))
    assert [r.token_ids for r in lp.generate(model, [BASE[:6], BASE[:4]], max_new_tokens=8)] == want
    assert {c.dtype for c in model.__dict__["_lp_round_caches"].values()} == {getattr(torch, move)}


@pytest.mark.parametrize("outer, inner", [(1, 1), (1, 2), (2, 1)])
def test_a_decode_started_from_a_callback_of_another_leaves_it_exact(outer, inner):
    """A stopping criterion that asks the same model a question with lp: both decodes took the model's one
    kept cache, so the inner one overwrote the outer one's K/V (wrong greedy ids, no error), and a batched
    one dropped it. A cache in use is never handed out or dropped now."""
    import lp
    from transformers import StoppingCriteria
    model = tiny_random("llama", dtype=torch.float64)
    prompts = [BASE[:6], BASE[3:12]]
    want = [r.token_ids for r in lp.generate(model, prompts, max_new_tokens=20, batch_size=outer, row_budget=False)]
    asked = []

    class Judge(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            asked.append(lp.generate(model, [[1, 40, 41, 42, 43], [7, 8]], max_new_tokens=4, batch_size=inner,
                                     row_budget=False))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    got = lp.generate(model, prompts, max_new_tokens=20, batch_size=outer, row_budget=False,
                      stopping_criteria=[Judge()])
    assert [r.token_ids for r in got] == want and asked
    assert not any(c.busy for c in model.__dict__["_lp_round_caches"].values())
