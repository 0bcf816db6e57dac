"""Lookahead Parallelism with real gloo process groups (torchrun), float64 tiny Llama:
every world size gives the single-worker tokens AND per-round emitted counts, each
rank feeds exactly its share of the shard plan, and stop strings, EOS and
max_new_tokens cut multi-token rounds exactly as one worker does."""
import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lp.decode.stopping import StopChecker
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import TinyTokenizer, tiny_random_llama
from lp_worker import corpus, params
from test_exactness import SPAN_PROMPTS, fresh_eos

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"vocab": 16, "seed": 1}
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 7, 7, 8, 9, 10], [3], [12, 4, 12, 4, 9, 1, 0, 5]]
CONFIGS = [(1, 3, 5), (2, 4, 5), (5, 5, 15), (15, 4, 7), (3, 5, 0), (3, 7, 15)]   # (W, N, G); W < P included
# with prompt/output lookup candidates (variable lengths, rounds longer than N); W = 0: no window
LOOKUP_CONFIGS = [(0, 3, 0, 2, 10, 3), (2, 4, 5, 2, 8, 3), (5, 5, 15, 3, 12, 2)]
NEW = 32
# token trees: suffix drafts (the request and a job corpus of other prompts' greedy completions),
# merged with the pool and lookup, budget cuts; window on and off
TREE_CONFIGS = [(0, 3, 0, dict(suffix_factor=4, suffix_tokens=12, job_cache=True)),
                (3, 4, 3, dict(lookup_candidates=2, lookup_tokens=6, suffix_factor=4, suffix_tokens=10,
                               job_cache=True, tree_budget=12)),
                (5, 5, 15, dict(suffix_factor=8, suffix_tokens=24, job_cache=True))]


def tree_case(model, prompt, cfg, max_new=NEW, others=None):
    """A tree case whose job corpus holds the greedy completions of up to three other prompts."""
    w, n, g, extra = cfg
    others = [p for p in (others or PROMPTS + SPAN_PROMPTS) if p != prompt][:3]
    x = lambda p: torch.tensor([p])  # noqa: E731
    done = [model.generate(x(p), attention_mask=torch.ones_like(x(p)), do_sample=False, max_new_tokens=NEW,
                           pad_token_id=0)[0, len(p):].tolist() for p in others]
    return dict(prompt=prompt, w=w, n=n, g=g, max_new=max_new, lookup=extra, corpus=done)


def lookup_case(prompt, cfg, max_new=NEW):
    w, n, g, lc, k, m = cfg
    return dict(prompt=prompt, w=w, n=n, g=g, max_new=max_new,
                lookup=dict(lookup_candidates=lc, lookup_tokens=k, lookup_ngram=m))


def single(model, case):
    """The one-worker run of a case (as tests/lp_worker.py runs it under torchrun)."""
    return lookahead_generate(model, case["prompt"], params(case),
                              GenerationParams(case["max_new"], stop=tuple(case.get("stop", ())),
                                               **case.get("sampling", {})),
                              eos_token_ids=case.get("eos", []), tokenizer=TinyTokenizer(model.config.vocab_size),
                              request=case.get("request", 0), corpus=corpus(case))


def stop_cut(base, full, tokenizer, longer_than=2):
    """A stop string that the uncut run `full` completes strictly inside a round that emits
    more than `longer_than` (>= 2) tokens: after the round's first accepted guess, before its
    last token. The case carries what the one-token-at-a-time reference gives, a StopChecker
    fed the uncut output token by token: the ids up to the completing token, the text cut
    before the string, and the rounds (the cut round ends at the completing token)."""
    done = 0
    for k, e in enumerate(full.emitted_per_round):
        for j in range(1, e - 1) if e > longer_than else ():
            end = done + j                       # the token that would complete the stop string
            for size in (2, 1, 3, 4, 6, 8):      # spanning token boundaries first; longer ones are rarer
                stop = tokenizer.decode(full.token_ids[max(end - size + 1, 0):end + 1], skip_special_tokens=True)
                if not stop:
                    continue
                ref = StopChecker([], base["max_new"], (stop,), tokenizer)
                for token in full.token_ids:
                    if ref.push(token):
                        break
                if ref.reason == "stop" and len(ref.tokens) == end + 1:
                    return dict(base, stop=[stop], expect=dict(
                        tokens=ref.tokens, text=ref.text, emitted=full.emitted_per_round[:k] + [j + 1], uncut=e))
        done += e
    return None


