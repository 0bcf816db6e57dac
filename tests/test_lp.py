"""Lookahead Parallelism with real gloo process groups (torchrun), float64 tiny Llama:
every world size gives the single-worker tokens AND per-round emitted counts."""
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

from lp.engine import GenerationParams, lookahead_generate
from lp.models import tiny_random_llama
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
                              GenerationParams(case["max_new"], **case.get("sampling", {})),
                              eos_token_ids=case.get("eos", []), request=case.get("request", 0),
                              corpus=corpus(case))


def cut_cases(model, bases=None):
    """max_new_tokens and EOS falling inside a multi-token round, and inside a lookup
    round that emits more than N tokens (greedy by default, or the given `bases`)."""
    if bases is None:
        bases = [dict(prompt=p, w=w, n=n, g=g, max_new=NEW) for w, n, g in [(5, 5, 15), (2, 4, 5)] for p in PROMPTS]
        bases += [lookup_case(p, cfg) for cfg in LOOKUP_CONFIGS[:2] for p in PROMPTS + SPAN_PROMPTS]
        bases += [tree_case(model, p, cfg) for cfg in TREE_CONFIGS[:2] for p in PROMPTS + SPAN_PROMPTS]
    cases = []
    for base in bases:
        r = single(model, base)
        long = "lookup" in base   # lookup or tree cases: rounds may emit more than N tokens
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
    accepted_multi = 0
    for i, (case, ref) in enumerate(zip(cases, reference)):
        for rank in ranks:
            got = rank["results"][i]
            assert got["tokens"] == ref.token_ids, (nproc, case)
            assert got["emitted"] == ref.emitted_per_round, (nproc, case)
            assert got["finish"] == ref.finish_reason
        accepted_multi += sum(e > 1 for e in ref.emitted_per_round)
    assert accepted_multi > 20
    assert any(max(ref.emitted_per_round) > case["n"] for case, ref in zip(cases, reference) if "lookup" in case)


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


def test_sampling_two_workers_match_one(tmp_path):
    """Same seed and request: P = 2 draws exactly the P = 1 samples (so they share its
    distribution, checked against the model's own joint in test_sampling.py)."""
    from test_sampling import LOOKUP_SAMPLING_PROMPTS, PROMPT, chi_square_p, exact_joint

    model_spec = {"vocab": 8, "seed": 2}
    model = tiny_random_llama(**model_spec).model.double()
    sampling = {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "seed": 11}
    n = 1500
    cases = [dict(prompt=PROMPT, w=3, n=3, g=4, max_new=3, sampling=sampling, request=i) for i in range(n)]
    cases += [dict(prompt=[t % 8 for t in p], w=w, n=nn, g=g, max_new=24, sampling=sampling, request=f"long{i}")
              for i, (p, (w, nn, g)) in enumerate(itertools.product(PROMPTS[:2], CONFIGS[:4]))]
    cooler = {"temperature": 0.7, "seed": 3}   # long lookup rounds are frequent enough to cut
    lookup = [dict(lookup_case([t % 8 for t in p], cfg, max_new=24), sampling=temp, request=f"lookup{i}")
              for i, (p, cfg, temp) in enumerate(itertools.product(
                  PROMPTS[:2] + SPAN_PROMPTS + LOOKUP_SAMPLING_PROMPTS, LOOKUP_CONFIGS, [sampling, cooler]))]
    small = [[t % 8 for t in p] for p in PROMPTS + LOOKUP_SAMPLING_PROMPTS]
    lookup += [dict(tree_case(model, p, cfg, max_new=24, others=small), sampling=temp, request=f"tree{i}")
               for i, (p, cfg, temp) in enumerate(itertools.product(
                   small[:2] + LOOKUP_SAMPLING_PROMPTS, TREE_CONFIGS, [sampling, cooler]))]
    cuts = cut_cases(model, lookup)     # sampled rounds longer than N, cut by max_new_tokens or EOS
    assert any("eos" in c for c in cuts) and any(c["max_new"] < 24 for c in cuts)
    cases += lookup + cuts
    single_runs = [single(model, c) for c in cases]
    ranks = torchrun(2, {"model": model_spec, "cases": cases}, tmp_path)
    multi = 0
    for i, ref in enumerate(single_runs):
        for rank in ranks:
            assert rank["results"][i]["tokens"] == ref.token_ids, cases[i]
            assert rank["results"][i]["emitted"] == ref.emitted_per_round, cases[i]
        multi += sum(e > 1 for e in ref.emitted_per_round)
    assert multi > n // 10
    joint = exact_joint(model, PROMPT, sampling["temperature"], sampling["top_k"], sampling["top_p"])
    counts = Counter(tuple(r["tokens"]) for r in ranks[0]["results"][:n])
    cells = sorted(joint)
    p_value = chi_square_p([counts[c] for c in cells], [n * joint[c] for c in cells])
    print(f"P=2 sampling: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3
