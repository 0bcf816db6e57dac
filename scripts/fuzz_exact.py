"""Differential fuzzing of lp.generate and the generate drop-in against transformers' `generate`, in float64.

The test grids each vary one thing at a time (a family, a lookahead setting, a processor, a batch size);
this draws them all at once: each case is a seeded random draw of a tiny model (family, vocabulary,
weights), its prompts (with repeats, so that drafts are accepted), max_new_tokens (up to 48, in a tenth
of the cases up to 192) and EOS ids, every lookahead key, the batch size and row budget, generate's
processors, a row-wise prefix_allowed_tokens_fn and stopping criterion, stop strings, and the entry
(lp.generate, or the drop-in on a left-padded batch). It checks every prompt's ids against
`model.generate` on that prompt alone (the drop-in: on the same batch), greedy, or sampled with
generate's own processors and warpers and lp's draws in place of torch.multinomial's (`lp_draws`: lp's
sampling is exact that way, the same draws give the same tokens); and lp.generate's finish reasons and
stop-cut text. A case is a pure function of its number and of
lp.tiny's family list (`draw_case`), so any failure is replayed with `--case N` on the same lp; a family
added to the list redraws the numbers, so a test that pins a case holds its whole spec.

    python scripts/fuzz_exact.py --minutes 10          # cases 0, 1, 2, ... until the time is up
    python scripts/fuzz_exact.py --case 417 -v         # one case, printed in full
    torchrun --nproc-per-node 2 scripts/fuzz_exact.py --minutes 10     # the same cases under LP (gloo)
    python scripts/fuzz_exact.py --jobs --minutes 10   # the same draws as JSONL jobs (lp.run), resumes too

Under torchrun every call decodes with Lookahead Parallelism over the launched world, or over groups of
`--lp-size` ranks of the dp x lp mesh (each rank feeds its share of every round's rows; the group's
leader drafts), and each rank checks its own ids.

With `--jobs` each case is a JSONL job run by lp.run's command in this process (`job_case`): the same
model, prompts, processors, keys and batch size, with sampling and stop strings, generate as the method
or the in-run baseline, bad lines, data.offset and limit, and resumes drawn for jobs; every selected line
must have one record with the ids, finish reason and text above (a bad line: its error), and a resumed
job the records of the whole run.

Prints one line per failing case (the case, the prompt, the first differing position) and a count; exits
1 if any case failed. tests/test_fuzz_exact.py runs a few cases in the default suite.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Sequence

import torch
from click.testing import CliRunner
from transformers import StoppingCriteria, StoppingCriteriaList

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lp  # noqa: E402
from lp.baseline import generate_seed  # noqa: E402
from lp.decode.sampling import Draws, sample  # noqa: E402
from lp.jobs.data import request_id  # noqa: E402
from lp.library import draw_seed  # noqa: E402
from lp.models import TinyTokenizer, load_model  # noqa: E402
from lp.parallel.dist import mesh  # noqa: E402
from lp.run import main as lp_run  # noqa: E402
from lp.tiny import FAMILIES as TINY_FAMILIES, tiny_random  # noqa: E402

# every family of the architecture matrix (sliding windows, soft-capping, biases, partial rotary, learned
# positions, MLA, experts, chunked attention, ...); each tiny model decodes in milliseconds per round
FAMILIES = tuple(TINY_FAMILIES)


def draw_case(case: int) -> dict:
    """Case `case`: the model, prompts and every knob, as JSON-able values (the same on every machine)."""
    r = random.Random(case)
    vocab = r.choice((16, 24, 64))
    low = 3                                                     # 0 pad, 1 bos, 2 the models' default EOS
    motif = [r.randrange(low, vocab) for _ in range(r.randint(2, 6))]

    def prompt():
        ids, length = [], r.randint(1, 24)
        while len(ids) < length:
            ids += motif[:r.randint(1, len(motif))] if r.random() < 0.5 else [r.randrange(low, vocab)]
        return ids
    keys = dict(window=r.choice((0, 1, 2, 4, 8)), ngram=r.randint(3, 6), guesses=r.choice((0, 1, 3, 8)),
                pool_seeding=r.random() < 0.7, lookup_candidates=r.choice((0, 0, 1, 3)),
                lookup_tokens=r.randint(1, 10), lookup_ngram=r.randint(1, 3),
                suffix_factor=r.choice((0.0, 0.0, 1.0, 4.0)), suffix_tokens=r.choice((4, 16, 32)),
                suffix_min_score=r.choice((0.0, 0.0, 0.3)),
                job_cache=r.random() < 0.5, tree_budget=r.choice((0, 0, 6, 24)),
                row_budget=r.random() < 0.3, prefix_reuse=r.random() < 0.7)
    if keys["window"] == 0:
        keys["guesses"] = 0
    knobs = {}
    if r.random() < 0.5:
        pool = dict(repetition_penalty=round(r.uniform(0.6, 1.6), 2), no_repeat_ngram_size=r.randint(2, 4),
                    min_new_tokens=r.randint(1, 12), suppress_tokens=r.sample(range(low, vocab), 2),
                    begin_suppress_tokens=r.sample(range(low, vocab), 3),
                    bad_words_ids=[[r.randrange(low, vocab)], r.sample(range(low, vocab), 2)],
                    sequence_bias=[[[r.randrange(low, vocab)], round(r.uniform(-4, 4), 1)],
                                   [r.sample(range(low, vocab), 2), round(r.uniform(-4, 4), 1)]],
                    forced_eos_token_id=r.randrange(low, vocab))
        knobs = {k: pool[k] for k in r.sample(sorted(pool), r.randint(1, 3))}
    eos = r.choice(([2], [r.randrange(low, vocab)], r.sample(range(low, vocab), 2)))
    family = r.choice(FAMILIES)
    # the entry: lp.generate, or generate's drop-in on a left-padded batch (not Gemma 2's: generate's own
    # padded rows come out NaN there)
    entry = "drop-in" if r.random() < 0.3 and family != "gemma2" else "generate"
    return dict(case=case, family=family, vocab=vocab, seed=r.randrange(1000),
                prompts=[prompt() for _ in range(r.randint(1, 4))], max_new_tokens=longer(case, r.randint(1, 48)),
                eos=eos,
                batch_size=r.randint(1, 4), keys=keys, knobs=knobs, entry=entry,
                # a prefix_allowed_tokens_fn (its multiplier; None: none) and a stopping criterion, called
                # row by row
                allowed=r.choice((None, None, r.randint(1, 5))), stop_on_repeat=r.random() < 0.2,
                # sampled with some of generate's warpers, checked against generate drawing the k-th token
                # with the same u_k (the drop-in's: drawn apart, so that the cases drawn before it could
                # sample stay as they were)
                sampling=(sampling(r) if r.random() < 0.3 else None) if entry == "generate" else
                drop_in_sampling(case),
                # lp.generate's stop strings on the decoded new text (lp.models.TinyTokenizer: a character a token)
                stop=stop_strings(r, vocab) if entry == "generate" and r.random() < 0.25 else [])


def longer(case: int, tokens: int) -> int:
    """max_new_tokens: `tokens` (1-48), or in a tenth of the cases 49-192, where stop strings reach the
    StopChecker's checkpoints (every 64 tokens) and drafts the suffix index's longer matches; drawn
    apart, so that the other draws of a case stay as they were."""
    r = random.Random(f"longer {case}")
    return r.randint(49, 192) if r.random() < 0.1 else tokens


def stop_strings(r: random.Random, vocab: int) -> list[str]:
    """One or two strings of one to three of the vocabulary's characters."""
    chars = TinyTokenizer(vocab).decode(list(range(3, vocab)))
    return ["".join(r.choice(chars) for _ in range(r.choice((1, 1, 2, 3)))) for _ in range(r.randint(1, 2))]