def check_stop_cut(case, r):
    """A stop case ended as the one-token-at-a-time reference says, inside its long round."""
    expect = case["expect"]
    assert r.finish_reason == "stop", case
    assert r.token_ids == expect["tokens"] and r.text == expect["text"], case
    assert r.emitted_per_round == expect["emitted"], case   # the last round was cut after its j-th guess


def cut_cases(model, bases=None):
    """max_new_tokens, EOS and a stop string falling inside a multi-token round, and inside
    a lookup round that emits more than N tokens (greedy by default, or the given `bases`)."""
    if bases is None:
        bases = [dict(prompt=p, w=w, n=n, g=g, max_new=NEW) for w, n, g in [(5, 5, 15), (2, 4, 5)] for p in PROMPTS]
        bases += [lookup_case(p, cfg) for cfg in LOOKUP_CONFIGS[:2] for p in PROMPTS + SPAN_PROMPTS]
        bases += [tree_case(model, p, cfg) for cfg in TREE_CONFIGS[:2] for p in PROMPTS + SPAN_PROMPTS]
    cases = []
    tokenizer = TinyTokenizer(model.config.vocab_size)
    for base in bases:
        r = single(model, base)
        long = "lookup" in base   # lookup or tree cases: rounds may emit more than N tokens
        stop = stop_cut(base, r, tokenizer, base["n"] if long else 2)
        if stop is not None:
            cases.append(stop)
        done = 0
        for e in r.emitted_per_round:
            if e > (base["n"] if long else 1):
                cases.append(dict(base, max_new=done + (e - 1 if long else 1)))
                j = fresh_eos(r.token_ids, done, e) if long else 1
                if j is not None and r.token_ids[done + j] not in r.token_ids[:done + j]:
                    cases.append(dict(base, eos=[r.token_ids[done + j]]))
                break
            done += e
    return cases


@pytest.fixture(scope="module")
def cases_and_reference():
    model = tiny_random_llama(**MODEL).model.double()
    cases = [dict(prompt=p, w=w, n=n, g=g, max_new=NEW) for (w, n, g) in CONFIGS for p in PROMPTS]
    cases += [lookup_case(p, cfg) for cfg in LOOKUP_CONFIGS for p in PROMPTS]
    cases += [tree_case(model, p, cfg) for cfg in TREE_CONFIGS for p in PROMPTS + SPAN_PROMPTS[:2]]
    cuts = cut_cases(model)
    assert any("eos" in c for c in cuts) and any(c["max_new"] < NEW for c in cuts)
    long_cuts = [c for c in cuts if "lookup" in c]
    assert any("eos" in c for c in long_cuts) and any(c["max_new"] < NEW for c in long_cuts)
    tree_cuts = [c for c in cuts if "corpus" in c]
    assert any("eos" in c for c in tree_cuts) and any(c["max_new"] < NEW for c in tree_cuts)
    cases += cuts
    return cases, [single(model, c) for c in cases]


def test_stop_strings_cut_inside_a_long_round(cases_and_reference):
    """One worker, greedy: a stop string completed inside an accepted multi-token round (also
    one longer than N, from lookup) ends the output where the one-token-at-a-time reference
    does; the world sizes below give the same (test_world_sizes_match_single_worker)."""
    cases, reference = cases_and_reference
    stops = [(c, r) for c, r in zip(cases, reference) if "stop" in c]
    for case, r in stops:
        check_stop_cut(case, r)
    assert len(stops) >= 10
    assert sum(c["expect"]["uncut"] > c["n"] for c, _ in stops if "lookup" in c) >= 3


