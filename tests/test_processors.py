"""generate's score processors under lookahead (lp/decode/processors.py): each
verified row processed as generate would process it after that row's own input, so greedy output is
generate's (float64) and sampled output a plain sampling loop's with the same draws."""
import random
import time
from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import (
    ForcedEOSTokenLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from lp.decode.processors import Processors, RowBans, SeenPrompt, process_by_input, process_rows
from lp.decode.sampling import Draws, distribution, sample, warpers
from lp.decode.tree import tree_of
from lp.decode.verify import frame_ancestors, node_frame
from lp.engine import GenerationParams, LookaheadParams, decode_batch, lookahead_generate
from lp.models import tiny_random_llama
from reference import last_logits

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 7, 7, 8, 9, 10], [3],
           [12, 4, 12, 4, 12, 4, 9, 1, 0, 5]]
NEW = 40
CONFIGS = [LookaheadParams(5, 4, 5), LookaheadParams(15, 5, 15, lookup_candidates=2),
           LookaheadParams(5, 4, 5, suffix_factor=4.0)]
# (repetition_penalty, min_new_tokens, eos): a penalty above and below 1, EOS held back with and without one
KNOBS = [(1.3, 0, None), (0.7, 0, None), (1.0, 12, 11), (1.2, 20, 11)]
# no_repeat_ngram_size and bad words (with a penalty and the hold-back in the last), suppressed tokens (the
# EOS among them: generate suppresses it too)
BANS = [dict(no_repeat_ngram_size=3), dict(no_repeat_ngram_size=1), dict(bad_words_ids=[[7, 7], [11, 3, 3], [4]]),
        dict(bad_words_ids=[[12], [11, 11]], no_repeat_ngram_size=5, repetition_penalty=1.2, min_new_tokens=10),
        dict(suppress_tokens=[3, 12, 15], bad_words_ids=[[4, 4]], min_new_tokens=1),
        dict(begin_suppress_tokens=list(range(0, 16, 2)), suppress_tokens=[7]),     # the first token: odd
        # biases, one-token and completed by a row's input, some on the same token, before a penalty
        dict(sequence_bias=[[[7, 7], 3.0], [[4], -2.0], [[11, 3, 3], 2.5], [[9], 1.5], [[1, 9], -4.0], [[2], 0.7]],
             repetition_penalty=1.2),
        dict(forced_eos_token_id=[3, 9], no_repeat_ngram_size=2, min_new_tokens=1),   # the last token forced
        # forced over a bad word (generate forces after banning), not over a suppressed id (it suppresses after)
        dict(forced_eos_token_id=[4, 9], bad_words_ids=[[4]], suppress_tokens=[9])]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tiny_random_llama(vocab=16, seed=1).model.double()