def drop_in_sampling(case: int) -> dict | None:
    """A drop-in case's sampling, in about a third of them; its seed seeds torch's global generator."""
    r = random.Random(f"drop-in {case}")
    return sampling(r) if r.random() < 0.3 else None


def sampling(r: random.Random) -> dict:
    """A temperature, a seed and up to three of generate's other warpers."""
    pool = dict(top_k=r.randint(1, 8), top_p=round(r.uniform(0.3, 0.95), 2), min_p=round(r.uniform(0.01, 0.2), 2),
                typical_p=round(r.uniform(0.3, 0.95), 2), epsilon_cutoff=round(r.uniform(1e-3, 0.05), 3),
                eta_cutoff=round(r.uniform(1e-3, 0.05), 3), top_h=round(r.uniform(0.5, 0.95), 2))
    return dict(temperature=round(r.uniform(0.3, 1.5), 2), seed=r.randrange(1000),
                **{k: pool[k] for k in r.sample(sorted(pool), r.randint(0, 3))})


_models: dict = {}


def model_of(spec: dict):
    key = (spec["family"], spec["vocab"], spec["seed"])
    if key not in _models:
        _models.clear()         # one model at a time: the row budget's costs are kept per model
        _models[key] = tiny_random(spec["family"], vocab=spec["vocab"], seed=spec["seed"], dtype=torch.float64,
                                   experts_implementation="eager")
    return _models[key]


