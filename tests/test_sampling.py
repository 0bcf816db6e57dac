"""Exact sampling: the verifier's output distribution equals the target's, by exact
enumeration and by Monte Carlo of the real code; end to end, lookahead sampling
reproduces the model's own joint distribution of the first tokens."""
import itertools
from collections import Counter

import pytest
import torch

from lp.engine import GenerationParams, LookaheadParams, decode_batch, lookahead_generate
from lp.models import tiny_random_llama
from lp.decode.sampling import (Draws, NoDistribution, distribution, sample, try_proposals, verify_tree_sampling,
                                warpers)
from lp.decode.tree import tree_of
from reference import last_logits

A, B, C, D = 0, 1, 2, 3
P = torch.tensor([0.2, 0.3, 0.1, 0.4], dtype=torch.float64)


def enumerate_verifier(p, proposals):
    """Output distribution of 'test distinct proposals in order as one-hot drafts,
    residual on rejection', by walking every branch (independent of lp's code)."""
    out = torch.zeros_like(p)
    reach, q = 1.0, p / p.sum()
    for t in dict.fromkeys(proposals):
        out[t] += reach * q[t]
        reach *= 1 - q[t]
        q = q.clone()
        q[t] = 0
        if q.sum() == 0:
            return out
        q = q / q.sum()
    return out + reach * q