def random_round(rng: random.Random, vocab: int, nodes: int):
    """A random tree of `nodes` nodes whose paths repeat tokens (and one id past the vocabulary), the
    committed sequence before it, and the node frame padded by two PAD entries."""
    alphabet = list(range(vocab)) + [vocab + 3]
    paths, count = [], 0
    while count < nodes:
        path = [rng.choice(alphabet[:5]) for _ in range(rng.randint(1, 5))]
        paths.append(path)
        count = len(tree_of(paths))
    tree = tree_of(paths)
    committed = [rng.choice(alphabet) for _ in range(rng.randint(1, 6))]
    frame = node_frame(tree, range(len(tree)), len(tree) + 2, 6, ends=True)
    return tree, committed, frame


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_each_row_is_transformers_processors_after_its_own_input(dtype):
    """process_rows against transformers' own processors run on each row's whole input: z*'s row after
    the committed tokens, a node's row after them and its path (itself included); ids past the
    logits' vocabulary, PAD entries and tokens repeated along a path included; min_new_tokens holds
    EOS back by the row's new-token count."""
    rng, vocab, n = random.Random(4), 11, 3
    for penalty, least in ((1.4, 0), (0.6, 3), (1.0, 4)):
        rounds = [random_round(rng, vocab, rng.randint(0, 12)) for _ in range(n)]
        size = max(len(r[2]["tok"]) for r in rounds)
        for tree, committed, frame in rounds:     # pad every request's frame to the widest
            pad = size - len(frame["tok"])
            frame["tok"] += [-1] * pad
            frame["depth"] += [0] * pad
            frame["end"] += list(range(len(frame["end"]) + 1, size + 1))
        tok = torch.tensor([f["tok"] for _, _, f in rounds])
        ancestors = frame_ancestors(torch.tensor([f["end"] for _, _, f in rounds]))
        deep = 2                      # the window's deepest cells come first: the penalty before the round
        scores = torch.randn(n, deep + 1 + size, vocab, dtype=torch.float64).mul(3).to(dtype)
        scores[0, deep, 2] = 0.0      # a zero score: divided, not multiplied
        given = scores.clone()
        seen = torch.zeros(n, vocab + 1, dtype=torch.bool)
        for b, (_, committed, _) in enumerate(rounds):
            seen[b, [min(t, vocab) for t in committed]] = True
        made = [rng.randint(0, 5) for _ in range(n)]       # new tokens committed before the round
        eos = torch.zeros(vocab, dtype=torch.bool)
        eos[[1, 6]] = True
        hold = torch.tensor([[int(k + d < least) for d in [0, *f["depth"]]] for k, (_, _, f) in zip(made, rounds)])
        got = process_rows(scores, deep, seen if penalty != 1.0 else None, tok, ancestors,
                           hold.bool() if least else None, eos if least else None, penalty)
        want_dtype = torch.float32 if dtype == torch.float16 else dtype
        assert got.dtype == want_dtype and torch.equal(scores, given)      # the logits are left as they were
        checked = 0
        for b, (tree, committed, frame) in enumerate(rounds):
            held = [t for t in committed if t < vocab]
            for cell in range(deep):      # no hold-back in the window
                want = scores[b, cell][None].to(want_dtype)
                if penalty != 1.0 and held:
                    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([held]), want)
                assert torch.equal(got[b, cell], want[0]), (penalty, least, b, cell)
            for row in range(1 + len(tree)):
                path = [tree.tokens[u] for u in tree.path(row - 1)] if row else []
                ids = torch.tensor([committed + path])
                want = scores[b, deep + row][None].to(want_dtype)
                held = [t for t in committed + path if t < vocab]   # ids past the logits: none (5.17 fails on them)
                if penalty != 1.0 and held:
                    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([held]), want)
                if least:   # the row predicts new token made + depth; generate counts from the prompt's end
                    skip = ids.shape[1] - (made[b] + len(path))
                    want = MinNewTokensLengthLogitsProcessor(skip, least, [1, 6])(ids, want)
                assert torch.equal(got[b, deep + row], want[0]), (penalty, least, b, row, committed, path)
                checked += 1
        assert checked > 3 * n


@pytest.mark.parametrize("n,words", [(1, []), (2, []), (3, [[4, 4, 2], [1, 3]]), (4, [[2, 2]]),
                                     (0, [[3, 3], [0, 4, 1]])])