def allowed_fn(multiplier: int, vocab: int, eos: list[int]):
    """A prefix_allowed_tokens_fn: every token but (last id x multiplier + batch id) mod the vocabulary,
    EOS ids always allowed."""
    def allowed(batch_id: int, ids: torch.Tensor) -> list[int]:
        banned = (int(ids[-1]) * multiplier + batch_id) % vocab
        return [t for t in range(vocab) if t != banned or t in eos]
    return allowed


class StopOnRepeat(StoppingCriteria):
    """Stops a row whose last two tokens are equal (a row-wise criterion, as lp tests them)."""
    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == input_ids[:, -2]


def extras(spec: dict, batch_id: int | None = None) -> dict:
    """The case's processors and criteria as generate takes them; `batch_id`: the one prompt's index, for
    a reference that decodes it alone (lp.generate calls the function with the prompt's index)."""
    out = dict(spec["knobs"])
    if spec["allowed"] is not None:
        fn = allowed_fn(spec["allowed"], spec["vocab"], spec["eos"])
        out["prefix_allowed_tokens_fn"] = fn if batch_id is None else lambda _, ids: fn(batch_id, ids)
    if spec["stop_on_repeat"]:
        out["stopping_criteria"] = StoppingCriteriaList([StopOnRepeat()])
    return out


def padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    return (torch.tensor([[0] * (width - len(p)) + p for p in prompts]),
            torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]))


def hf_generate(model, ids, mask, spec: dict, **more) -> torch.Tensor:
    return model.generate(ids, attention_mask=mask, pad_token_id=0, max_new_tokens=spec["max_new_tokens"],
                          eos_token_id=spec["eos"], **{"do_sample": False, **more})


@contextlib.contextmanager
def lp_draws(spec: dict, requests: Sequence[int]):
    """generate's sampling with lp's draws: while it lasts, torch.multinomial (generate's one draw per row and
    step) takes row b's k-th token from generate's own probabilities by lp's inverse-CDF rule with lp's
    uniform u_k of (seed, requests[b]); lp's sampling is exact in that strong sense, so the same draws
    give the same tokens. A greedy spec leaves it alone."""
    if not spec.get("sampling"):
        yield
        return
    draws, step, real = [Draws(spec["sampling"]["seed"], r) for r in requests], itertools.count(), torch.multinomial

    def multinomial(probs, num_samples, **kwargs):
        k = next(step)
        return torch.tensor([[sample(p, d.uniform(k))] for p, d in zip(probs, draws)], device=probs.device)
    torch.multinomial = multinomial
    try:
        yield
    finally:
        torch.multinomial = real