def chi_square_p(observed, expected):
    """Pearson chi-square p-value; cells with expected < 5 pooled into one."""
    observed, expected = torch.as_tensor(observed, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    assert observed[expected == 0].sum() == 0, "samples outside the support"
    observed, expected = observed[expected > 0], expected[expected > 0]
    small = expected < 5
    if small.any():
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = ((observed - expected) ** 2 / expected).sum()
    df = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def test_enumeration_of_the_frozen_example_equals_p():
    assert torch.allclose(enumerate_verifier(P, [A, A, B]), P, atol=1e-15)


@pytest.mark.parametrize("proposals", [[A, A, B], [D], [C, B, A, D], []])
def test_verifier_monte_carlo_matches_p(proposals):
    draws = Draws(seed=7, request="mc")
    n = 20000
    counts = Counter(try_proposals(P, proposals, draws.uniform(k))[0] for k in range(n))
    p_value = chi_square_p([counts[t] for t in range(4)], (P * n).tolist())
    print(f"proposals {proposals}: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3


def test_draws_depend_only_on_their_address():
    a, b = Draws(1, "x"), Draws(1, "x")
    assert [a.uniform(k) for k in range(5)] == [b.uniform(k) for k in range(5)]
    assert len({a.uniform(3), a.uniform(4), Draws(2, "x").uniform(3), Draws(1, "y").uniform(3)}) == 4
    assert all(0 <= a.uniform(k) < 1 for k in range(100))
    assert a.words(5, [0, 2, 1]) == [b.words(5, [d])[0] for d in (0, 2, 1)] == b.words(3, [2, 4, 3])


def test_a_draw_takes_the_token_whose_cdf_reaches_it_and_never_one_without_mass():
    """The inverse-CDF draw at its edges (the chi-square tests cannot see a rule that differs only on a cdf's
    steps): 1 - u on a step takes the token that reaches it, 1 - u = 1 the last token with mass (not the
    zero-mass ones after it, nor V), the smallest 1 - u the first with mass."""
    from lp.decode.sampling import draw

    def at(cdf, rest):
        return int(draw(torch.tensor([cdf], dtype=torch.float64), torch.tensor([[rest]], dtype=torch.float64)))

    cdf = [.2, .5, 1., 1.]
    assert [at(cdf, r) for r in (2.0 ** -53, .2, .3, .5, 1.0)] == [0, 0, 1, 1, 2]
    plateaus = [0., 0., .3, .3, .3, 1.]        # tokens 0, 1, 3 and 4 have no mass
    assert [at(plateaus, r) for r in (2.0 ** -53, .3, .3 + 2.0 ** -50, 1.0)] == [2, 2, 5, 5]


def verify(cands, cond, draws, start=0):
    """The tree verifier over the trie of `cands`; a node's row is cond(its path's tokens)."""
    tree = tree_of(cands)
    return verify_tree_sampling(cond(()), tree, lambda u: cond(tuple(tree.tokens[v] for v in tree.path(u))),
                                draws, start)


def test_multi_offset_verifier_enumerated():
    """Two offsets: the joint of (first, second) emitted tokens equals p1 x p2 when
    the second-offset rows are the true conditionals."""
    p1 = P
    cond = {t: torch.roll(P, t) for t in range(4)}          # p(second | first)
    cands = [(A, B), (A, C), (B, D)]
    n = 20000
    counts = Counter()
    for r in range(n):
        res = verify(cands, lambda path: cond[path[-1]] if path else p1, Draws(3, f"joint{r}"))
        second = res.emitted[1] if len(res.emitted) > 1 else None
        if second is None:   # offset-0 token was a residual draw: sample the next one from its conditional
            second = try_proposals(cond[res.emitted[0]], [], Draws(4, f"x{r}").uniform(0))[0]
        counts[(res.emitted[0], second)] += 1
    expected = [n * p1[a] * cond[a][b] for a in range(4) for b in range(4)]
    observed = [counts[(a, b)] for a in range(4) for b in range(4)]
    assert chi_square_p(observed, expected) > 1e-3


def conditional(prefix):
    """A fixed 3-step chain over 4 tokens: p(next | prefix)."""
    return torch.roll(P, sum((i + 1) * t for i, t in enumerate(prefix)))


TREES = [[(A,), (A, B, C), (B, D), (A, B)], [(C, A, B), (C,), (D, D)], [(B, B, B)],
         [(A, B, C), (A, B, D), (A, C, A), (B, D)],          # branches at depth 1 and 2
         [(C, A, B), (C, A, C), (C, A, D), (C, B), (D, D)]]  # three siblings at depth 3


def enumerate_tree(cands, cond, depth=3):
    """The exact joint of the first `depth` emitted tokens of the tree walk (accept a child
    with its renormalised probability, residual on rejection, the rest from the chain),
    by walking every branch; independent of lp's code."""
    tree = tree_of(cands)
    out = Counter()

    def rest(prefix, weight):   # tokens after the walk ended: plain sampling from the chain
        if len(prefix) == depth:
            out[prefix] += weight
            return
        q = cond(prefix)
        for t in range(len(q)):
            if q[t] > 0:
                rest(prefix + (t,), weight * float(q[t]))

    def walk(node, prefix, weight):
        if len(prefix) == depth:
            out[prefix] += weight
            return
        q = cond(prefix).clone()
        reach = 1.0
        for child in tree.children(node):
            t = tree.tokens[child]
            p_t = float(q[t] / q.sum())
            walk(child, prefix + (t,), weight * reach * p_t)
            reach *= 1 - p_t
            q[t] = 0
        for t in range(len(q)):       # every child rejected: the residual, then the chain
            if q[t] > 0:
                rest(prefix + (t,), weight * reach * float(q[t] / q.sum()))

    walk(-1, (), 1.0)
    return out


@pytest.mark.parametrize("cands", TREES)
def test_tree_walk_enumerated_equals_the_chain(cands):
    got = enumerate_tree(cands, conditional)
    for a, b, c in itertools.product(range(4), repeat=3):
        want = float(conditional(())[a] * conditional((a,))[b] * conditional((a, b))[c])
        assert got[(a, b, c)] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("cands", TREES)
def test_tree_verifier_monte_carlo_exact(cands):
    """The real verifier on trees with shared prefixes, branches below the root and
    candidates that prefix one another: the joint of the first three emitted tokens
    equals the chain's (chi-square)."""
    n, counts = 20000, Counter()
    for r in range(n):
        res = verify(cands, conditional, Draws(3, f"var{r}"))
        out = list(res.emitted)
        assert len(out) <= 1 + max(map(len, cands))
        while len(out) < 3:   # the rest of the three tokens from the chain itself
            out.append(try_proposals(conditional(tuple(out)), [], Draws(4, f"rest{r}").uniform(len(out)))[0])
        counts[tuple(out[:3])] += 1
    cells = list(itertools.product(range(4), repeat=3))
    expected = [n * float(conditional(())[a] * conditional((a,))[b] * conditional((a, b))[c]) for a, b, c in cells]
    p_value = chi_square_p([counts[c] for c in cells], expected)
    print(f"{cands}: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3


# ---------------------------------------------------------------- end to end

VOCAB, NEW, PROMPT = 8, 3, [3, 5, 3, 5, 3, 6, 3, 5, 3]


@pytest.fixture(scope="module")
def model8():
    return tiny_random_llama(vocab=VOCAB, seed=2).model.double()


def exact_joint(model, prompt, temperature, top_k, top_p):
    """P(t1, t2, t3) from the model's own conditionals with the same warping."""
    warp = warpers(GenerationParams(temperature=temperature, top_k=top_k, top_p=top_p))
    cond = lambda seq: distribution(last_logits(model, seq), warp)  # noqa: E731
    joint = {}
    with torch.no_grad():
        p1 = cond(prompt)
        for a in range(VOCAB):
            if p1[a] == 0:
                continue
            p2 = cond(prompt + [a])
            for b in range(VOCAB):
                if p2[b] == 0:
                    continue
                p3 = cond(prompt + [a, b])
                for c in range(VOCAB):
                    joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def sample_many(model, gen, n, comm=None, params=LookaheadParams(3, 3, 4)):
    outs, multi = [], 0
    for i in range(n):
        r = lookahead_generate(model, PROMPT, params, gen, request=i, comm=comm)
        outs.append(tuple(r.token_ids))
        multi += sum(e > 1 for e in r.emitted_per_round)
    return outs, multi


LOOKUP_ONLY = LookaheadParams(0, 3, 0, lookup_candidates=3, lookup_tokens=4, lookup_ngram=2)
BOTH = LookaheadParams(3, 3, 4, lookup_candidates=2, lookup_tokens=3, lookup_ngram=2)


@pytest.mark.parametrize("temperature,top_k,top_p,params", [
    (1.0, 0, 1.0, LookaheadParams(3, 3, 4)), (0.8, 0, 0.7, LookaheadParams(3, 3, 4)),
    (1.3, 5, 0.9, LookaheadParams(3, 3, 4)), (1.0, 0, 1.0, LOOKUP_ONLY), (0.8, 0, 0.7, BOTH)])
def test_lookahead_sampling_matches_the_models_joint(model8, temperature, top_k, top_p, params):
    n = 3000
    gen = GenerationParams(NEW, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    outs, multi = sample_many(model8, gen, n, params=params)
    assert multi > n // 10          # the pool really hits: many rounds emit several tokens
    joint = exact_joint(model8, PROMPT, temperature, top_k, top_p)
    cells = sorted(joint)
    counts = Counter(outs)
    assert set(counts) <= set(cells)                       # nothing outside the support
    p_value = chi_square_p([counts[c] for c in cells], [n * joint[c] for c in cells])
    print(f"T={temperature} top_k={top_k} top_p={top_p}: chi-square p = {p_value:.3f}, multi-token rounds {multi}")
    assert p_value > 1e-3


def test_same_seed_same_output_and_seed_matters(model8):
    gen = GenerationParams(16, temperature=1.0, seed=5)
    a = lookahead_generate(model8, PROMPT, LookaheadParams(4, 4, 4), gen, request="q")
    b = lookahead_generate(model8, PROMPT, LookaheadParams(4, 4, 4), gen, request="q")
    assert a.token_ids == b.token_ids and a.emitted_per_round == b.emitted_per_round
    others = {tuple(lookahead_generate(model8, PROMPT, LookaheadParams(4, 4, 4),
                                       GenerationParams(16, temperature=1.0, seed=s), request="q").token_ids)
              for s in range(6, 10)}
    assert len(others | {tuple(a.token_ids)}) > 1


def plain_sampling(model, prompt, gen, request):
    """The reference: an autoregressive loop, one full forward per token (no cache), drawing the k-th
    new token from the model's warped distribution by inverse CDF with the request's u_k."""
    draws, warp, seq = Draws(gen.seed, request), warpers(gen), list(prompt)
    for k in range(gen.max_new_tokens):
        seq.append(sample(distribution(last_logits(model, seq), warp), draws.uniform(k)))
    return seq[len(prompt):]


SAMPLED_PROMPTS = [PROMPT, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [6, 6, 7, 6, 6, 7, 6], [2, 4, 2, 4, 2, 4, 2, 4]]


# generate's warpers: one at a time, then all in generate's order (lp.decode.params.WARPER_KEYS)
WARPING = [dict(top_h=0.6), dict(top_k=9), dict(top_p=0.7), dict(min_p=0.3), dict(typical_p=0.4),
           dict(epsilon_cutoff=0.04), dict(eta_cutoff=0.03),
           dict(top_h=0.95, top_k=20, top_p=0.95, min_p=0.05, typical_p=0.9, epsilon_cutoff=0.01, eta_cutoff=0.01)]


@pytest.mark.parametrize("knobs", WARPING)
def test_warpers_are_generates(knobs):
    """lp's warpers (lp.decode.sampling.warpers) keep and scale a row's scores as generate's sampling
    does: its first sampled token's scores (output_scores, float32 as generate makes them) on a batch
    of prompts, the same tokens kept and the same values; and each setting cuts some tokens here."""
    model = tiny_random_llama(vocab=64, seed=5).model.double()
    gen = GenerationParams(1, temperature=0.7, **knobs)
    prompts = torch.tensor([[1, 2, 3, 4, 5], [9, 9, 9, 9, 9], [60, 3, 41, 7, 0], [5, 4, 3, 2, 1]])
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, max_new_tokens=1,
                         pad_token_id=0, eos_token_id=None, output_scores=True, return_dict_in_generate=True,
                         temperature=gen.temperature, top_h=gen.top_h or None, top_k=gen.top_k, top_p=gen.top_p,
                         min_p=gen.min_p or None, typical_p=gen.typical_p, epsilon_cutoff=gen.epsilon_cutoff,
                         eta_cutoff=gen.eta_cutoff)
    theirs = out.scores[0]
    logits = torch.stack([last_logits(model, p) for p in prompts.tolist()]).float()
    ours = warpers(gen)(None, logits)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.allclose(ours.softmax(-1), theirs.softmax(-1), atol=1e-6)
    assert torch.isinf(theirs).any()            # the setting cuts here: the test can fail


@pytest.mark.parametrize("knobs", [dict(temperature=0.6), dict(temperature=1.0, top_k=4, top_p=0.9),
                                   dict(temperature=1.2, min_p=0.2), dict(temperature=1.0, top_p=0.0),
                                   dict(temperature=1.0, top_h=0.7), dict(temperature=1.0, typical_p=0.5),
                                   dict(temperature=1.3, epsilon_cutoff=0.1, eta_cutoff=0.1)])
def test_sampled_tokens_are_plain_sampling_with_the_same_draws(model8, knobs):
    """float64: every request's sampled tokens are, token for token, those of a plain sampling loop
    drawing the k-th new token with u_k, whatever the trees: window, lookup or both, one request or
    batches of 3 (host and device walks), and trees cut by a row budget. So a seed's output is the
    same on every run, at every batch size and budget, not only equally distributed."""
    gen = GenerationParams(24, **knobs, seed=9)
    prompts = SAMPLED_PROMPTS * 2
    want = [plain_sampling(model8, p, gen, request) for request, p in enumerate(prompts)]
    if len(knobs) > 1:     # a warper that cut nothing would prove nothing
        assert want != [plain_sampling(model8, p, GenerationParams(24, temperature=gen.temperature, seed=9), request)
                        for request, p in enumerate(prompts)]
    multi = 0
    for params in (LookaheadParams(3, 3, 4), LOOKUP_ONLY, BOTH):
        for request, p in enumerate(prompts):
            r = lookahead_generate(model8, p, params, gen, request=request)
            assert r.token_ids == want[request], (params, request)
            multi += sum(e > 1 for e in r.emitted_per_round)
        for on_device, row_cost in ((False, None), (True, None), (True, lambda n, q: 1.0 + 0.05 * n * q)):
            got = dict(decode_batch(model8, [(i, p, i) for i, p in enumerate(prompts)], params, gen, batch_size=3,
                                    sampling_on_device=on_device, row_cost=row_cost))
            assert [got[i].token_ids for i in range(len(prompts))] == want, (params, on_device, row_cost)
            multi += sum(e > 1 for r in got.values() for e in r.emitted_per_round)
    assert multi > 50       # the trees really accepted tokens, many rounds emitted several


def test_temperature_zero_is_greedy(model8):
    greedy = lookahead_generate(model8, PROMPT, LookaheadParams(4, 4, 4), GenerationParams(12))
    x = torch.tensor([PROMPT])
    ref = model8.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12,
                          eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert greedy.token_ids == ref


LOOKUP_SAMPLING_PROMPTS = [PROMPT, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [6, 6, 7, 6, 6, 7, 6]]


def test_sampling_cuts_inside_a_long_lookup_round(model8):
    """Sampling with lookup: rounds emit more than N tokens, and max_new_tokens or EOS falling
    inside such a round gives exactly the uncut run's prefix (draws are addressed by position)."""
    params = LookaheadParams(2, 3, 2, lookup_candidates=2, lookup_tokens=8, lookup_ngram=2)
    cuts = eos_cuts = 0
    for request, prompt in enumerate(LOOKUP_SAMPLING_PROMPTS * 4):
        gen = GenerationParams(40, temperature=0.7, seed=3)
        full = lookahead_generate(model8, prompt, params, gen, request=request)
        done, cut_done = 0, False
        for e in full.emitted_per_round:
            if e > params.ngram:
                if not cut_done:           # max_new_tokens: the first long round loses its last token
                    cut = lookahead_generate(model8, prompt, params,
                                             GenerationParams(done + e - 1, temperature=0.7, seed=3), request=request)
                    assert cut.token_ids == full.token_ids[:done + e - 1] and cut.finish_reason == "length"
                    cuts, cut_done = cuts + 1, True
                inside = [j for j in range(1, e) if full.token_ids[done + j] not in full.token_ids[:done + j]]
                if inside:                 # EOS: a token first seen inside a long round
                    eos = full.token_ids[done + inside[-1]]
                    r = lookahead_generate(model8, prompt, params, gen, eos_token_ids=[eos], request=request)
                    assert r.token_ids == full.token_ids[:done + inside[-1] + 1] and r.finish_reason == "eos"
                    eos_cuts += 1
                    break
            done += e
    print(f'sampling cuts inside long rounds: {cuts} max_new, {eos_cuts} eos')
    assert cuts >= 3 and eos_cuts >= 1


# ---------------------------------------------------------------- the device walk is the host walk

def random_round(gen, vocab=4):
    """One request's round: a random tree over `vocab` tokens, its rows' distributions (the root's,
    then each node's; some tokens at probability 0, sometimes every token but the children's) and
    the whole root subtrees one LP rank owns."""
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    tree = tree_of([tuple(torch.randint(0, vocab, (rand(1, 5),), generator=gen).tolist()) for _ in range(rand(0, 7))])
    dists = torch.rand(1 + len(tree), vocab, generator=gen, dtype=torch.float64)
    dists[torch.rand(dists.shape, generator=gen) < 0.3] = 0.0
    dists[:, rand(0, vocab)] += 0.05                  # every row keeps some mass
    if rand(0, 3) == 0:                               # a row whose mass is all on its children
        kids = [tree.tokens[u] for u in range(len(tree)) if tree.parents[u] == -1]
        if kids:
            keep = torch.zeros(vocab, dtype=torch.bool)
            keep[kids] = True
            dists[0] = torch.where(keep, dists[0] + 0.01, 0.0)
    units = tree.units()
    lo = rand(0, len(units) + 1)
    hi = rand(lo, len(units) + 1)
    nodes = range(sum(units[:lo]), sum(units[:hi]))
    return tree, dists / dists.sum(-1, keepdim=True), nodes


def test_the_device_walk_is_the_host_walk():
    """The batched device walk (tree_sampling_verdict, on the engine's own draws) takes every
    decision the host walk (verify_tree_sampling) takes with the same draws: the first token, the
    accepted path and what it emits, for rounds of 1-4 requests of random trees, distributions with
    zeros and LP ranks owning some root subtrees."""
    from types import SimpleNamespace

    from lp.decode.sampling import tree_sampling_verdict
    from lp.decode.verify import frame_ancestors, node_frame, path_verdicts
    from lp.engine import draw_words

    gen, width, compared, deep = torch.Generator().manual_seed(5), 8, Counter(), 0
    for round_ in range(600):
        cases = [random_round(gen) for _ in range(int(torch.randint(1, 5, (1,), generator=gen)))]
        draws = [Draws(7, f"r{i}") for i in range(len(cases))]
        size = max(len(nodes) for _, _, nodes in cases)
        plans = [SimpleNamespace(tree=tree, nodes=nodes) for tree, _, nodes in cases]
        rest = torch.tensor(draw_words(plans, draws, [round_] * len(cases), size)).view(torch.float64)
        frames = [node_frame(tree, nodes, size, width, ends=True) for tree, _, nodes in cases]
        field = lambda name: torch.tensor([f[name] for f in frames]).view(len(cases), size)  # noqa: E731
        rows = torch.stack([torch.cat([d[:1], d[1 + nodes.start:1 + nodes.stop],
                                       torch.full((size - len(nodes), d.shape[1]), 1.0 / d.shape[1])])
                            for _, d, nodes in cases])
        first, off_path, emitted = tree_sampling_verdict(rows, field("tok"), field("par"),
                                                         frame_ancestors(field("end")), rest.view(len(cases), -1))
        hits, node, after, _ = path_verdicts(first, off_path, emitted, field("depth"), field("step"),
                                             torch.tensor([nodes.start for *_, nodes in cases]), width)
        for i, ((tree, d, nodes), draw) in enumerate(zip(cases, draws)):
            want = verify_tree_sampling(d[0], tree, lambda u: d[1 + u], draw, round_, owned=lambda u: u in nodes)
            got = [int(first[i])] + after[i, :int(hits[i])].tolist()
            assert (got, int(hits[i])) == (want.emitted, want.hits), (round_, i)
            assert want.hits == 0 or int(node[i]) == want.node, (round_, i)
            path = [0, *(1 + u for u in tree.path(want.node))] if want.hits else [0]
            assert all(d[r, t] > 0 for r, t in zip(path, want.emitted))    # never a zero-probability token
            compared[min(want.hits, 2)] += 1
            deep = max(deep, want.hits)
    assert min(compared.values()) > 50 and deep >= 3, (compared, deep)      # rejections and deep accepts alike


@pytest.mark.parametrize("on_device", [False, True], ids=["host walk", "device walk"])
@pytest.mark.parametrize("case", ["every token banned", "float16 overflow"])
@pytest.mark.parametrize("new", [1, 6])
def test_no_distribution_to_draw_from_is_an_error_as_in_generate(case, on_device, new):
    """Scores all -inf after the processors, or +inf logits (a float16 model that overflows): generate's
    multinomial raises; lp drew the id V (past the vocabulary), returned it, or fed it to the model's
    embedding (an IndexError deep in the forward)."""
    loaded = tiny_random_llama(vocab=64, seed=0)
    model, banned = loaded.model, ()
    if case == "every token banned":
        banned = tuple(range(64))
    else:
        model = model.half()
        with torch.no_grad():
            model.lm_head.weight.mul_(1e5)
    prompt = [1, 5, 9, 13, 7, 22, 5, 9]
    ids = torch.tensor([prompt])
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new,
                       pad_token_id=0, suppress_tokens=list(banned) or None)
    with pytest.raises(RuntimeError, match="no distribution to draw new token 0 from"):
        lookahead_generate(model, prompt, LookaheadParams(), GenerationParams(new, temperature=1.0,
                                                                              suppress_tokens=banned),
                           sampling_on_device=on_device)


def test_no_distribution_later_in_the_output_names_that_token():
    """The third new token has nothing to draw from (a processor bans every token there): lp.generate
    raises naming new token 2, after two tokens drawn as usual."""
    import lp
    from transformers import LogitsProcessor

    prompt = [1, 5, 9, 13, 7, 22, 5, 9]

    class BanFromThird(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return torch.full_like(scores, -float("inf")) if input_ids.shape[-1] >= len(prompt) + 2 else scores

    model = tiny_random_llama(vocab=64, seed=0).model
    with pytest.raises(RuntimeError, match="no distribution to draw new token 2 from"):
        lp.generate(model, prompt, do_sample=True, max_new_tokens=6, logits_processor=[BanFromThird()])


@pytest.mark.parametrize("batch_size", [1, 3])
def test_no_distribution_ends_that_request_only(batch_size):
    """A request whose sampling finds nothing to draw ends with NoDistribution; before, it raised out of
    decode_batch, so a job lost the whole batch and every prompt after it. The other requests decode on,
    each to the tokens it gets alone."""
    model = tiny_random_llama(vocab=64, seed=0).model
    prompts = [[1, 5, 9, 13, 7, 22, 5, 9], [3, 4, 3, 4, 3, 4], [9, 8, 7, 6, 5]]
    generation = GenerationParams(12, temperature=1.0, seed=3)

    def ban_key_1_from_third(key, input_ids, scores):
        if key == 1 and input_ids.shape[-1] >= len(prompts[1]) + 2:
            return torch.full_like(scores, -float("inf"))
        return scores
    got = dict(decode_batch(model, [(k, p, k) for k, p in enumerate(prompts)], LookaheadParams(), generation,
                            batch_size=batch_size, row_processor=ban_key_1_from_third))
    assert isinstance(got[1], NoDistribution) and "new token 2 from" in str(got[1])
    for k in (0, 2):
        alone = lookahead_generate(model, prompts[k], LookaheadParams(), generation, request=k)
        assert got[k].token_ids == alone.token_ids and len(alone.token_ids) == 12, k