def test_row_bans_are_transformers_processors_after_each_rows_input(n, words):
    """RowBans (host): each verified row's banned tokens are those transformers' NoRepeatNGram and
    NoBadWords processors set to -inf after that row's whole input (committed tokens, then the row's
    path), over random trees of repeated tokens; the one-token bad words (the device's mask) and the
    EOS filter included."""
    rng, vocab, eos = random.Random(n), 6, [5]
    words = words + [[2], [5]]          # one-token words: 2 everywhere; 5 is the EOS, which generate keeps
    gen = GenerationParams(8, no_repeat_ngram_size=n, bad_words_ids=tuple(map(tuple, words)))
    singles = {w[0] for w in words if len(w) == 1} - set(eos)
    checked = 0
    for _ in range(12):
        tree = tree_of([[rng.randrange(5) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(0, 5))])
        committed = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
        bans = RowBans(gen, committed[:2])
        bans.extend(committed[2:])                  # the prompt, then the committed output
        for row, (banned, _) in enumerate(bans.rows(tree, range(len(tree)))):
            path = [tree.tokens[u] for u in tree.path(row - 1)] if row else []
            ids = torch.tensor([committed + path])
            want = torch.zeros(1, vocab)
            if n:
                want = NoRepeatNGramLogitsProcessor(n)(ids, want)
            want = NoBadWordsLogitsProcessor(words, eos_token_id=eos)(ids, want)
            assert banned | singles == set(torch.isinf(want[0]).nonzero().flatten().tolist()), (row, committed, path)
            checked += 1
    assert checked > 30


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sequence_bias_is_transformers_processor_after_each_rows_input(dtype):
    """sequence_bias on a round's frame (RowBans' completed entries on the host, process_rows on the
    device): each verified row's scores are transformers' SequenceBiasLogitsProcessor's after that row's
    whole input, to the bit in float32 (one-token biases alone, a completed entry on a token that also
    has a one-token bias, repeated tokens along paths); the window's cells are left as they were."""
    rng, vocab, deep = random.Random(7), 6, 2
    entries = (((2,), 0.7), ((4,), -1.3), ((1, 2), 2.25), ((3, 3, 4), -3.5), ((5, 5), 1e-3))   # ids > 0: 5.17
    gen = GenerationParams(8, sequence_bias=entries)
    processors = Processors(gen, [], torch.device("cpu"), vocab)
    checked = 0
    for _ in range(12):
        tree = tree_of([[rng.randrange(6) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(0, 5))])
        # at least as long as an entry: transformers 5.17 asks the whole entry to fit the input, 5.24 on
        # its prefix (lp follows the latter)
        committed = [rng.randrange(vocab) for _ in range(rng.randint(3, 8))]
        bans = RowBans(gen, committed)
        rows = bans.rows(tree, range(len(tree)))
        scores = torch.randn(1, deep + len(rows), vocab, dtype=torch.float64).mul(3).to(dtype)
        cells = [(deep + j) * vocab + t for j, row in enumerate(rows) for t, _ in row.biased]
        index = torch.tensor([i for row in rows for _, i in row.biased], dtype=torch.long)
        dev = {"biased": torch.tensor(cells + index.tolist(), dtype=torch.long)} if cells else {}
        got = processors.apply(scores, deep, [], dev, torch.zeros(1, 0, dtype=torch.long), None)
        assert torch.equal(got[0, :deep], scores[0, :deep])
        for j in range(len(rows)):
            path = [tree.tokens[u] for u in tree.path(j - 1)] if j else []
            want = SequenceBiasLogitsProcessor([[list(w), b] for w, b in entries])(
                torch.tensor([committed + path]), scores[0, deep + j][None])
            assert torch.equal(got[0, deep + j], want[0]), (j, committed, path)
            checked += 1
    assert checked > 30 and processors.table is not None


def generate_ids(model, prompt, penalty=1.0, least=0, eos=None, **bans):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                         eos_token_id=eos, repetition_penalty=penalty, min_new_tokens=least or None, **bans)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("penalty,least,eos", KNOBS)
def test_greedy_with_processors_is_generate(model, penalty, least, eos):
    """float64: with a repetition penalty and/or min_new_tokens, lookahead's tokens are generate's for the
    window, lookup and suffix trees, one request at a time and in batches of 3; the knobs change the
    output (the test can fail) and rounds accept several tokens (paths are processed)."""
    eos_ids = [eos] if eos is not None else []
    gen = GenerationParams(NEW, repetition_penalty=penalty, min_new_tokens=least)
    want = [generate_ids(model, p, penalty, least, eos) for p in PROMPTS]
    assert want != [generate_ids(model, p, eos=eos) for p in PROMPTS]
    multi = 0
    for params in CONFIGS:
        for p, w in zip(PROMPTS, want):
            r = lookahead_generate(model, p, params, gen, eos_token_ids=eos_ids)
            assert r.token_ids == w, (params, p)
            multi += sum(e > 1 for e in r.emitted_per_round)
        got = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS)], params, gen, batch_size=3,
                                eos_token_ids=eos_ids))
        assert [got[i].token_ids for i in range(len(PROMPTS))] == want, params
    assert multi > 20