class KeptFloat64(torch.Tensor):
    """Logits whose cast to float32 keeps them float64: generate's first step on a forward's logits is
    `logits[:, -1].to(copy=True, dtype=torch.float32)`, so the slice stays this class and the cast drops
    only the dtype; every other op gives a plain tensor."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
            args = tuple(a for a in args if not isinstance(a, torch.dtype))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        return out.as_subclass(cls) if func is torch.Tensor.__getitem__ else out


@contextlib.contextmanager
def generate_in_float64(model, on: bool = True):
    """While it lasts (`on`), generate processes, warps and samples the float64 model's scores in float64,
    as lp does, instead of casting them to float32 first: the oracle that tells a float32 near-tie
    (generate's cast rounds two scores, or a warper's sort keys, into a tie or a swap; lp keeps float64,
    docs/how-it-works.md) from a real difference."""
    if not on:
        yield
        return

    def keep(module, args, kwargs, out):
        out.logits = out.logits.as_subclass(KeptFloat64)
        return out
    hook = model.register_forward_hook(keep, with_kwargs=True)
    try:
        yield
    finally:
        hook.remove()


def sampled(spec: dict) -> dict:
    """generate's sampling arguments of the spec ({}: greedy). Unset warpers are generate's defaults (its
    top-50: lp.generate's and the drop-in's defaults too), but a job's top_k, which is 0 (off)."""
    if not spec.get("sampling"):
        return {}
    job = {"top_k": 0} if spec["entry"] == "job" else {}
    return {"do_sample": True, **job, **{k: v for k, v in spec["sampling"].items() if k != "seed"}}


def reference(model, spec: dict, i: int, request: int | None = None, float64: bool = False,
              own_draws: bool = False) -> list[int]:
    """generate's ids after prompt `i` alone, up to and including the first EOS: greedy, or sampled with
    lp's draws of `request` (by default `i`: lp.generate addresses its draws by the prompt's index, a job
    by its task id), or with generate's own draws (`own_draws`: torch seeded as a job's autoregressive
    method and in-run baseline seed it, of the job's seed and `request`); `float64`: generate_in_float64."""
    x = torch.tensor([spec["prompts"][i]])
    request = i if request is None else request
    if own_draws and spec.get("sampling"):
        torch.manual_seed(generate_seed(spec["sampling"]["seed"], request))
    with lp_draws({} if own_draws else spec, [request]), generate_in_float64(model, float64):
        ids = hf_generate(model, x, torch.ones_like(x), spec, **sampled(spec), **extras(spec, i))
    ids = ids[0, x.shape[1]:].tolist()
    ids = next((ids[:k + 1] for k, t in enumerate(ids) if t in spec["eos"]), ids)
    return ids[:stop_cut(spec, ids)[0]]


def stop_cut(spec: dict, ids: list[int]) -> tuple[int, str | None, bool]:
    """Where the stop strings end `ids` (the fewest tokens whose decoded text holds one; all of them if
    none does before an EOS), that text cut before the first one (None: no stop strings), and whether one
    did."""
    if not spec.get("stop"):
        return len(ids), None, False
    tokenizer = TinyTokenizer(spec["vocab"])
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if ids[k - 1] in spec["eos"]:       # an EOS ends the output first (the tiny EOS ids decode to characters)
            break
        hits = [h for h in (text.find(s) for s in spec["stop"]) if h >= 0]
        if hits:
            return k, text[:min(hits)], True
    return len(ids), tokenizer.decode(ids, skip_special_tokens=True), False


def decode(model, spec: dict) -> tuple[list[list[int]], int, list | None]:
    """lp's ids, per prompt or per padded row (the drop-in), its rounds that committed several tokens (-1
    for the drop-in, which does not report them) and lp.generate's results (None: the drop-in)."""
    if spec["entry"] == "drop-in":
        ids, mask = padded(spec["prompts"])
        seed_torch(spec)
        got = hf_generate(model, ids, mask, spec, custom_generate=lp.lookahead, batch_size=spec["batch_size"],
                          **sampled(spec), **extras(spec), **spec["keys"])
        return got.tolist(), -1, None
    stops = dict(stop_strings=spec["stop"], tokenizer=TinyTokenizer(spec["vocab"])) if spec.get("stop") else {}
    result = lp.generate(model, spec["prompts"], max_new_tokens=spec["max_new_tokens"], eos_token_id=spec["eos"],
                         batch_size=spec["batch_size"], **extras(spec), **sampled(spec), **stops, **spec["keys"],
                         **({"seed": spec["sampling"]["seed"]} if spec.get("sampling") else {}))
    return [r.token_ids for r in result], sum(e > 1 for r in result for e in r.emitted_per_round), result