def check_rows_follow_plan(ranks, i, greedy=True):
    """Case i, every round: each rank fed exactly its share of the plan (the rows it packed,
    not the plan's figure) and every rank reports the busiest rank's real rows. Returns the
    rounds in which the busiest rank fed fewer rows than one worker would feed in that
    round (the same ordinary rows plus every window cell and every tree node); greedy, that
    must hold in every round with at least two root subtrees (the plan's units)."""
    got = [rank["results"][i] for rank in ranks]
    split = 0
    for t, plan in enumerate(got[0]["plans"]):
        fed = [g["rows"][t] for g in got]
        assert all(g["plans"][t] == plan for g in got)               # every rank follows one plan
        assert fed == [share[0] for share in plan["plan"]], (i, t)
        assert all(g["max_rows"][t] == max(fed) for g in got), (i, t)
        if len(ranks) == 1:
            assert fed == [plan["whole"]]
        elif greedy and plan["subtrees"] >= 2:
            assert max(fed) < plan["whole"], (i, t)
        split += max(fed) < plan["whole"]
    assert len(got[0]["plans"]) == got[0]["forwards"]
    return split


def torchrun(nproc, spec, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / f"p{nproc}"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ROOT / "tests" / "lp_worker.py"), str(spec_path), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
def test_world_sizes_match_single_worker(nproc, cases_and_reference, tmp_path):
    cases, reference = cases_and_reference
    ranks = torchrun(nproc, {"model": MODEL, "cases": cases}, tmp_path)
    assert all(r["world"] == nproc for r in ranks)
    accepted_multi = split = 0
    for i, (case, ref) in enumerate(zip(cases, reference)):
        for rank in ranks:
            got = rank["results"][i]
            assert got["tokens"] == ref.token_ids, (nproc, case)
            assert got["emitted"] == ref.emitted_per_round, (nproc, case)
            assert got["finish"] == ref.finish_reason and got["text"] == ref.text
        accepted_multi += sum(e > 1 for e in ref.emitted_per_round)
        split += check_rows_follow_plan(ranks, i)   # the work really is split as planned
    assert accepted_multi > 20
    if nproc > 1:
        assert split > 100
    assert any(max(ref.emitted_per_round) > case["n"] for case, ref in zip(cases, reference) if "lookup" in case)


def test_a_group_of_one_exchanges_nothing(monkeypatch):
    """torchrun with one worker (or a dp group of lp_size 1) has a real process group, but nothing to
    exchange: no collective is issued or counted, and the tokens and per-round counts are one
    worker's without a group."""
    from lp.parallel.dist import init_distributed, shutdown
    from multiproc import free_port

    model, prompt = tiny_random_llama(**MODEL, dtype="float64").model, PROMPTS[0]
    lookahead = LookaheadParams(5, 5, 15, lookup_candidates=2, lookup_tokens=8, suffix_factor=4)
    alone = lookahead_generate(model, prompt, lookahead, GenerationParams(NEW))
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                           LOCAL_RANK="0").items():
        monkeypatch.setenv(key, value)

    def refused(*args, **kwargs):
        raise AssertionError("a group of one issued a collective")

    comm = init_distributed("gloo", 30, "cpu")
    try:
        assert comm.group is not None and comm.world == 1 and comm.alone
        monkeypatch.setattr(dist, "broadcast", refused)
        for name in ("all_gather_single", "all_gather_into_tensor"):
            monkeypatch.setattr(dist, name, refused, raising=False)
        got = lookahead_generate(model, prompt, lookahead, GenerationParams(NEW), comm=comm)
    finally:
        shutdown(comm)
    assert (got.token_ids, got.emitted_per_round) == (alone.token_ids, alone.emitted_per_round)
    assert got.forwards > 1 and got.collectives == got.bytes_moved == comm.collectives == 0