@pytest.mark.parametrize("knobs", BANS)
def test_greedy_with_bans_is_generate(model, knobs):
    """float64: with no_repeat_ngram_size, bad_words_ids and (begin_)suppress_tokens (and with a penalty and
    min_new_tokens too), lookahead's tokens are generate's for window, lookup, suffix and lookup-only
    trees, one request at a time and in batches of 3; the knobs change the output."""
    eos = 3 if "min_new_tokens" in knobs else None
    ids = {"bad_words_ids": lambda v: tuple(map(tuple, v)), "suppress_tokens": tuple, "begin_suppress_tokens": tuple,
           "forced_eos_token_id": tuple,
           "sequence_bias": lambda v: tuple((tuple(w), b) for w, b in v)}
    gen = GenerationParams(NEW, **{k: ids.get(k, lambda v: v)(v) for k, v in knobs.items()})
    penalty, least = knobs.get("repetition_penalty", 1.0), knobs.get("min_new_tokens", 0)
    bans = {k: v for k, v in knobs.items()
            if k in ("no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
                     "sequence_bias", "forced_eos_token_id")}
    want = [generate_ids(model, p, penalty, least, eos, **bans) for p in PROMPTS]
    assert want != [generate_ids(model, p, eos=eos) for p in PROMPTS]
    multi = 0
    for params in [*CONFIGS, LookaheadParams(0, 3, 0, lookup_candidates=2, lookup_tokens=8)]:
        for p, w in zip(PROMPTS, want):
            r = lookahead_generate(model, p, params, gen, eos_token_ids=[eos] if eos is not None else [])
            assert r.token_ids == w, (params, p)
            multi += sum(e > 1 for e in r.emitted_per_round)
        got = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS)], params, gen, batch_size=3,
                                eos_token_ids=[eos] if eos is not None else []))
        assert [got[i].token_ids for i in range(len(PROMPTS))] == want, params
    assert multi > 20


def test_the_penalty_counts_the_tokens_it_is_given():
    """SeenPrompt: the prompt as generate's processors see it (a padded row), and the tokens the penalty
    counts in it (generate's prompt_ignore_length; transformers 5.17 penalises the padding too)."""
    model = tiny_random_llama(vocab=16, seed=1).model.double()
    prompt, gen = PROMPTS[1], GenerationParams(NEW, repetition_penalty=1.5)
    for seen, start in ((PROMPTS[1], len(PROMPTS[1])), ([0, 0, *PROMPTS[1]], 0), (PROMPTS[1], 4)):
        penalized = seen[start:]
        want = []
        seq = list(prompt)
        for _ in range(NEW):        # the reference: the penalty over penalized + output only
            scores = last_logits(model, seq)[None]
            scores = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([penalized + want]), scores) \
                if penalized or want else scores
            want.append(int(scores.argmax()))
            seq.append(want[-1])
        r = lookahead_generate(model, prompt, CONFIGS[1], gen, seen_prompt=SeenPrompt(seen, start))
        assert r.token_ids == want, penalized


def plain_processed_sampling(model, prompt, gen, request, eos, custom=None):
    """A plain loop: each new token drawn with u_k from the model's distribution after the repetition
    penalty, the EOS hold-back, the n-gram and bad-word bans, the suppressed tokens, a caller's `custom`
    processor (key, input_ids, scores) and the warpers (the bans and the hold-back are -inf, so their
    order does not matter); greedy: the argmax after the processors."""
    draws, warp, seq = Draws(gen.seed, request), warpers(gen) if gen.sampling else None, list(prompt)
    for k in range(gen.max_new_tokens):
        scores = last_logits(model, seq)[None]
        if gen.sequence_bias:
            scores = SequenceBiasLogitsProcessor([[list(w), b] for w, b in gen.sequence_bias])(torch.tensor([seq]),
                                                                                               scores)
        scores = RepetitionPenaltyLogitsProcessor(gen.repetition_penalty)(torch.tensor([seq]), scores)
        scores = MinNewTokensLengthLogitsProcessor(len(prompt), gen.min_new_tokens, eos)(torch.tensor([seq]), scores)
        if gen.no_repeat_ngram_size:
            scores = NoRepeatNGramLogitsProcessor(gen.no_repeat_ngram_size)(torch.tensor([seq]), scores)
        if gen.bad_words_ids:
            scores = NoBadWordsLogitsProcessor([list(w) for w in gen.bad_words_ids], eos)(torch.tensor([seq]), scores)
        if gen.forced_eos_token_id:
            scores = ForcedEOSTokenLogitsProcessor(len(prompt) + gen.max_new_tokens, list(gen.forced_eos_token_id))(
                torch.tensor([seq]), scores)
        if gen.suppress_tokens:
            scores = SuppressTokensLogitsProcessor(list(gen.suppress_tokens))(torch.tensor([seq]), scores)
        if gen.begin_suppress_tokens:
            scores = SuppressTokensAtBeginLogitsProcessor(list(gen.begin_suppress_tokens), len(prompt))(
                torch.tensor([seq]), scores)
        if custom is not None:
            scores = custom(request, torch.tensor([seq]), scores)
        seq.append(sample(distribution(scores[0], warp), draws.uniform(k)) if gen.sampling else int(scores[0].argmax()))
        if seq[-1] in eos:
            break
    return seq[len(prompt):]