def seed_torch(spec: dict) -> None:
    """Seeds torch's global generator with the case's seed (0 greedy), as a drop-in call is seeded."""
    torch.manual_seed(spec["sampling"]["seed"] if spec.get("sampling") else 0)


def drop_in_seeded(spec: dict) -> dict:
    """The spec with the seed the drop-in draws lp's seed from replaced by that draw (one draw of torch's
    generator after seed_torch)."""
    seed_torch(spec)
    if not spec.get("sampling"):
        return spec
    return dict(spec, sampling=dict(spec["sampling"], seed=draw_seed()))


def oracle(model, spec: dict, float64: bool = False) -> list[list[int]]:
    """generate's ids for what decode decodes: each prompt alone, or the drop-in's padded batch (its draws
    lp's, seeded by one draw of torch's global generator, a request per row); `float64`:
    generate_in_float64."""
    if spec["entry"] != "drop-in":
        return [reference(model, spec, i, float64=float64) for i in range(len(spec["prompts"]))]
    ids, mask = padded(spec["prompts"])
    with lp_draws(drop_in_seeded(spec), range(len(spec["prompts"]))), generate_in_float64(model, float64):
        return hf_generate(model, ids, mask, spec, **sampled(spec), **extras(spec)).tolist()


def finish_reason(spec: dict, i: int, ids: list[int]) -> str | None:
    """Why prompt `i`'s output `ids` ends, in lp's precedence: an EOS, a stop string, the stopping
    criterion, the length."""
    seq = spec["prompts"][i] + ids
    if ids and ids[-1] in spec["eos"]:
        return "eos"
    if stop_cut(spec, ids)[2]:
        return "stop"
    if ids and spec["stop_on_repeat"] and seq[-1] == seq[-2]:
        return "stop"
    return "length" if len(ids) == spec["max_new_tokens"] else None


def generate_refuses(model, spec: dict) -> bool:
    """Whether generate refuses the case's knobs too (then lp's refusal is right)."""
    try:
        reference(model, spec, 0)
    except ValueError:
        return True
    return False


def difference(where: dict, want: list[int], got: list[int], float32_tie: bool) -> dict:
    """A report of lp's ids `got` against generate's `want`: where, both, the first differing position, and
    whether generate in float64 gives lp's ids (a float32 near-tie: reported, not counted as a failure)."""
    at = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return dict(where, want=want, got=got, at=at, **({"float32_tie": True} if float32_tie else {}))


def failures(wrong: list[dict]) -> list[dict]:
    """The reports that are failures: all but the float32 near-ties."""
    return [w for w in wrong if not w.get("float32_tie")]