def test_collectives_per_round(cases_and_reference, tmp_path):
    """Exactly one broadcast and one all_gather_into_tensor (all_gather_single since
    torch 2.13) per round, nothing else, and the same fixed payload size every round;
    one upload per round and the host waits for the device once per round (the gathered
    payload): rank 1 also reads the broadcast tree, a CPU tensor of the gloo group."""
    cases, _ = cases_and_reference
    sampled = [dict(c, sampling={"temperature": 0.8, "seed": 1}, on_device=True, request=i)
               for i, c in enumerate(cases[:8] + cases[-4:])]
    ranks = torchrun(2, {"model": MODEL, "cases": cases[:8] + cases[-4:] + sampled}, tmp_path)
    for rank, got_all in enumerate(r["results"] for r in ranks):
        for got in got_all:
            rounds = got["forwards"]
            gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
            assert got["calls"] == {"broadcast": rounds, gather: rounds}
            assert got["collectives"] == 2 * rounds
            assert got["bytes"] % rounds == 0     # fixed shapes: the same bytes every round
            assert got["uploads"] == rounds and got["our_copies"] == 0
            reads = {site.split(":")[0]: n for site, n in got["reads"].items()}
            assert reads == ({"lp/engine.py": rounds} if rank == 0 else
                             {"lp/engine.py": rounds, "lp/parallel/dist.py": rounds}), got["reads"]


SAMPLING_MODEL = {"vocab": 8, "seed": 2}
SAMPLING = {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "seed": 11}
CHI = 1500   # the first cases: 3 tokens of one prompt under CHI requests, for the chi-square test


@pytest.fixture(scope="module")
def sampling_cases():
    """Sampled cases and their one-worker runs: CHI short runs of one prompt (the chi-square
    sample), long runs, lookup runs (rounds longer than N) and their cuts by max_new_tokens,
    EOS and stop strings."""
    from test_sampling import LOOKUP_SAMPLING_PROMPTS, PROMPT

    model = tiny_random_llama(**SAMPLING_MODEL).model.double()
    cases = [dict(prompt=PROMPT, w=3, n=3, g=4, max_new=3, sampling=SAMPLING, request=i) for i in range(CHI)]
    cases += [dict(prompt=[t % 8 for t in p], w=w, n=nn, g=g, max_new=24, sampling=SAMPLING, request=f"long{i}")
              for i, (p, (w, nn, g)) in enumerate(itertools.product(PROMPTS[:2], CONFIGS[:4]))]
    cooler = {"temperature": 0.7, "seed": 6}   # long lookup rounds are frequent enough to cut (5 stop cuts)
    lookup = [dict(lookup_case([t % 8 for t in p], cfg, max_new=24), sampling=temp, request=f"lookup{i}")
              for i, (p, cfg, temp) in enumerate(itertools.product(
                  PROMPTS[:2] + SPAN_PROMPTS + LOOKUP_SAMPLING_PROMPTS, LOOKUP_CONFIGS, [SAMPLING, cooler]))]
    small = [[t % 8 for t in p] for p in PROMPTS + LOOKUP_SAMPLING_PROMPTS]
    lookup += [dict(tree_case(model, p, cfg, max_new=24, others=small), sampling=temp, request=f"tree{i}")
               for i, (p, cfg, temp) in enumerate(itertools.product(
                   small[:2] + LOOKUP_SAMPLING_PROMPTS, TREE_CONFIGS, [SAMPLING, cooler]))]
    cuts = cut_cases(model, lookup)     # sampled rounds longer than N, cut by max_new_tokens, EOS or a stop string
    assert any("eos" in c for c in cuts) and any(c["max_new"] < 24 for c in cuts)
    assert sum("stop" in c for c in cuts) >= 5
    cases += lookup + cuts
    return model, cases, [single(model, c) for c in cases]


def test_sampled_stop_strings_cut_inside_a_long_round(sampling_cases):
    """One worker, sampling: a stop string completed inside an accepted multi-token round ends
    the output where feeding the uncut run one token at a time does (draws are addressed by
    position, so the tokens before the cut are the uncut run's)."""
    _, cases, runs = sampling_cases
    stops = [(c, r) for c, r in zip(cases, runs) if "stop" in c]
    for case, r in stops:
        check_stop_cut(case, r)
    assert len(stops) >= 5 and all(c["expect"]["uncut"] > c["n"] for c, _ in stops)