@pytest.mark.parametrize("gen", [
    GenerationParams(24, temperature=0.8, top_k=6, repetition_penalty=1.4, min_new_tokens=6, seed=3,
                     no_repeat_ngram_size=3, bad_words_ids=((4, 4), (9,))),
    GenerationParams(NEW, temperature=0.3, repetition_penalty=1.8, min_new_tokens=6, seed=3),   # paths penalised
    # generate's other warpers together, after a suppressed token
    GenerationParams(NEW, temperature=1.2, top_h=0.95, min_p=0.02, typical_p=0.9, epsilon_cutoff=0.01,
                     eta_cutoff=0.02, suppress_tokens=(5,), begin_suppress_tokens=tuple(range(8)), seed=4,
                     sequence_bias=(((3,), 2.0), ((3, 4), -1.5), ((9, 9, 1), 3.0)), forced_eos_token_id=(7, 11))])
def test_sampled_tokens_with_processors_are_plain_sampling(model, gen):
    """float64: sampled with a penalty and min_new_tokens, every request's tokens are a plain processed
    sampling loop's with the same draws, one request at a time and batched (device and host walks)."""
    eos = [2]
    want = [plain_processed_sampling(model, p, gen, i, eos) for i, p in enumerate(PROMPTS)]
    multi = 0
    for params in CONFIGS:
        for i, p in enumerate(PROMPTS):
            r = lookahead_generate(model, p, params, gen, request=i, eos_token_ids=eos)
            assert r.token_ids == want[i], (params, i)
            multi += sum(e > 1 for e in r.emitted_per_round)
        for on_device in (False, True):
            got = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS)], params, gen, batch_size=3,
                                    eos_token_ids=eos, sampling_on_device=on_device))
            assert [got[i].token_ids for i in range(len(PROMPTS))] == want, (params, on_device)
    assert multi > 5


def lift_after_last(key, ids, scores):
    """A caller's row-wise processor: each row lifts the token after its last one (shifted by the request's
    key) by 3 and bans the token its input's length names (so it reads the key, the tokens and the length)."""
    out = scores.clone()
    v = out.shape[-1]
    out[torch.arange(len(ids)), (ids[:, -1] + 1 + key) % v] += 3.0
    out[:, ids.shape[1] % v] = float("-inf")
    return out


@pytest.mark.parametrize("gen", [
    GenerationParams(NEW),
    GenerationParams(NEW, repetition_penalty=1.3, no_repeat_ngram_size=3, suppress_tokens=(5,)),
    GenerationParams(NEW, temperature=0.9, top_k=8, repetition_penalty=1.2, seed=5)])
def test_a_callers_row_processor_is_a_plain_loops(model, gen):
    """float64: a caller's processor of verified rows (lp.decode.processors.process_by_input), after lp's own
    processors and before the warpers, gives a plain loop's tokens (greedy, or sampled with the same draws)
    for window, lookup and suffix trees, one request at a time and batched (device and host walks); the
    processor changes the output and rounds accept several tokens through it."""
    eos = [2]
    want = [plain_processed_sampling(model, p, gen, i, eos, lift_after_last) for i, p in enumerate(PROMPTS)]
    assert want != [plain_processed_sampling(model, p, gen, i, eos) for i, p in enumerate(PROMPTS)]
    multi = 0
    for params in CONFIGS:
        for i, p in enumerate(PROMPTS):
            r = lookahead_generate(model, p, params, gen, request=i, eos_token_ids=eos, row_processor=lift_after_last)
            assert r.token_ids == want[i], (params, i)
            multi += sum(e > 1 for e in r.emitted_per_round)
        for on_device in (False, True):
            got = dict(decode_batch(model, [(i, p, i) for i, p in enumerate(PROMPTS)], params, gen, batch_size=3,
                                    eos_token_ids=eos, sampling_on_device=on_device, row_processor=lift_after_last))
            assert [got[i].token_ids for i in range(len(PROMPTS))] == want, (params, on_device)
    assert multi > 5