def run_case(spec: dict) -> tuple[list[dict], int]:
    """The prompts whose lp ids differ from generate's ([{prompt, want, got, at}]; `float32_tie` where they
    are generate's in float64) or whose finish reason is not why the ids end (empty: the case holds, a
    refusal too where generate refuses the same knobs), and how many of lp's rounds committed several
    tokens (the drafts the case exercised; 0 for the drop-in)."""
    model = model_of(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # generate's notes on infeasible lengths and such
        try:
            got, multi, results = decode(model, spec)
        except ValueError as refused:
            if generate_refuses(model, spec):
                return [], 0
            return [dict(error=f"lp refused what generate decodes: {refused}")], 0
        wanted = oracle(model, spec)
        in_float64 = functools.cache(lambda: oracle(model, spec, float64=True))
        wrong = [] if len(got) == len(wanted) else [dict(error=f"{len(got)} outputs for {len(wanted)} prompts")]
        for i, (want, ids) in enumerate(zip(wanted, got)):
            if ids != want:
                wrong.append(difference(dict(prompt=i), want, ids, in_float64()[i] == ids))
            elif results is not None and results[i].finish_reason != finish_reason(spec, i, ids):
                wrong.append(dict(prompt=i, finish_reason=results[i].finish_reason, want=finish_reason(spec, i, ids)))
            elif results is not None and spec.get("stop") and results[i].text != stop_cut(spec, ids)[1]:
                wrong.append(dict(prompt=i, text=results[i].text, want=stop_cut(spec, ids)[1]))
    return wrong, max(multi, 0)


# ---- jobs (--jobs): the same draws as a JSONL job, run by lp.run's command in this process -------------------

def job_case(case: int) -> dict:
    """Case `case` as a JSONL job: draw_case's family, vocabulary, seed, prompts (as the tiny tokenizer's
    text), max_new_tokens, processors, lookahead keys and batch size, with the model's own EOS (a job has
    no EOS key) and no callables (a YAML file holds none); and the job's own draws, from a stream apart
    (so draw_case's cases stay as they are): sampling and stop strings, a broken line and an empty prompt
    among the prompts (each must get its error record), data.offset and limit, generate as the method
    (`autoregressive`) or the in-run baseline beside lookahead, and a resume from the first records
    written (with a torn line after them or not)."""
    spec = draw_case(case)
    r = random.Random(f"job {case}")
    method = "autoregressive" if r.random() < 0.15 else "lookahead"
    baseline = method == "lookahead" and r.random() < 0.15
    drawn = sampling(r) if r.random() < 0.3 else None
    stop = stop_strings(r, spec["vocab"]) if r.random() < 0.3 else []
    text = TinyTokenizer(spec["vocab"]).decode
    lines = [dict(task_id=f"t{i}", prompt=text(ids)) for i, ids in enumerate(spec["prompts"])]
    if r.random() < 0.3:
        lines.insert(r.randint(0, len(lines)), dict(broken=True))
    if r.random() < 0.2:
        lines.insert(r.randint(0, len(lines)), dict(task_id="empty", prompt=""))
    offset = r.choice((0, 0, 0, 1)) if len(lines) > 1 else 0
    limit = r.choice((None, None, max(1, len(lines) - offset - 1)))
    selected = len(lines[offset:None if limit is None else offset + limit])
    resume = dict(keep=r.randrange(selected), torn=r.random() < 0.5) if r.random() < 0.3 else None
    return dict(spec, entry="job", eos=[2], allowed=None, stop_on_repeat=False, sampling=drawn, stop=stop,
                method=method, baseline=baseline, batch_size=1 if method != "lookahead" or baseline
                else spec["batch_size"], lines=lines, offset=offset, limit=limit, resume=resume)


def job_files(spec: dict, tmp: Path) -> Path:
    """The case's prompt file and job config in `tmp`; the config's path."""
    data = tmp / "prompts.jsonl"
    data.write_text("".join(('{"task_id": "broken' if line.get("broken") else json.dumps(line)) + "\n"
                            for line in spec["lines"]))
    knobs = dict(spec["knobs"])
    if "forced_eos_token_id" in knobs:
        knobs["forced_eos_token_id"] = [knobs["forced_eos_token_id"]]     # a job's key takes a list
    config = dict(model=dict(name=job_model_name(spec), dtype="float64", device="cpu"),
                  lookahead=spec["keys"],
                  generation=dict(method=spec["method"], max_new_tokens=spec["max_new_tokens"],
                                  batch_size=spec["batch_size"], stop=spec["stop"], **knobs,
                                  **(spec["sampling"] or {})),
                  data=dict(source="jsonl", path=str(data), offset=spec["offset"], limit=spec["limit"]),
                  output=dict(dir=str(tmp / "out")), baseline=dict(enabled=spec["baseline"]),
                  distributed=dict(backend="gloo", timeout_s=120))
    path = tmp / "job.yaml"
    path.write_text(json.dumps(config))        # JSON is YAML
    return path


def job_model_name(spec: dict) -> str:
    return f"tiny-random-{spec['family']}?vocab={spec['vocab']}&seed={spec['seed']}"


def job_model(spec: dict):
    """The job's model as the job loads it (lp.models.load_model), kept while cases share it."""
    key = job_model_name(spec)
    if key not in _models:
        _models.clear()
        _models[key] = load_model(key, "float64", device="cpu").model
    return _models[key]


def run_job(spec: dict) -> tuple[list[dict], int]:
    """The job's records that are not what they should be ([{task, ...}]: empty, the case holds), and how
    many of its rounds committed several tokens. Every selected line has one record; a prompt's record
    has generate's ids (sampled: with the task's draws), why they end and the text they decode to, cut
    before a stop string (the autoregressive method's, and the in-run baseline's, are generate's with its
    own draws, seeded of the task); a broken line or an empty prompt has an error record. A resumed job
    keeps every record and writes the missing ones to the same result."""
    model = job_model(spec)
    with tempfile.TemporaryDirectory() as tmp:
        config = job_files(spec, Path(tmp))
        out = Path(tmp) / "out" / "results.jsonl"

        def run() -> tuple[list[dict] | None, str]:
            result = CliRunner().invoke(lp_run, ["--config", str(config), "--quiet"])
            # exit 1 and this line where every selected line is broken or empty: a job with nothing decoded
            nothing = "no prompt could be decoded" in result.output and all(
                line.get("broken") or not line["prompt"] for line in selected(spec))
            if result.exit_code != 0 and not (result.exit_code == 1 and nothing):
                return None, f"the job exited {result.exit_code}: {result.output.strip()[-600:]!r}"
            return [json.loads(line) for line in out.read_text().splitlines()], ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records, failure = run()
            if records is None:
                return ([], 0) if generate_refuses(model, spec) else ([dict(error=failure)], 0)
            wrong, multi = job_records_wrong(spec, model, records)
            if spec["resume"] and not failures(wrong):
                lines = out.read_bytes().splitlines(keepends=True)
                kept = lines[:spec["resume"]["keep"]]
                torn = lines[len(kept)][:len(lines[len(kept)]) // 2] if spec["resume"]["torn"] else b""
                out.write_bytes(b"".join(kept) + torn)
                again, failure = run()
                if again is None:
                    return [dict(error=f"resumed after {len(kept)} records: {failure}")], multi
                def outcomes(recs):
                    return {r["task_id"]: [r.get(k) for k in ("token_ids", "finish_reason", "error", "completion")]
                            for r in recs}
                if len(again) != len(records) or outcomes(again) != outcomes(records):
                    wrong.append(dict(task="resume", kept=len(kept), torn=bool(torn),
                                      want=sorted(outcomes(records)), got=[r["task_id"] for r in again]))
    return wrong, multi


def selected(spec: dict) -> list[dict]:
    """The prompt file's lines the job decodes (data.offset and limit)."""
    return spec["lines"][spec["offset"]:None if spec["limit"] is None else spec["offset"] + spec["limit"]]


def job_records_wrong(spec: dict, model, records: list[dict]) -> tuple[list[dict], int]:
    """run_job's checks of one run's records."""
    want_ids = sorted(line.get("task_id", "?") for line in selected(spec))
    got_ids = sorted(rec["task_id"] for rec in records)
    wrong = []
    if len(got_ids) != len(want_ids) or [t for t in got_ids if not t.startswith("<line")] != \
            [t for t in want_ids if t != "?"]:
        wrong.append(dict(task="records", want=want_ids, got=got_ids))      # a broken line's id: <line N>
    tokenizer, multi = TinyTokenizer(spec["vocab"]), 0
    for rec in records:
        i = int(rec["task_id"][1:]) if rec["task_id"][1:].isdigit() else None
        if i is None:
            if not rec["error"]:
                wrong.append(dict(task=rec["task_id"], error=None, want="an error record"))
            continue
        ids, request, own = rec["token_ids"], request_id(rec["task_id"]), spec["method"] == "autoregressive"
        want = reference(model, spec, i, request, own_draws=own)
        text = stop_cut(spec, ids)[1] if spec["stop"] else tokenizer.decode(ids, skip_special_tokens=True)
        multi += sum(e > 1 for e in rec["emitted_per_round"])
        if rec["error"] or ids != want:
            tie = not rec["error"] and reference(model, spec, i, request, float64=True, own_draws=own) == ids
            wrong.append(difference(dict(task=rec["task_id"], error=rec["error"]), want, ids, tie))
        elif rec["finish_reason"] != finish_reason(spec, i, ids):
            wrong.append(dict(task=rec["task_id"], finish_reason=rec["finish_reason"],
                              want=finish_reason(spec, i, ids)))
        elif rec["completion"] != text:
            wrong.append(dict(task=rec["task_id"], completion=rec["completion"], want=text))
        elif spec["baseline"] and rec["baseline_token_ids"] != (
                base := reference(model, spec, i, request, own_draws=True) if spec["sampling"] else want):
            wrong.append(dict(task=rec["task_id"], baseline=rec["baseline_token_ids"], want=base))
    return wrong, multi


def under_lp(lp_size: int | None = None):
    """This rank's LP group's Comm (the torchrun world, or groups of `lp_size`) with lp.generate and the
    drop-in decoding over it (None: one process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None
    import lp.library
    from lp.parallel.dist import init_distributed
    comm = init_distributed("gloo", timeout_s=120, lp_size=lp_size)
    for name in ("decode_batch", "lookahead_generate"):
        setattr(lp.library, name, functools.partial(getattr(lp.library, name), comm=comm))
    return comm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=int, help="run this one case")
    ap.add_argument("--first", type=int, default=0, help="the first case number (default 0)")
    ap.add_argument("--cases", type=int, default=None, help="how many cases (default: until --minutes)")
    ap.add_argument("--minutes", type=float, default=5.0, help="stop starting cases after this long (default 5)")
    ap.add_argument("--lp-size", type=int, default=None,
                    help="under torchrun: LP groups of this many ranks, each decoding every case (default: one group)")
    ap.add_argument("--jobs", action="store_true",
                    help="run each case as a JSONL job (lp.run's command in this process; one process only)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case drawn")
    args = ap.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.jobs and world > 1:
        ap.error("--jobs runs in one process: lp.run starts its own distributed world "
                 "(tests/test_lp_jobs.py runs jobs under torchrun)")
    try:
        mesh(world, args.lp_size)           # the groups lp would make: its own check and message
    except ValueError as e:
        ap.error(f"--lp-size: {e} (LP groups of several ranks need torchrun)")
    draw, check = (job_case, run_job) if args.jobs else (draw_case, run_case)
    torch.set_num_threads(1)
    cases = [args.case] if args.case is not None else \
        range(args.first, args.first + args.cases) if args.cases is not None else itertools.count(args.first)
    comm = under_lp(args.lp_size)
    rank = f"rank {comm.job_rank}: " if comm is not None else ""
    start, done, failed, ties, multi = time.monotonic(), 0, [], [], 0
    for case in cases:
        go = args.case is not None or args.cases is not None or time.monotonic() - start <= 60 * args.minutes
        if comm is not None:        # every rank decodes the same cases: global rank 0's clock decides
            flag = torch.tensor([int(go)])
            torch.distributed.broadcast(flag, 0)
            go = bool(flag)
        if not go:
            break
        spec = draw(case)
        if args.verbose:
            print(json.dumps(spec), flush=True)
        try:
            wrong, rounds = check(spec)
            multi += rounds
        except Exception as e:      # a crash is a failure of the case too: report it and go on
            wrong = [dict(error=f"{type(e).__name__}: {e}")]
        done += 1
        (failed if failures(wrong) else ties if wrong else []).append(case)
        if wrong:
            for w in wrong:
                print(f"{rank}case {case} ({spec['family']}): {json.dumps(w)}", flush=True)
    if comm is not None:
        from lp.parallel.dist import shutdown
        rank += f"world {comm.world}, {comm.dp_size} group(s), {comm.collectives} collectives, "
        shutdown(comm)
    print(f"{rank}{done} cases ({time.monotonic() - start:.0f} s, {multi} rounds committing several tokens), "
          f"{len(failed)} failed" + (f": {failed}" if failed else "")
          + (f", {len(ties)} with only float32 near-ties (generate's cast; lp keeps float64): {ties}" if ties else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