def match_single(ranks, cases, runs):
    """Every rank drew exactly the one-worker tokens, round for round, and fed its plan share.
    Returns (rounds emitting several tokens, rounds whose busiest rank fed fewer rows than one worker)."""
    multi = split = 0
    for i, ref in enumerate(runs):
        for rank in ranks:
            got = rank["results"][i]
            assert got["tokens"] == ref.token_ids and got["emitted"] == ref.emitted_per_round, cases[i]
            assert got["finish"] == ref.finish_reason and got["text"] == ref.text, cases[i]
        multi += sum(e > 1 for e in ref.emitted_per_round)
        split += check_rows_follow_plan(ranks, i, greedy=False)
    return multi, split


def test_sampling_two_workers_match_one(sampling_cases, tmp_path):
    """Same seed and request: P = 2 draws exactly the P = 1 samples (so they share its
    distribution, checked against the model's own joint in test_sampling.py)."""
    from test_sampling import PROMPT, chi_square_p, exact_joint

    model, cases, runs = sampling_cases
    ranks = torchrun(2, {"model": SAMPLING_MODEL, "cases": cases}, tmp_path)
    multi, split = match_single(ranks, cases, runs)
    assert multi > CHI // 10 and split > CHI // 2
    joint = exact_joint(model, PROMPT, SAMPLING["temperature"], SAMPLING["top_k"], SAMPLING["top_p"])
    counts = Counter(tuple(r["tokens"]) for r in ranks[0]["results"][:CHI])
    cells = sorted(joint)
    p_value = chi_square_p([counts[c] for c in cells], [CHI * joint[c] for c in cells])
    print(f"P=2 sampling: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3


def test_sampling_three_workers_match_one(sampling_cases, tmp_path):
    """P = 3 (two subtree boundaries) draws the P = 1 samples on the long, lookup, tree and
    cut cases."""
    _, cases, runs = sampling_cases
    ranks = torchrun(3, {"model": SAMPLING_MODEL, "cases": cases[CHI:]}, tmp_path)
    multi, split = match_single(ranks, cases[CHI:], runs[CHI:])
    assert multi > 50 and split > 100
    plans = [p for r in ranks[0]["results"] for p in r["plans"]]
    # rounds whose two boundaries both fall strictly inside the root subtrees: all three ranks
    # hold tree nodes, so two offset-0 ownership hand-offs are exercised
    inner = [p for p in plans if 0 < p["plan"][0][2] < p["plan"][1][2] < p["subtrees"]]
    assert len(inner) >= 10


PROCESSOR_KNOBS = [dict(repetition_penalty=1.3), dict(repetition_penalty=0.7),
                   dict(repetition_penalty=1.2, min_new_tokens=20),
                   dict(repetition_penalty=1.4, min_new_tokens=6, temperature=0.8, top_k=6, seed=3),
                   dict(no_repeat_ngram_size=3, bad_words_ids=[[7, 7], [4]], repetition_penalty=1.1)]


def test_processors_at_two_workers_match_one(tmp_path):
    """generate's processors under LP (a repetition penalty, min_new_tokens, n-gram and bad-word bans):
    each rank processes its own nodes' rows, and
    P = 2 gives the one-worker tokens round for round (greedy: generate's), window, lookup and tree
    cases, with an EOS the hold-back keeps back."""
    model = tiny_random_llama(**MODEL).model.double()
    shapes = [dict(prompt=p, w=5, n=5, g=15, max_new=NEW) for p in PROMPTS[:2]]
    shapes += [lookup_case(p, LOOKUP_CONFIGS[1]) for p in PROMPTS[:2]]
    shapes += [tree_case(model, p, TREE_CONFIGS[1]) for p in PROMPTS[:2]]
    cases = [dict(shape, sampling=knobs, eos=[11], request=i)
             for i, (knobs, shape) in enumerate((k, s) for k in PROCESSOR_KNOBS for s in shapes)]
    runs = [single(model, c) for c in cases]
    for case, run in zip(cases, runs):
        if "temperature" not in case["sampling"]:
            x = torch.tensor([case["prompt"]])
            want = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=case["max_new"],
                                  pad_token_id=0, eos_token_id=11, **case["sampling"])[0, x.shape[1]:].tolist()
            assert run.token_ids == want, case
    ranks = torchrun(2, {"model": MODEL, "cases": cases}, tmp_path)
    multi, split = match_single(ranks, cases, runs)
    assert multi > 20 and split > 20