def test_a_row_processors_time_is_host_time(model):
    """The calls of a caller's row processor count as the round's host time (host_seconds), not as the
    forward's: a processor that sleeps 5 ms a call adds at least that per call."""
    calls = []

    def slow(key, ids, scores):
        calls.append(len(ids))
        time.sleep(0.005)
        return scores
    r = lookahead_generate(model, PROMPTS[0], CONFIGS[0], GenerationParams(8), row_processor=slow)
    assert len(calls) > r.forwards and r.host_seconds >= 0.005 * len(calls)


def test_a_row_processor_writes_the_frame_only_where_it_may(model):
    """process_by_input writes its rows back into a writable float frame (no copy of the whole frame
    each round), into a copy otherwise; half-precision frames are processed in float32 either way."""
    frame = torch.randn(1, 5, 16, dtype=torch.float64)
    deep = 2       # two window cells, z*'s row, then a path of two nodes
    state = SimpleNamespace(seen_tokens=[1, 2, 3], key=0)
    plan = SimpleNamespace(tree=tree_of([[5, 6]]), nodes=[0, 1])

    def ban_first(key, ids, scores):
        return scores.index_fill(1, torch.tensor([0]), float("-inf"))
    kept = frame.clone()
    copied = process_by_input(frame, deep, [state], [plan], ban_first)
    assert torch.equal(frame, kept) and copied.data_ptr() != frame.data_ptr()
    assert (copied[0, deep:, 0] == float("-inf")).all() and torch.equal(copied[0, :deep], kept[0, :deep])
    written = process_by_input(frame, deep, [state], [plan], ban_first, writable=True)
    assert written.data_ptr() == frame.data_ptr() and torch.equal(written, copied)
    half = kept.bfloat16()
    assert process_by_input(half, deep, [state], [plan], ban_first, writable=True).dtype == torch.float32
    assert torch.equal(half, kept.bfloat16())


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_compiled_rounds_never_write_the_models_logits(model, monkeypatch, penalty):
    """A compiled forward's logits (a CUDA graph's own outputs) are never written by a caller's row
    processor: it writes into lp's processed copy when generate's processors made one, else into its
    own; the ids stay a plain loop's."""
    import lp.engine as engine

    outputs = []

    def compiled(m, mode):
        def call(**kwargs):
            out = m(**kwargs)
            outputs.append((out.logits, out.logits.clone()))
            return out
        return None if mode == "off" else call
    monkeypatch.setattr(engine, "compiled_forward", compiled)
    gen = GenerationParams(NEW, repetition_penalty=penalty)
    want = plain_processed_sampling(model, PROMPTS[0], gen, 0, [2], lift_after_last)
    r = lookahead_generate(model, PROMPTS[0], CONFIGS[1], gen, request=0, eos_token_ids=[2],
                           row_processor=lift_after_last, compile_mode="default")
    assert r.token_ids == want and len(outputs) == r.forwards
    assert all(torch.equal(logits, kept) for logits, kept in outputs)


def test_a_row_processor_must_return_scores(model):
    with pytest.raises(ValueError, match=r"a logits processor returned list \(\) for scores of shape \(1, 16\)"):
        lookahead_generate(model, PROMPTS[0], CONFIGS[0], GenerationParams(4), row_processor=lambda k, i, s: [])


def test_processors_are_checked():
    with pytest.raises(ValueError, match=r"generation.repetition_penalty: 0.0 must be a finite number > 0"):
        lookahead_generate(None, [1], LookaheadParams(), GenerationParams(4, repetition_penalty=0.0))
    with pytest.raises(ValueError, match=r"generation.min_new_tokens: -2 must be >= 0"):
        lookahead_generate(None, [1], LookaheadParams(), GenerationParams(4, min_new_tokens=-2))


def test_processors_on_compiled_rounds_layout(model, monkeypatch):
    """Compiled rounds keep every fed row's logits (K = Q): the processors read the frame at the end of
    them, and give generate's ids (the compiled layout with an eager forward, as tests/test_compile.py)."""
    import lp.engine as engine

    monkeypatch.setattr(engine, "compiled_forward", lambda m, mode: None if mode == "off" else m)
    penalty, least, eos = KNOBS[3]
    gen = GenerationParams(NEW, repetition_penalty=penalty, min_new_tokens=least)
    for p in PROMPTS:
        r = lookahead_generate(model, p, CONFIGS[1], gen, eos_token_ids=[eos], compile_mode="default")
        assert r.token_ids == generate_ids(model, p, penalty, least, eos), p
