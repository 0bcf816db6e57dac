"""The device check: lp on one GPU, compiled and eager, in process and on its real job path, in
one run of at most 8 minutes that keeps what it measured and writes one JSON file.

    bash scripts/gpu_check.sh --out gpu_check.json                   # one CUDA GPU, < 8 minutes
    bash scripts/gpu_check.sh --small --device cpu --out check.json   # tiny shapes on the CPU (tests)

Nothing is downloaded. The check builds random-weight Llamas (a 7B Llama and the same 7B width
with 4 layers in float16, as configs/codellama-7b-humaneval.yaml runs CodeLlama-7B, and
SmolLM2-135M's shape in bfloat16), saves each with save_pretrained beside a word-level tokenizer
whose vocabulary names every model id, and writes prompts in that vocabulary to a JSONL file.

First the preflight (about 20 s): versions, the device, lp's round cache on a 2-layer model, one
eager and one compiled lookahead decode on it and batched rounds of 1 and 4 requests as a batched
job's row budget measures them (float16 on a GPU); if it fails the JSON says so ("preflight": {"ok":
false}) and the check stops with one line and exit status 2. Then the plan's stages, in priority
order (Plan.stages):

- compiled/<model>: in a worker process, on the 7B width with few layers, lookahead rounds, the
  static-cache greedy loop (LookaheadParams(0, 3, 0)) and transformers' own static-cache
  `generate`, all compiled the same way with one cache length (the workload is sized so; the JSON
  gives each system's slots), after an untimed pass that compiles every shape; its compile seconds
  per layer budget the later compiled stages;
- eager/<model>: in this process, the model loaded as a job loads it, the forward-time curve, plain
  `generate` and lookahead in a process group of one (NCCL; gloo on the CPU; one all-gather checks
  it, and the rounds of a group of one exchange nothing), each warmed up by one
  untimed decode of the first prompt and timed on the others, rounds timed with device marks (CUDA
  events: spans, which include the device's idle gaps) and host syncs counted;
- job/<model>, job-batched/<model>: `python3 -m torch.distributed.run --standalone --nproc-per-node 1
  -m lp.run` (world size 1, NCCL; no collectives in its rounds), one prompt at a time with the
  in-run baseline, then every prompt in one batch;
- exact/<model>: in float32 with TF32 off, lookahead's ids against `generate`'s, and for each
  difference the first differing position and the reference's top-2 logit margin there; then
  both again with generate's processors (PROCESSED: the ids, and whether the processors changed
  them), lookahead sampling with generate's warpers (SAMPLED: its S and host syncs per round), and a
  prefix_allowed_tokens_fn called row by row as lp.generate calls it (residue_constraint, against
  transformers' own `generate` with it: the ids, time per round and host syncs);
- profile/<model>: torch.profiler over a few rounds: kernels and summed kernel time per round next
  to the wall time per round (on the CPU: CPU ops, "activity": "cpu");
- lp-p2/<model>, lp-p4/<model>: LP with 2 and 4 ranks on the one GPU (LP_SHARED_DEVICE=1: every rank
  on cuda:0, gloo), float32: its tokens against exact/<model>'s (P = 1);
- job-compiled/<model>: the job with `model.compile: reduce-overhead` (CUDA graphs; `default` on
  the CPU), budgeted by the compile time per layer the compiled stage measured.

A stage is skipped, with the reason recorded, when the time left in the budget (--budget-s) is
below its estimate (each stage records its estimate and how it was made); a stage in a subprocess
is stopped past twice its estimate + 30 s or when the budget runs out, and a watchdog ends the whole
check HARD_STOP_S seconds after the budget (a stage in this process cannot be stopped otherwise).
The JSON is rewritten after every stage. Random weights make S (tokens per round) meaningless;
time per round, kernel time against wall time, host syncs, the forward-time curve and float32 ids
are not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import click
import torch
import yaml

from bench_util import exit_on_term_and_hangup, seconds, writable_file
from lp.processes import descendants, stop_tree

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = ROOT / "configs" / "codellama-7b-humaneval.yaml"   # the shipped GPU setting

SHAPES = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
}
SHAPES["llama-7b-4l"] = dict(SHAPES["llama-7b"], num_hidden_layers=4)   # the width of 7B, its compile per layer
SMALL_SHAPES = {   # the same two kinds of attention (full heads; grouped K/V heads) in miniature
    "tiny-llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=512),
    "tiny-smol": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=384, tie_word_embeddings=True),
}


@dataclasses.dataclass
class Plan:
    """What one run of the check does: its models, its stages in priority order, their workloads."""
    models: dict            # name -> (shape, dtype)
    stages: list            # (kind, model), or ("lp", model, ranks), in priority order
    prompts: int            # prompts in the JSONL file (the jobs decode them all)
    prompt_tokens: int
    new_tokens: int
    inprocess_prompts: int  # the first k prompts, decoded in process (and by the LP jobs); the eager
                            # stage warms up on the first and times the others (k >= 2)
    compiled_job_prompts: int          # the compiled jobs' data.limit and the compiled stage's prompts
    compiled_tokens: tuple  # the compiled stage's (prompt tokens, new tokens): see compiled_cache_slots
    rows: list
    prefix: int
    repeats: int
    floors: dict            # stage kind -> the seconds it needs at least (compiled jobs add compile time)
    compiled_lookahead: dict | None = None   # the compiled stages' `lookahead` section; None: the GPU config's
    tiny: bool = False      # tiny shapes: larger initial weights (see build_model)


# 96 + 156 tokens for the eager and job stages; the compiled stage's 128 + 380 give lp's static
# cache 1024 slots for the GPU config's lookahead (its largest round pads to 512 rows) and for the
# greedy loop (8 rows) alike (compiled_cache_slots checks it), and transformers' static cache as many
FULL = Plan(
    models={"llama-7b": (SHAPES["llama-7b"], "float16"), "llama-7b-4l": (SHAPES["llama-7b-4l"], "float16"),
            "smollm2-135m": (SHAPES["smollm2-135m"], "bfloat16")},
    # in the order the first H200 run (docs/benchmarks.md) says fits 420 s: every kind of stage once
    # (about 400 s), then the second model's eager, job and profile stages and LP at P = 4 as time allows
    stages=[("compiled", "llama-7b-4l"), ("eager", "llama-7b"), ("job", "llama-7b"), ("exact", "llama-7b-4l"),
            ("exact", "smollm2-135m"), ("lp", "smollm2-135m", 2), ("job-batched", "llama-7b"), ("profile", "llama-7b"),
            ("eager", "smollm2-135m"), ("lp", "smollm2-135m", 4), ("job", "smollm2-135m"),
            ("profile", "smollm2-135m"), ("job-compiled", "llama-7b"), ("job-compiled", "smollm2-135m")],
    prompts=4, prompt_tokens=96, new_tokens=156, inprocess_prompts=2, compiled_job_prompts=2,
    compiled_tokens=(128, 380), rows=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], prefix=512, repeats=5,
    # the compiled stage and the first job as the first H200 run took them (145 s, 68 s; they were 90 and 40)
    floors={"compiled": 150, "eager": 40, "job": 70, "exact": 20, "profile": 15, "lp": 30, "job-batched": 40,
            "job-compiled": 40},
)
# tiny shapes and few tokens: the CPU smoke run of the tests, every kind of stage once at least (one
# torchrun job per kind: each starts Python, torch and transformers again, about 10 s on a 2-core CPU).
# The float32 model is the one whose ids can be asserted outside the exact stage (lower precision
# legitimately flips near-tied argmaxes). Compilation dominates on a CPU, so the compiled stages
# decode one 4-token prompt with a candidate set whose every round fits 8 rows: one compiled graph
# serves the compiled lookahead, the compiled greedy loop and (from inductor's on-disk cache) the
# compiled job.
SMALL = Plan(
    models={"tiny-llama": (SMALL_SHAPES["tiny-llama"], "float16"), "tiny-smol": (SMALL_SHAPES["tiny-smol"], "float32")},
    stages=[("compiled", "tiny-smol"), ("eager", "tiny-llama"), ("eager", "tiny-smol"), ("job", "tiny-smol"),
            ("exact", "tiny-llama"), ("exact", "tiny-smol"), ("profile", "tiny-llama"), ("lp", "tiny-smol", 2),
            ("job-batched", "tiny-smol"), ("job-compiled", "tiny-smol")],
    prompts=3, prompt_tokens=4, new_tokens=12, inprocess_prompts=2, compiled_job_prompts=1,
    compiled_tokens=(4, 12), rows=[1, 2, 4, 8, 16], prefix=32, repeats=2,
    floors={"compiled": 30, "eager": 5, "job": 15, "exact": 5, "profile": 5, "lp": 20, "job-batched": 15,
            "job-compiled": 20},
    compiled_lookahead=dict(window=0, ngram=3, guesses=1, pool_seeding=True, lookup_candidates=1,
                            lookup_tokens=2, lookup_ngram=2), tiny=True,
)
STAGE_KINDS = ("compiled", "eager", "job", "exact", "profile", "lp", "job-batched", "job-compiled")
HARD_STOP_S = 40   # past the budget by this much the whole check ends (420 + 40 s: inside 8 minutes)
GREEDY_LOOP = dict(window=0, ngram=3, guesses=0, pool_seeding=False, lookup_candidates=0)
PREFLIGHT_LOOKAHEAD = SMALL.compiled_lookahead   # every round fits 8 rows: one compiled shape
PREFLIGHT_PREFIX = 16   # cached tokens of the preflight's batched rounds
PROFILE_TOKENS = 32   # new tokens of a profiled decode (a few rounds)
# the exact stage's second pass: generate's processors on the device (the penalty's presence rows, the
# host's n-gram bans, the EOS hold-back and a suppressed token), and a sampled pass with its warpers
PROCESSED = dict(repetition_penalty=1.2, no_repeat_ngram_size=3, min_new_tokens=4, suppress_tokens=(1,))
SAMPLED = dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.01, typical_p=0.95, eta_cutoff=0.0005, seed=1)
CONSTRAINT_STATES = 7   # the row-processor pass: a prefix_allowed_tokens_fn with this many states
SYNC_WARNING = "synchronizing CUDA operation"   # torch.cuda.set_sync_debug_mode("warn")'s message
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def stage_name(spec: tuple) -> str:
    """compiled/llama-7b-4l, ..., lp-p2/smollm2-135m for ("lp", "smollm2-135m", 2)."""
    return f"lp-p{spec[2]}/{spec[1]}" if spec[0] == "lp" else f"{spec[0]}/{spec[1]}"


def compiled_cache_slots(plan: Plan, lookahead: dict) -> dict:
    """The slots lp's static cache gets for the compiled stage's workload, per compiled system (as
    the engine sizes it for padded rounds: cache_length(cache_need(..., bucket)))."""
    from lp.decode.kv_cache import cache_length
    from lp.decode.layout import bucket
    from lp.decode.request import cache_need
    from lp.engine import LookaheadParams

    prompt, new = plan.compiled_tokens
    return {name: cache_length(cache_need(prompt, LookaheadParams(**params), new, bucket))
            for name, params in (("lookahead compiled", lookahead), ("greedy loop compiled", GREEDY_LOOP))}


# ---- the models, the tokenizer, the prompts ---------------------------------------------------------------


def build_model(shape: dict, dtype: torch.dtype, device: torch.device, tiny: bool):
    """A random-weight Llama of `shape` on `device` (seeded). No EOS: every output runs to
    max_new_tokens. Tiny shapes get larger weights (as lp.models.tiny_random_llama) so greedy
    output varies with the prompt instead of repeating one token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    extra = dict(initializer_range=1.2 / shape["hidden_size"] ** 0.5) if tiny else {}
    config = LlamaConfig(**shape, max_position_embeddings=4096, attn_implementation="sdpa", eos_token_id=None,
                         bos_token_id=None, pad_token_id=0, **extra)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def word_tokenizer(vocab_size: int):
    """A whitespace word-level tokenizer with one word per model id: id 0 '<pad>', id 1 '<unk>',
    id i 'w<i>'. Decoding any id gives a word; encoding 'w5 w17' gives [5, 17]."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


def prompt_ids(index: int, length: int, vocab: int) -> list[int]:
    """A prompt of `length` word ids: a few random phrases, repeated in random order (so the pool
    and the lookup find something to propose), seeded by `index`."""
    rng = random.Random(1000 + index)
    phrases = [[rng.randrange(2, vocab) for _ in range(rng.randint(3, 7))] for _ in range(6)]
    ids: list[int] = []
    while len(ids) < length:
        ids += rng.choice(phrases)
    return ids[:length]


def write_prompts(path: Path, plan: Plan, vocab: int) -> list[str]:
    """Prompts in the tokenizer's words (vocab: the smallest model vocabulary), one JSONL line each."""
    texts = [" ".join(f"w{i}" for i in prompt_ids(k, plan.prompt_tokens, vocab)) for k in range(plan.prompts)]
    with open(path, "w") as f:
        for k, text in enumerate(texts):
            f.write(json.dumps({"task_id": f"check/{k}", "prompt": text}) + "\n")
    return texts


# ---- timing on the device, counting host syncs --------------------------------------------------------


class Marks:
    """Points in device time: CUDA events recorded on the current stream (no sync; read after one
    synchronize at the end) on a GPU, the host clock on the CPU, where the device is the host."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else 1000 * (b - a)


class RoundTimes:
    """Per round of lp.engine.lookahead_generate: marks at the upload (the round's first device
    work), around the forward, after the payload all-gather (its last), and host times. The engine
    is not changed: `patched()` wraps the functions it calls, for this process only."""

    def __init__(self, marks: Marks):
        self.marks, self.rounds, self.current = marks, [], None

    @contextlib.contextmanager
    def patched(self):
        import lp.decode.batch as batch
        import lp.engine as engine
        from lp.decode.device import Uploader
        from lp.parallel.dist import Comm

        send, forward, gather, decide = Uploader.send, batch.forward_logits, Comm.all_gather, engine.decide
        marks = self.marks

        def timed_send(uploader, sections):
            self.current = {"t0": time.perf_counter(), "start": marks.mark()}
            return send(uploader, sections)

        def timed_forward(*args, **kwargs):
            m0, h0 = marks.mark(), time.perf_counter()
            out = forward(*args, **kwargs)
            self.current.update(forward_host=time.perf_counter() - h0, f0=m0, f1=marks.mark())
            return out

        def timed_gather(comm, payload):
            out = gather(comm, payload)
            self.current["end"] = marks.mark()
            return out

        def timed_decide(*args, **kwargs):   # its argument is the payload already read: the round's sync
            self.current["t1"] = time.perf_counter()
            self.rounds.append(self.current)
            self.current = None
            return decide(*args, **kwargs)

        Uploader.send, batch.forward_logits, Comm.all_gather, engine.decide = (
            timed_send, timed_forward, timed_gather, timed_decide)
        try:
            yield self
        finally:
            Uploader.send, batch.forward_logits, Comm.all_gather, engine.decide = send, forward, gather, decide

    def figures(self) -> dict:
        """Call after a synchronize: the events must have completed."""
        if not self.rounds:
            return {}
        ms = self.marks.ms
        device = [ms(r["start"], r["end"]) for r in self.rounds]
        forward = [ms(r["f0"], r["f1"]) for r in self.rounds]
        return {"device_ms_per_round": statistics.fmean(device),
                "device_ms_per_round_median": statistics.median(device),
                "forward_device_ms": statistics.fmean(forward),
                "forward_launch_ms": 1000 * statistics.fmean(r["forward_host"] for r in self.rounds),
                "upload_to_read_ms": 1000 * statistics.fmean(r["t1"] - r["t0"] for r in self.rounds)}


class ForwardTimes:
    """Per model forward (generate's steps): marks from forward hooks on the model."""

    def __init__(self, marks: Marks):
        self.marks, self.spans, self.host, self._open = marks, [], [], None

    @contextlib.contextmanager
    def hooked(self, model):
        def pre(module, args):
            self._open = (self.marks.mark(), time.perf_counter())

        def post(module, args, output):
            mark, t = self._open
            self.host.append(time.perf_counter() - t)
            self.spans.append((mark, self.marks.mark()))

        handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def figures(self) -> dict:
        if not self.spans:
            return {}
        device = [self.marks.ms(a, b) for a, b in self.spans]
        return {"device_ms_per_forward": statistics.fmean(device),
                "device_ms_per_forward_median": statistics.median(device),
                "forward_launch_ms": 1000 * statistics.fmean(self.host)}


@contextlib.contextmanager
def counted_syncs(cuda: bool, out: dict):
    """Count the host syncs of the block into out['host_syncs'] (and their call sites): CUDA's sync
    debug mode warns once per synchronizing call. On the CPU there is nothing to count."""
    if not cuda:
        out["host_syncs"] = None
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    count_sync_warnings(caught, out)


def count_sync_warnings(caught, out: dict) -> None:
    syncs = [w for w in caught if SYNC_WARNING in str(w.message)]
    out["host_syncs"] = len(syncs)
    sites = Counter(f"{_short_path(w.filename)}:{w.lineno}" for w in syncs)
    out["host_sync_sites"] = dict(sites.most_common(6))


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lp/", "/scripts/"):
        if marker in path:
            head = "" if marker == "site-packages/" else marker.strip("/") + "/"
            return head + path.split(marker, 1)[1]
    return path


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


# ---- in-process decoding (eager in this process, compiled in the worker) ------------------------------------


def run_generate(loaded, prompts: list[list[int]], new_tokens: int, cuda: bool, generation: dict | None = None) -> dict:
    """Plain greedy `generate` (lp.baseline, the jobs' baseline; with `generation`'s GenerationParams
    keys), timed per forward."""
    from lp.baseline import autoregressive_generate
    from lp.engine import GenerationParams

    marks, out, results = Marks(cuda), {}, []
    times = ForwardTimes(marks)
    sync(cuda)
    with times.hooked(loaded.model), counted_syncs(cuda, out):
        for ids in prompts:
            gen = GenerationParams(new_tokens, **(generation or {}))
            results.append(autoregressive_generate(loaded.model, ids, gen, eos_token_ids=loaded.eos_token_ids,
                                                   request=len(results)))
    sync(cuda)
    tokens = sum(r.new_tokens for r in results)
    seconds = sum(r.decode_seconds for r in results)
    fig = {"prompts": len(results), "tokens": tokens, "forwards": tokens, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "wall_ms_per_forward": 1000 * seconds / tokens, **times.figures()}
    fig.update(out)
    fig["host_syncs_per_forward"] = None if out["host_syncs"] is None else out["host_syncs"] / tokens
    fig["token_ids"] = [r.token_ids for r in results]
    return fig


def run_lookahead(loaded, prompts: list[list[int]], new_tokens: int, params: dict, cuda: bool,
                  compile_mode: str = "off", comm=None, generation: dict | None = None, row_processor=None) -> dict:
    """lookahead_generate over `prompts` (with `generation`'s GenerationParams keys and a caller's
    `row_processor`), each round timed on the device and against the wall."""
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate

    marks, out, results = Marks(cuda), {}, []
    times = RoundTimes(marks)
    sync(cuda)
    with times.patched(), counted_syncs(cuda, out):
        for k, ids in enumerate(prompts):
            results.append(lookahead_generate(loaded.model, ids, LookaheadParams(**params),
                                              GenerationParams(new_tokens, **(generation or {})),
                                              eos_token_ids=loaded.eos_token_ids,
                                              tokenizer=loaded.tokenizer, comm=comm, request=k,
                                              compile_mode=compile_mode, row_processor=row_processor))
    sync(cuda)
    tokens = sum(r.new_tokens for r in results)
    rounds = sum(r.forwards for r in results)
    seconds = sum(r.decode_seconds for r in results)
    fig = {"prompts": len(results), "tokens": tokens, "rounds": rounds, "S": tokens / rounds, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "wall_ms_per_round": 1000 * seconds / rounds,
           "host_ms_per_round": 1000 * sum(r.host_seconds for r in results) / rounds,
           "rows_per_round": sum(sum(r.rows_per_round) for r in results) / rounds,
           "collectives_per_round": sum(r.collectives for r in results) / rounds, **times.figures()}
    fig.update(out)
    fig["host_syncs_per_round"] = None if out["host_syncs"] is None else out["host_syncs"] / rounds
    fig["token_ids"] = [r.token_ids for r in results]
    return fig


def residue_constraint(vocab: int, states: int = CONSTRAINT_STATES):
    """A prefix_allowed_tokens_fn as a grammar makes one: the row's last token picks one of `states`
    states, and a state allows every id but those congruent to it (lists of most of the vocabulary).
    It reads the row's ids as a user's function does (on CUDA, a host sync per call)."""
    lists = [[t for t in range(vocab) if t % states != r] for r in range(states)]
    return lambda batch_id, ids: lists[int(ids[-1]) % states]


def run_constrained_generate(loaded, prompts: list[list[int]], new_tokens: int, cuda: bool, fn) -> dict:
    """transformers' own greedy `generate` with `prefix_allowed_tokens_fn=fn`, one prompt at a time: the
    reference for lookahead with the same function called row by row."""
    fig, ids_out, seconds = {}, [], 0.0
    with counted_syncs(cuda, fig):
        for ids in prompts:
            x = torch.tensor([ids], device=loaded.model.device)
            sync(cuda)
            t = time.perf_counter()
            out = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                                        prefix_allowed_tokens_fn=fn, eos_token_id=list(loaded.eos_token_ids),
                                        pad_token_id=0)
            sync(cuda)
            seconds += time.perf_counter() - t
            ids_out.append(out[0, len(ids):].tolist())
    tokens = sum(len(ids) for ids in ids_out)
    fig.update(tokens=tokens, seconds=seconds, ms_per_token=1000 * seconds / tokens, token_ids=ids_out)
    fig["host_syncs_per_token"] = None if fig["host_syncs"] is None else fig["host_syncs"] / tokens
    return fig


def first_differences(model, prompts: list[list[int]], ids: list[list[int]], reference: list[list[int]]) -> list:
    """For each prompt whose `ids` differ from the `reference`'s: the first differing position, the
    two tokens there and the reference model's top-2 logit margin at that position (one plain
    forward of the prompt and the reference's tokens before it). A margin near 0 is a near-tie that
    rounding may flip; a wide one is a real difference."""
    out = []
    for k, (mine, ref) in enumerate(zip(ids, reference)):
        if mine == ref:
            continue
        pos = next((i for i, (a, b) in enumerate(zip(mine, ref)) if a != b), min(len(mine), len(ref)))
        context = torch.tensor([prompts[k] + ref[:pos]], device=next(model.parameters()).device)
        with torch.no_grad():
            top = model(context).logits[0, -1].float().topk(2)
        values, tokens = top.values.tolist(), top.indices.tolist()
        out.append({"prompt": k, "position": pos, "reference_token": ref[pos] if pos < len(ref) else None,
                    "token": mine[pos] if pos < len(mine) else None, "reference_top2_margin": values[0] - values[1],
                    "reference_top2": tokens})
    return out


@contextlib.contextmanager
def tf32_off():
    """float32 matmuls and convolutions in full float32 (no TF32) for the block, restored after;
    yields the settings seen inside it."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
               "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
               "float32_matmul_precision": torch.get_float32_matmul_precision()}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def profile_system(run, cuda: bool) -> dict:
    """`run()` (a decode, already warm; returns (rounds, seconds)) once timed and once under
    torch.profiler: the device's operations per round (CUDA kernels, copies and sets; on the CPU,
    CPU ops), their summed time per round, the wall time per round of the timed run, and the
    share of that wall the summed time covers (`kernel_busy`; overlapping operations count twice)."""
    from torch.profiler import ProfilerActivity, profile

    rounds, seconds = run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        profiled_rounds, _ = run()
        sync(cuda)
    count, us = device_work(prof.events(), cuda)
    kernel_ms, wall_ms = us / 1000 / profiled_rounds, 1000 * seconds / rounds
    return {"rounds": rounds, "kernels_per_round": count / profiled_rounds, "kernel_ms_per_round": kernel_ms,
            "wall_ms_per_round": wall_ms, "kernel_busy": kernel_ms / wall_ms}


def device_work(events, cuda: bool) -> tuple[int, float]:
    """How many operations ran on the device and their summed microseconds: the CUDA events
    (kernels, memcpy, memset) on a GPU; on the CPU every CPU op, by its self time (no nesting)."""
    from torch.autograd import DeviceType

    if cuda:
        work = [e for e in events if e.device_type == DeviceType.CUDA]
        return len(work), sum(e.time_range.end - e.time_range.start for e in work)
    work = [e for e in events if e.device_type == DeviceType.CPU]
    return len(work), sum(e.self_cpu_time_total for e in work)


def lookahead_run(loaded, ids: list[int], new_tokens: int, params: dict, compile_mode: str = "off", comm=None):
    """A `run` for profile_system: lookahead_generate of `ids`, returning (rounds, decode seconds)."""
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate

    def run():
        r = lookahead_generate(loaded.model, ids, LookaheadParams(**params), GenerationParams(new_tokens),
                               eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, comm=comm,
                               compile_mode=compile_mode)
        return r.forwards, r.decode_seconds
    return run


def generate_run(loaded, ids: list[int], new_tokens: int):
    """A `run` for profile_system: plain `generate` (lp.baseline), returning (forwards, decode seconds)."""
    from lp.baseline import autoregressive_generate
    from lp.engine import GenerationParams

    def run():
        r = autoregressive_generate(loaded.model, ids, GenerationParams(new_tokens), eos_token_ids=loaded.eos_token_ids)
        return r.new_tokens, r.decode_seconds
    return run


def run_static_generate(loaded, prompts: list[list[int]], new_tokens: int, cache_slots: int, compile_mode: str,
                        cuda: bool) -> dict:
    """transformers' own `generate` with its static cache of `cache_slots` slots and its compiled
    decoding step (`compile_config`; CPUs need `_compile_all_devices`), greedy: an untimed pass that
    compiles, then per prompt a timed decode of `new_tokens` and one of 1 token (the prefill), so
    the time per token excludes the prefill."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, mode=None if compile_mode == "default" else compile_mode)
    config._compile_all_devices = not cuda

    def generate(ids, n):
        x = torch.tensor([ids], device=loaded.model.device)
        sync(cuda)
        t = time.perf_counter()
        out = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                    cache_implementation="static", max_cache_len=cache_slots,
                                    compile_config=config, pad_token_id=0)
        sync(cuda)
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    t = time.perf_counter()
    for ids in prompts:
        generate(ids, new_tokens)
    warm, fig = time.perf_counter() - t, {}
    with counted_syncs(cuda, fig):
        full = [generate(ids, new_tokens) for ids in prompts]
    first = [generate(ids, 1)[1] for ids in prompts]
    tokens, seconds = sum(len(ids) for ids, _ in full), sum(s for _, s in full)
    fig.update(prompts=len(prompts), tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
               ms_per_token=1000 * (seconds - sum(first)) / (tokens - len(prompts)), max_cache_len=cache_slots,
               warmup_seconds=warm, compile_seconds=warm - seconds, token_ids=[ids for ids, _ in full])
    fig["host_syncs_per_token"] = None if fig["host_syncs"] is None else fig["host_syncs"] / tokens
    return fig


def world_of_one(backend: str, device: str):
    """A real process group of one rank, set up the way lp.run sets it up under torchrun
    (lp.parallel.dist.init_distributed). A group of one exchanges nothing in its rounds, so one
    all-gather of the LP payload's kind (int64, on the device) checks the backend's collective here."""
    from lp.parallel.dist import _all_gather_single, init_distributed

    saved = {k: os.environ.get(k) for k in DIST_ENV}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    try:
        comm = init_distributed(backend, 120.0, device)
        payload = torch.arange(8, dtype=torch.long, device=comm.device)
        out = torch.empty_like(payload)
        _all_gather_single()(out, payload, group=comm.group)
        if not torch.equal(out, payload):
            raise RuntimeError(f"an all-gather on the {comm.backend} group of one returned {out.tolist()}")
        return comm
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def group_or_none(backend: str, device: str, out: dict):
    """world_of_one, or None (no collectives) with the reason in out['process_group_error']: the
    in-process figures still come when the process group cannot be set up."""
    from lp.parallel.dist import shutdown

    try:
        return world_of_one(backend, device)
    except Exception as e:  # noqa: BLE001
        out["process_group_error"] = one_line(e, 400)
        with contextlib.suppress(Exception):
            shutdown()
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preflight(dev: str, cuda: bool, compile_mode: str) -> dict:
    """What every stage needs, in seconds: the versions and the device, lp's round cache on a
    2-layer model (its layers, slots, dtype and device), one eager and one compiled lookahead
    decode of 4 tokens on it and batched rounds of 1 and 4 requests (float16 on a GPU). Raises on
    the first thing that fails."""
    import transformers

    from lp.decode.kv_cache import round_cache
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
    from lp.measure.cost_model import batch_curve

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    shape = SMALL_SHAPES["tiny-smol"]
    model = build_model(shape, torch.float32, torch.device(dev), tiny=True)
    cache = round_cache(model, 64)
    keys = cache.layers[0].keys
    out["cache"] = {"layers": len(cache.layers), "slots": cache.length, "key_shape": list(keys.shape),
                    "dtype": str(keys.dtype), "device": str(keys.device)}
    if len(cache.layers) != shape["num_hidden_layers"] or cache.length < 64 or keys.device.type != dev \
            or keys.dtype != torch.float32:
        raise RuntimeError(f"lp's round cache is not what the model needs: {out['cache']}")
    ids = prompt_ids(0, 8, shape["vocab_size"])
    for mode in ("off", compile_mode):
        t = time.perf_counter()
        r = lookahead_generate(model, ids, LookaheadParams(**PREFLIGHT_LOOKAHEAD), GenerationParams(4),
                               compile_mode=mode)
        sync(cuda)
        out[f"lookahead {mode}"] = {"seconds": time.perf_counter() - t, "rounds": r.forwards, "token_ids": r.token_ids}
    # a record, not a failure: a compiled kernel may round a near-tie the other way
    out["ids_equal"] = out["lookahead off"]["token_ids"] == out[f"lookahead {compile_mode}"]["token_ids"]
    # batched rounds as a batched job's row budget probes them (lp.measure.cost_model.batch_curve), in
    # the jobs' half precision on a GPU: the first H200 run failed there (cuDNN attention), not here
    half = build_model(shape, torch.float16 if cuda else torch.float32, torch.device(dev), tiny=True)
    t = time.perf_counter()
    grid = batch_curve(half, PREFLIGHT_PREFIX, [1, 4], [1, 2, 8], repeats=1)
    sync(cuda)
    out["batched probe"] = {"seconds": time.perf_counter() - t, "dtype": str(half.dtype), "cells": len(grid)}
    return out


def compiled_worker(spec_path: str) -> None:
    """The compiled stage (a subprocess, so the budget can stop it): lookahead, the greedy loop and
    transformers' static-cache `generate`, each compiled: an untimed pass that compiles every shape,
    the timed pass, and for lp's two a profiled decode of the first prompt. Each system's compile
    seconds (untimed pass less timed pass) and lp's cache slots are recorded; the figures so far are
    rewritten to spec['out'] after each system, so a stopped worker still leaves them."""
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
    from lp.models import load_model
    from lp.parallel.dist import shutdown

    spec = json.loads(Path(spec_path).read_text())
    cuda = spec["device"].startswith("cuda")
    t = time.perf_counter()
    loaded = load_model(spec["model_dir"], dtype=spec["dtype"], device=spec["device"])
    figures = {"load_seconds": time.perf_counter() - t, "compile_mode": spec["compile"], "systems": {}}
    comm = group_or_none(spec["backend"], spec["device"], figures)
    # lookahead as the job runs it (a world of one, which exchanges nothing in its rounds); the greedy
    # loop, a baseline like generate, without a process group
    systems = [("lookahead compiled", spec["lookahead"], comm), ("greedy loop compiled", GREEDY_LOOP, None)]
    prompts, new = spec["prompts"], spec["new_tokens"]

    def save():
        figures["dynamo_counters"] = dynamo_counters()
        tmp = Path(spec["out"] + ".tmp")
        tmp.write_text(json.dumps(figures))
        os.replace(tmp, spec["out"])    # whole or not at all: the budget may stop this process

    try:
        for name, params, group in systems:
            t = time.perf_counter()
            for k, ids in enumerate(prompts):   # compiles (and captures) every round shape: not timed
                lookahead_generate(loaded.model, ids, LookaheadParams(**params), GenerationParams(new),
                                   eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, comm=group,
                                   request=k, compile_mode=spec["compile"])
            sync(cuda)
            warm = time.perf_counter() - t
            fig = run_lookahead(loaded, prompts, new, params, cuda, spec["compile"], group)
            slots = spec["cache_slots"][name]
            if (1, slots) not in loaded.model.__dict__.get("_lp_round_caches", {}):
                raise RuntimeError(f"{name}: lp's cache has not the {slots} slots compiled_cache_slots says")
            fig.update(warmup_seconds=warm, compile_seconds=warm - fig["seconds"], cache_slots=slots, lookahead=params,
                       world_size=group.world if group else 1, backend=group.backend if group else "none",
                       profile=profile_system(lookahead_run(loaded, prompts[0], new, params, spec["compile"], group),
                                              cuda))
            figures["systems"][name] = fig
            save()
        static = run_static_generate(loaded, prompts, new, spec["cache_slots"]["greedy loop compiled"],
                                     spec["compile"], cuda)
        figures["systems"]["transformers static generate compiled"] = static
        save()
    finally:
        shutdown(comm)


def dynamo_counters() -> dict:
    """torch._dynamo's counters (graphs compiled, recompilations, CUDA-graph skips and why)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {group: {str(k): v for k, v in values.items() if isinstance(v, (int, float))}
            for group, values in counters.items() if values}


# ---- subprocesses within the budget ------------------------------------------------------------------------


class StageError(Exception):
    """A stage that did not finish: `status` (failed | timeout), why, and the figures it got."""

    def __init__(self, reason: str, status: str = "failed", figures: dict | None = None):
        super().__init__(reason)
        self.reason, self.status, self.figures = reason, status, figures or {}


class StageTimeout(StageError):
    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason, "timeout", figures)


def child_env(extra: dict | None = None) -> dict:
    """This environment for a child, with `extra` over it: lp importable from this tree, no hub
    access, none of a process group's variables (torchrun sets its own); on the CPU one torch
    thread (see main)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV and k != "LP_SHARED_DEVICE"}
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if torch.get_num_threads() == 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def run_child(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> int:
    """Run `cmd`, output to `log`; past `timeout` seconds it and every process it started are
    stopped (SIGTERM, then SIGKILL 10 s later) and StageTimeout raised. torchrun starts its workers
    in sessions of their own, so they are found by parentage, not by process group."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(env), cwd=ROOT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            raise StageTimeout(f"stopped when the budget ran out, after {timeout:.0f} s") from None
        except BaseException:     # Ctrl-C, SIGTERM, SIGHUP (exit_on_term_and_hangup), the watchdog
            stop_tree(proc, grace_s=2.0)
            raise


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


WORKER_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*(?:Error|Exception)|error): .*)")


def worker_error(path: Path) -> str | None:
    """The last error line a job's workers wrote to its log (`SomeError: ...` of a traceback, or lp's
    `error: ...` line), not torchrun's own ChildFailedError banner after it: why the job failed."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [m.group(1) for m in map(WORKER_ERROR.match, lines) if m and "ChildFailedError" not in m.group(1)]
    return found[-1][:600] if found else None


# ---- the torchrun job ----------------------------------------------------------------------------------


def job_config(model_dir: Path, dtype: str, device: str, compile_mode: str, backend: str, lookahead: dict,
               plan: Plan, prompts: Path, out_dir: Path, limit: int | None, batch_size: int = 1,
               baseline: bool = True) -> dict:
    """A job config: `baseline` (the in-run generate baseline) only where one prompt runs at a time."""
    return {
        "model": {"name": str(model_dir), "dtype": dtype, "device": device, "compile": compile_mode},
        "lookahead": lookahead,
        "generation": {"method": "lookahead", "max_new_tokens": plan.new_tokens, "stop": [],
                       "batch_size": batch_size},
        "data": {"source": "jsonl", "path": str(prompts), "offset": 0, "limit": limit},
        "output": {"dir": str(out_dir)},
        "distributed": {"backend": backend, "timeout_s": 120},
        "baseline": {"enabled": baseline and batch_size == 1},    # the in-run baseline times one prompt at a time
    }


def run_job(name: str, config: dict, work: Path, timeout: float, reference: list | None, procs: int = 1,
            env: dict | None = None) -> dict:
    """torchrun, world size `procs` (`env` over this environment), `python3 -m lp.run` on `config`;
    what its output directory says."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = work / f"{name}.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
           "-m", "lp.run", "--config", str(path), "--quiet"]
    t = time.perf_counter()
    fig = {"command": " ".join(cmd[1:]), "env": env or {}, "config": config}
    out_dir = Path(config["output"]["dir"])
    try:
        rc = run_child(cmd, log, timeout, env)
    except StageTimeout as e:     # keep the prompts it finished
        fig.update(log_tail=tail(log), records_so_far=_record_figures(out_dir))
        raise StageTimeout(e.reason, fig) from None
    fig.update(returncode=rc, wall_seconds=time.perf_counter() - t, log_tail=tail(log))
    summary_path = out_dir / "summary.json"
    if rc != 0 or not summary_path.exists():
        fig["records_so_far"] = _record_figures(out_dir)
        fig["error"] = worker_error(log)
        why = fig["error"] or (fig["log_tail"][-1] if fig["log_tail"] else "")
        raise StageError(f"torchrun exited {rc}" + ("" if summary_path.exists() else ", no summary.json")
                         + (": " + why if why else ""), figures=fig)
    summary = json.loads(summary_path.read_text())
    summary.pop("config", None)   # the job's config is fig["config"]
    records = sorted(_records(out_dir), key=lambda r: r["line"])   # task order (a batched job writes as requests end)
    fig["summary"] = summary
    later = [r for r in records[1:] if r["finish_reason"] != "error"]   # the first prompt holds any compilation
    if later:
        fig["tokens_per_second_after_first"] = _rate(later, "new_tokens", "decode_seconds")
        if config["baseline"]["enabled"]:
            fig["baseline_tokens_per_second_after_first"] = _rate(later, "baseline_new_tokens",
                                                                  "baseline_decode_seconds")
    fig["ids_equal_baseline"] = (f"{sum(r.get('baseline_ids_equal', False) for r in records)}/{len(records)}"
                                 if config["baseline"]["enabled"] else None)
    if reference:   # the in-process eager lookahead's ids of the same first prompts
        pairs = list(zip([r["token_ids"] for r in records], reference))
        fig["ids_equal_inprocess_lookahead"] = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
    fig["token_ids"] = [r["token_ids"] for r in records]
    decoding = sum((r.get("decode_seconds") or 0) + (r.get("baseline_decode_seconds") or 0) for r in records)
    fig["start_seconds"] = max(fig["wall_seconds"] - decoding, 0.0)   # torchrun, imports, load, the group
    return fig


def _records(out_dir: Path) -> list[dict]:
    path = out_dir / "results.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):   # a torn last line of a stopped job
            out.append(json.loads(line))
    return out


def _record_figures(out_dir: Path) -> list[dict]:
    keys = ("task_id", "new_tokens", "forwards", "decode_seconds", "baseline_decode_seconds", "baseline_ids_equal",
            "finish_reason", "error")
    return [{k: r.get(k) for k in keys} for r in _records(out_dir)]


def _rate(records: list[dict], tokens: str, seconds: str) -> float | None:
    s = sum(r[seconds] for r in records)
    return sum(r[tokens] for r in records) / s if s > 0 else None


# ---- the check ---------------------------------------------------------------------------------------------


class Check:
    """Runs the stages in order within the budget and keeps the report (rewritten after every stage)."""

    def __init__(self, out_path: Path, budget_s: float, report: dict, cuda: bool = False):
        self.out_path, self.budget_s, self.report, self.cuda = out_path, budget_s, report, cuda
        self.start = time.perf_counter()
        self.running: str | None = None
        self.cleanup = lambda: None
        report.setdefault("stages", {})

    def watchdog(self, after_s: float) -> threading.Timer:
        """A stage in this process cannot be stopped by the budget: past `after_s` seconds the whole
        check ends (the JSON written, every process it started killed, the work directory removed)."""
        timer = threading.Timer(max(after_s - self.elapsed(), 0), self._hard_stop, args=(after_s,))
        timer.daemon = True
        timer.start()
        return timer

    def _hard_stop(self, after_s: float) -> None:
        with contextlib.suppress(Exception):
            if self.running:
                self.report["stages"][self.running] = {"status": "timeout",
                                                       "reason": f"the whole check was stopped at {after_s:.0f} s"}
            self.report["stopped"] = f"the whole check was stopped at {after_s:.0f} s (budget {self.budget_s:.0f} s)"
            self.save()
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.cleanup()
            click.echo(f"stopped at {after_s:.0f} s; wrote {self.out_path}", err=True)
        os._exit(3)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def skip_reason(self, estimate: float) -> str | None:
        left = self.left()
        if left < estimate:
            return f"needs about {estimate:.0f} s and {max(left, 0):.0f} s of the {self.budget_s:.0f} s budget are left"
        return None

    def stage(self, name: str, estimate: float, fn, needs: list[str] = (), basis: str = "given"):
        """Run fn(seconds it may take) as stage `name` unless the budget or a failed prerequisite
        says no. It may take twice its `estimate` (made as `basis` says) + 30 s, within the budget
        left: a subprocess is stopped there; the record keeps the estimate, the allowance and the
        seconds it took."""
        missing = [n for n in needs if self.report["stages"].get(n, {}).get("status") != "ok"]
        reason = (f"{', '.join(missing)} did not succeed" if missing else None) or self.skip_reason(estimate)
        record = {"status": "skipped", "reason": reason} if reason else None
        if record is None:
            allowed = min(self.left(), 2 * estimate + 30)
            click.echo(f"[{self.elapsed():5.0f} s] {name} ...", err=True)
            t = time.perf_counter()
            self.running = name
            try:
                record = {"status": "ok", **fn(allowed)}
            except StageError as e:
                record = {"status": e.status, "reason": e.reason, **e.figures}
            except Exception as e:  # noqa: BLE001  (a failed stage is a finding; the check goes on)
                record = {"status": "failed", "reason": one_line(e)}
            record.update(seconds=time.perf_counter() - t, allowed_s=allowed)
            self.running = None
            free(self.cuda)   # whatever a failed stage left behind, before the next one
        else:
            click.echo(f"[{self.elapsed():5.0f} s] {name}: skipped ({reason})", err=True)
        record.update(estimate_s=estimate, estimate_basis=basis)
        self.report["stages"][name] = record
        self.save()
        return record

    def save(self) -> None:
        self.report["seconds"] = self.elapsed()
        tmp = self.out_path.with_name(self.out_path.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1))
        os.replace(tmp, self.out_path)


def one_line(e: BaseException, limit: int = 600) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def equal_count(ids: list, reference: list | None) -> str | None:
    if not reference:
        return None
    pairs = list(zip(ids, reference))
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


@click.command()
@click.option("--out", "out_path", default="gpu_check.json", show_default=True, type=click.Path(dir_okay=False),
              callback=writable_file)
@click.option("--small", is_flag=True, help="tiny shapes, few tokens: the smoke run of the tests (CPU or GPU)")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cuda", "cpu"]))
@click.option("--budget-s", default=420.0, show_default=True, type=float, callback=seconds,
              help="stages that would not fit in this many seconds are skipped; subprocesses are stopped at it")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="where models, prompts and job directories go (default: a new temporary directory)")
@click.option("--keep", is_flag=True, help="keep the work directory (default: removed at the end)")
@click.option("--stages", default=",".join(STAGE_KINDS), show_default=True,
              help="the kinds of stage to run (the preflight and the models always run), e.g. compiled,lp")
@click.option("--models", "only_models", default="", help="run these models only (comma-separated; default: all)")
@click.option("--worker", type=click.Path(dir_okay=False), default=None, hidden=True)
def main(out_path, small, device, budget_s, work_dir, keep, stages, only_models, worker):
    if worker:   # the compiled stage's subprocess (OMP_NUM_THREADS comes from the parent)
        return compiled_worker(worker)
    exit_on_term_and_hangup()
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise click.UsageError("--device cuda: this machine has no CUDA device")
    if not cuda and not small:
        raise click.UsageError("the full shapes need a CUDA GPU (a 7B model); use --small on the CPU")
    plan = SMALL if small else FULL
    kinds = [k.strip() for k in stages.split(",") if k.strip()]
    if not set(kinds) <= set(STAGE_KINDS):
        raise click.BadParameter(f"{stages!r}: stage kinds are {', '.join(STAGE_KINDS)}", param_hint="--stages")
    if only_models:
        names = [m.strip() for m in only_models.split(",") if m.strip()]
        if not set(names) <= set(plan.models):
            raise click.BadParameter(f"{only_models!r}: models are {', '.join(plan.models)}", param_hint="--models")
        plan = dataclasses.replace(plan, models={m: plan.models[m] for m in names},
                                   stages=[s for s in plan.stages if s[1] in names])
    plan = dataclasses.replace(plan, stages=[s for s in plan.stages if s[0] in kinds])
    dev = "cuda" if cuda else "cpu"
    if not cuda:   # tiny forwards on a shared CPU: more threads only wait for each other
        torch.set_num_threads(1)
    compile_mode = "reduce-overhead" if cuda else "default"   # CUDA graphs need CUDA
    from lp.jobs.config import load_config

    gpu_lookahead = dataclasses.asdict(load_config(GPU_CONFIG).lookahead)
    compiled_lookahead = plan.compiled_lookahead or gpu_lookahead
    slots = compiled_cache_slots(plan, compiled_lookahead)
    if len(set(slots.values())) != 1:    # the plan's workload is wrong, not the device
        raise click.UsageError(f"the compiled stage's workload {plan.compiled_tokens} gives the compiled systems "
                               f"different cache lengths: {slots}")
    report = {
        "check": "lp gpu_check", "small": small, "budget_s": budget_s, "hard_stop_s": budget_s + HARD_STOP_S,
        "stage_kinds": kinds, "compile_mode": compile_mode, "backend": "nccl" if cuda else "gloo",
        "device_timer": ("CUDA event spans (upload to gathered payload; around the forward): they include the "
                         "device's idle gaps between launches, so they are no busy time: the profile figures "
                         "kernel_ms_per_round / wall_ms_per_round are" if cuda
                         else "host clock (the CPU is the device)"),
        "host_syncs": ("counted with torch.cuda.set_sync_debug_mode('warn') (it does not cover torch.distributed)"
                       if cuda else "not applicable: no CUDA device (nothing to synchronize with)"),
        "lookahead": gpu_lookahead, "lookahead_source": str(GPU_CONFIG.relative_to(ROOT)),
        "compiled_lookahead": compiled_lookahead, "compiled_cache_slots": slots,
        "workload": {"prompts": plan.prompts, "prompt_tokens": plan.prompt_tokens, "new_tokens": plan.new_tokens,
                     "inprocess_prompts": plan.inprocess_prompts, "compiled_job_prompts": plan.compiled_job_prompts,
                     "compiled_tokens": list(plan.compiled_tokens), "profile_tokens": PROFILE_TOKENS},
        "plan": [stage_name(s) for s in plan.stages], "models": {}, "stages": {},
    }
    check = Check(Path(out_path), budget_s, report, cuda)
    work = Path(work_dir).resolve() if work_dir else Path(tempfile.mkdtemp(prefix="lp-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if not keep and not work_dir:
        check.cleanup = lambda: shutil.rmtree(work, ignore_errors=True)
    watchdog = check.watchdog(budget_s + HARD_STOP_S)
    try:
        run_preflight(check, dev, cuda, compile_mode)
        Stages(check, plan, work, dev, cuda, compile_mode, gpu_lookahead, compiled_lookahead).run()
    finally:
        watchdog.cancel()
        check.save()
        check.cleanup()
    click.echo(render(report))
    click.echo(f"wrote {out_path} in {report['seconds']:.0f} s")


def run_preflight(check: Check, dev: str, cuda: bool, compile_mode: str) -> None:
    """The preflight into report['preflight']; if it fails, the JSON is written, one line says
    why, and the check ends with status 2 (nothing else would run)."""
    t = time.perf_counter()
    try:
        check.report["preflight"] = {"ok": True, **preflight(dev, cuda, compile_mode)}
    except Exception as e:  # noqa: BLE001
        check.report["preflight"] = {"ok": False, "error": one_line(e)}
    check.report["preflight"]["seconds"] = time.perf_counter() - t
    check.save()
    if not check.report["preflight"]["ok"]:
        click.echo(f"gpu_check: preflight failed, nothing else run: {check.report['preflight']['error']}", err=True)
        raise SystemExit(2)


class Stages:
    """The plan's stages: setup, then each (kind, model[, ranks]) in order, run by the method of
    its kind within the budget. In-process stages share one world-of-one process group."""

    def __init__(self, check: Check, plan: Plan, work: Path, dev: str, cuda: bool, compile_mode: str,
                 gpu_lookahead: dict, compiled_lookahead: dict):
        self.check, self.plan, self.work, self.dev, self.cuda = check, plan, work, dev, cuda
        self.compile_mode, self.backend = compile_mode, check.report["backend"]
        self.gpu_lookahead, self.compiled_lookahead = gpu_lookahead, compiled_lookahead
        self.report, self.stages = check.report, check.report["stages"]
        self.prompts_path = work / "prompts.jsonl"
        self.vocab = min(shape["vocab_size"] for shape, _ in plan.models.values())   # every model knows these words
        self.comm = None
        self.comm_error = None

    def run(self) -> None:
        self.texts = write_prompts(self.prompts_path, self.plan, self.vocab)
        self.report["prompts_file"] = str(self.prompts_path)
        if self.check.stage("setup", 0, self.setup, basis="none: it always runs")["status"] != "ok":
            return
        try:
            for spec in self.plan.stages:
                kind, model, *ranks = spec
                estimate, basis = self.estimate(kind, model, *ranks)
                method = getattr(self, kind.replace("-", "_"))
                record = self.check.stage(stage_name(spec), estimate, lambda left: method(model, left, *ranks),
                                          needs=["setup"], basis=basis)
                if kind == "job-compiled" and record["status"] == "skipped":
                    self.shrink(model)
        finally:
            if self.comm is not None:
                from lp.parallel.dist import shutdown

                shutdown(self.comm)

    def estimate(self, kind: str, model: str, ranks: int = 1) -> tuple[float, str]:
        """The seconds stage (kind, model[, ranks]) should take, and how that was made: from what the
        check measured already (`measured`), else its kind's floor; a compiled job is its floor plus
        the compile seconds per layer the compiled stage measured times its layers."""
        floor, rate = self.plan.floors[kind], self.report.get("compile_seconds_per_layer")
        if kind == "job-compiled" and rate is not None:
            layers = self.plan.models[model][0]["num_hidden_layers"]
            return floor + rate * layers, (f"{floor} s + {rate:.2f} s of compilation per layer (lookahead compiled "
                                           f"on {self.report['compile_model']}) x {layers} layers")
        measured = self.measured(kind, model, ranks)
        return measured if measured is not None else (floor, f"the floor for {kind}: none of its work measured yet")

    def measured(self, kind: str, model: str, ranks: int = 1) -> tuple[float, str] | None:
        """A stage's seconds by the check's own measurements: the model's load seconds and seconds per
        generated token of `generate` and of lookahead (eager/<model>, or a model of the same width
        scaled by layers), and for a torchrun job the start-up a finished job took (its wall time
        less its decodes); the stage's tokens from the plan. None while one of them is missing."""
        rates = self.decode_rates(model)
        if rates is None:
            return None
        load, gen, look, how = rates
        k, p, new = self.plan.inprocess_prompts, self.plan.prompts, self.plan.new_tokens
        if kind == "exact":       # float32: twice the bytes per token; plain, processed, constrained, sampled
            return (2 * (load + (4 * look + 3 * gen) * k * new),
                    f"2 x ({how}: load + {k} x {new} tokens of both three times and of lookahead sampled), float32")
        if kind == "profile":     # a warm-up and a profiled decode of each; the profiler's overhead: x 7
            # (x 3 gave the H200's 7B profile 17.8 s, and it took 41 s of the 42 s it was allowed)
            return load + 14 * (gen + look) * PROFILE_TOKENS, f"{how}: load + 14 x {PROFILE_TOKENS} tokens of both"
        start = self.report.get("job_start_seconds")
        if start is None or kind not in ("job", "job-batched", "lp"):
            return None
        started = f"{how}; a torchrun job's start-up {start:.1f} s"
        if kind == "job":         # lookahead and the in-run baseline
            return start + load + (gen + look) * p * new, f"{started} + load + {p} x {new} tokens of both"
        if kind == "job-batched":
            return start + load + look * p * new, f"{started} + load + {p} x {new} lookahead tokens"
        # ranks share the device: each starts, loads and decodes (float32: twice the bytes)
        return ranks * (start + load + 2 * look * k * new), f"{ranks} ranks x ({started} + load + 2 x {k} x {new})"

    def decode_rates(self, model: str) -> tuple[float, float, float, str] | None:
        """(load s, generate s/token, lookahead s/token, where from) for `model`: its eager stage's,
        or another eager-measured model's of the same hidden size, scaled by layers."""
        shape = self.plan.models[model][0]
        for other, (their, _) in self.plan.models.items():
            stage = self.stages.get(f"eager/{other}", {})
            if stage.get("status") != "ok" or their["hidden_size"] != shape["hidden_size"]:
                continue
            scale = shape["num_hidden_layers"] / their["num_hidden_layers"]
            gen, look = (stage["systems"][name] for name in ("generate eager", "lookahead eager"))
            how = f"eager/{other}" + ("" if other == model else f" x {scale:.3g} (layers)")
            return (stage["load_seconds"] * scale, scale * gen["seconds"] / gen["tokens"],
                    scale * look["seconds"] / look["tokens"], how)
        return None

    def shrink(self, model: str) -> None:
        """A compiled job that did not fit runs on the compiled stage's few-layer model instead
        (once), if that fits."""
        probe = self.report.get("compile_model")
        name = f"job-compiled/{probe}"
        if probe is None or probe == model or name in self.stages:
            return
        estimate, basis = self.estimate("job-compiled", probe)
        self.check.stage(name, estimate, lambda left: {"in_place_of": model, **self.job_compiled(probe, left)},
                         needs=["setup"], basis=f"{basis}; in place of job-compiled/{model}, which did not fit")

    # ---- helpers

    def dir(self, model: str) -> Path:
        return self.work / model

    def dtype(self, model: str) -> str:
        return self.plan.models[model][1]

    def load(self, model: str, dtype: str | None = None):
        from lp.models import load_model

        return load_model(str(self.dir(model)), dtype=dtype or self.dtype(model), device=self.dev)

    def inprocess_prompts(self, loaded) -> list[list[int]]:
        prompts = [loaded.tokenizer.encode(x) for x in self.texts[:self.plan.inprocess_prompts]]
        assert all(len(p) == self.plan.prompt_tokens for p in prompts), "the tokenizer must give one id per word"
        return prompts

    def group(self, out: dict):
        """The in-process world of one (made once; None, with the reason in out, if it cannot be)."""
        if self.comm is None and self.comm_error is None:
            self.comm = group_or_none(self.backend, self.dev, out)
            self.comm_error = out.get("process_group_error")
        elif self.comm_error:
            out["process_group_error"] = self.comm_error
        return self.comm

    def figures(self, stage: str, system: str | None = None, key: str = "token_ids"):
        """A figure of an earlier stage (None if that stage did not run or lacks it)."""
        got = self.stages.get(stage, {})
        if system is not None:
            got = got.get("systems", {}).get(system, {})
        return got.get(key)

    # ---- the stages: each returns its figures

    def setup(self, _left) -> dict:
        out = {}
        for name, (shape, dtype) in self.plan.models.items():
            t = time.perf_counter()
            model = build_model(shape, getattr(torch, dtype), torch.device(self.dev), self.plan.tiny)
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(self.dir(name))
            word_tokenizer(shape["vocab_size"]).save_pretrained(self.dir(name))
            del model
            free(self.cuda)
            self.report["models"][name] = {"dtype": dtype, "shape": shape, "parameters": params,
                                           "dir": str(self.dir(name))}
            out[name] = {"build_and_save_seconds": time.perf_counter() - t}
        return out

    def compiled(self, model: str, left: float) -> dict:
        """The compiled worker on `model`; sets the compile seconds per layer for later estimates."""
        prompt_tokens, new_tokens = self.plan.compiled_tokens
        spec = {"model_dir": str(self.dir(model)), "dtype": self.dtype(model), "device": self.dev,
                "compile": self.compile_mode, "backend": self.backend, "lookahead": self.compiled_lookahead,
                "new_tokens": new_tokens, "cache_slots": self.report["compiled_cache_slots"],
                "prompts": [prompt_ids(k, prompt_tokens, self.vocab) for k in range(self.plan.compiled_job_prompts)],
                "out": str(self.work / f"compiled-{model}.json")}
        spec_path = self.work / f"compiled-{model}.spec.json"
        spec_path.write_text(json.dumps(spec))
        log = self.work / f"compiled-{model}.log"
        timeout = None
        try:
            rc = run_child([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)], log, left)
        except StageTimeout as e:
            timeout, rc = e, None
        out = json.loads(Path(spec["out"]).read_text()) if Path(spec["out"]).exists() else {"systems": {}}
        systems = out["systems"]
        loop = systems.get("greedy loop compiled", {}).get("token_ids")
        for name, fig in systems.items():
            if name != "greedy loop compiled":
                fig["ids_equal_greedy_loop"] = equal_count(fig["token_ids"], loop)
        if "lookahead compiled" in systems:
            layers = self.plan.models[model][0]["num_hidden_layers"]
            self.report["compile_seconds_per_layer"] = systems["lookahead compiled"]["compile_seconds"] / layers
            self.report["compile_model"] = model
        out["log_tail"] = tail(log)
        if timeout is not None:
            raise StageTimeout(timeout.reason, out)
        if rc != 0:
            raise StageError(f"worker exited {rc}: " + (out["log_tail"][-1] if out["log_tail"] else ""), figures=out)
        return out

    def eager(self, model: str, _left) -> dict:
        from lp.measure.cost_model import forward_curve

        t = time.perf_counter()
        loaded = self.load(model)
        out = {"load_seconds": time.perf_counter() - t}
        comm = self.group(out)
        out["forward_curve"] = forward_curve(loaded.model, self.plan.prefix, self.plan.rows, self.plan.repeats)
        prompts, new = self.inprocess_prompts(loaded), self.plan.new_tokens
        # warm-up, untimed: each system decodes the first prompt in full, so that the timed prompts meet
        # no shape for the first time (generate attends over a new cache length every token: in the H200
        # run's job its first 156-token prompt took 83 ms per token against 30 for the next three, and a
        # 4-token warm-up left that cost in this stage's figure)
        warm = (run_generate(loaded, prompts[:1], new, self.cuda),
                run_lookahead(loaded, prompts[:1], new, self.gpu_lookahead, self.cuda, comm=comm))
        gen = run_generate(loaded, prompts[1:], new, self.cuda)
        look = run_lookahead(loaded, prompts[1:], new, self.gpu_lookahead, self.cuda, comm=comm)
        out["warm_up"] = {"prompts": 1, "generate_ms_per_forward": warm[0]["wall_ms_per_forward"],
                          "lookahead_ms_per_round": warm[1]["wall_ms_per_round"]}
        look["world_size"], look["backend"] = (comm.world, comm.backend) if comm else (1, "none")
        for system, first in zip((gen, look), warm):     # ids: every in-process prompt's, the warm-up's first
            system["token_ids"] = first["token_ids"] + system["token_ids"]
        look["ids_equal_generate"] = equal_count(look["token_ids"], gen["token_ids"])
        look["differences_from_generate"] = first_differences(loaded.model, prompts, look["token_ids"],
                                                              gen["token_ids"])
        out["systems"] = {"generate eager": gen, "lookahead eager": look}
        return out

    def exact(self, model: str, _left) -> dict:
        """float32, TF32 off: lookahead's ids against generate's, each difference explained."""
        from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

        from lp.hf_processing import row_processor_of

        loaded = self.load(model, "float32")
        prompts, new, out = self.inprocess_prompts(loaded), self.plan.new_tokens, {"dtype": "float32"}
        comm = self.group(out)
        with tf32_off() as settings:
            gen = run_generate(loaded, prompts, new, self.cuda)
            look = run_lookahead(loaded, prompts, new, self.gpu_lookahead, self.cuda, comm=comm)
            out.update(matmul=settings, ids_equal=equal_count(look["token_ids"], gen["token_ids"]),
                       differences=first_differences(loaded.model, prompts, look["token_ids"], gen["token_ids"]))
            gen_p = run_generate(loaded, prompts, new, self.cuda, PROCESSED)
            look_p = run_lookahead(loaded, prompts, new, self.gpu_lookahead, self.cuda, comm=comm, generation=PROCESSED)
            sampled = run_lookahead(loaded, prompts, new, self.gpu_lookahead, self.cuda, comm=comm, generation=SAMPLED)
            constraint = residue_constraint(loaded.model.config.vocab_size)
            gen_c = run_constrained_generate(loaded, prompts, new, self.cuda, constraint)
            look_c = run_lookahead(loaded, prompts, new, self.gpu_lookahead, self.cuda, comm=comm,
                                   row_processor=row_processor_of([PrefixConstrainedLogitsProcessor(constraint, 1)]))
        out["processors"] = {"knobs": {k: list(v) if isinstance(v, tuple) else v for k, v in PROCESSED.items()},
                             "ids_equal": equal_count(look_p["token_ids"], gen_p["token_ids"]),
                             "changed_by_them": gen_p["token_ids"] != gen["token_ids"], "S": look_p["S"],
                             "host_syncs_per_round": look_p["host_syncs_per_round"]}
        out["sampled"] = {"knobs": SAMPLED, "tokens": sampled["tokens"], "S": sampled["S"],
                          "wall_ms_per_round": sampled["wall_ms_per_round"],
                          "host_syncs_per_round": sampled["host_syncs_per_round"]}
        out["row_processor"] = {
            "what": f"prefix_allowed_tokens_fn: the last token's residue mod {CONSTRAINT_STATES} is banned",
            "ids_equal": equal_count(look_c["token_ids"], gen_c["token_ids"]),
            "changed_by_it": gen_c["token_ids"] != gen["token_ids"], "S": look_c["S"],
            "rows_per_round": look_c["rows_per_round"], "wall_ms_per_round": look_c["wall_ms_per_round"],
            "host_ms_per_round": look_c["host_ms_per_round"], "host_syncs_per_round": look_c["host_syncs_per_round"],
            "generate_ms_per_token": gen_c["ms_per_token"], "generate_host_syncs_per_token": gen_c["host_syncs_per_token"]}
        out.update(saved_dtype=self.dtype(model), rounds=look["rounds"], tokens=look["tokens"],
                   generate_token_ids=gen["token_ids"], lookahead_token_ids=look["token_ids"])
        return out

    def profile(self, model: str, _left) -> dict:
        """A few rounds of eager lookahead and of generate under torch.profiler."""
        loaded = self.load(model)
        out = {"activity": "cuda" if self.cuda else "cpu", "new_tokens": PROFILE_TOKENS}
        comm = self.group(out)
        ids = self.inprocess_prompts(loaded)[0]
        runs = {"lookahead eager": lookahead_run(loaded, ids, PROFILE_TOKENS, self.gpu_lookahead, comm=comm),
                "generate eager": generate_run(loaded, ids, PROFILE_TOKENS)}
        out["systems"] = {}
        for name, run in runs.items():
            run()   # warm-up
            out["systems"][name] = profile_system(run, self.cuda)
        return out

    def job(self, model: str, left: float, compiled: bool = False, batched: bool = False) -> dict:
        kind = "job-compiled" if compiled else "job-batched" if batched else "job"
        stage = f"{kind}-{model}"
        config = job_config(self.dir(model), self.dtype(model), self.dev, self.compile_mode if compiled else "off",
                            self.backend, self.compiled_lookahead if compiled else self.gpu_lookahead, self.plan,
                            self.prompts_path, self.work / "runs" / stage,
                            self.plan.compiled_job_prompts if compiled else None,
                            batch_size=self.plan.prompts if batched else 1)   # batched: every prompt at once
        ref = None if compiled else self.figures(f"eager/{model}", "lookahead eager")
        fig = run_job(stage, config, self.work, left, ref)
        if not compiled:     # later jobs' estimates start from the longest start-up measured
            self.report["job_start_seconds"] = max(self.report.get("job_start_seconds", 0.0), fig["start_seconds"])
        if batched:     # the batch-1 job's ids of the same prompts (exact at batch 1 and in batches alike)
            fig["ids_equal_batch_one_job"] = equal_count(fig["token_ids"], self.figures(f"job/{model}"))
        fig["ids_equal_inprocess_generate"] = equal_count(fig["token_ids"],
                                                          self.figures(f"eager/{model}", "generate eager"))
        return fig

    def job_batched(self, model: str, left: float) -> dict:
        return self.job(model, left, batched=True)

    def job_compiled(self, model: str, left: float) -> dict:
        return self.job(model, left, compiled=True)

    def lp(self, model: str, left: float, ranks: int) -> dict:
        """LP with `ranks` ranks on this one device (LP_SHARED_DEVICE=1, gloo), float32, the first
        in-process prompts: its tokens against exact/<model>'s (P = 1, float32, TF32 off)."""
        stage = f"lp-p{ranks}-{model}"
        config = job_config(self.dir(model), "float32", self.dev, "off", "gloo", self.gpu_lookahead, self.plan,
                            self.prompts_path, self.work / "runs" / stage, self.plan.inprocess_prompts,
                            baseline=False)
        fig = run_job(stage, config, self.work, left, None, procs=ranks, env={"LP_SHARED_DEVICE": "1"})
        fig["ids_equal_p1"] = equal_count(fig["token_ids"], self.figures(f"exact/{model}", key="lookahead_token_ids"))
        fig["ids_equal_generate_float32"] = equal_count(fig["token_ids"],
                                                        self.figures(f"exact/{model}", key="generate_token_ids"))
        return fig


def free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


# ---- the printed summary -----------------------------------------------------------------------------------


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render(report: dict) -> str:
    pre, la = report["preflight"], report["lookahead"]
    lines = [f"device {pre['device']}, torch {pre['torch']}, transformers {pre['transformers']}, CUDA {pre['cuda']}, "
             f"{report['backend']}, compile {report['compile_mode']}; {report['seconds']:.0f} s of a "
             f"{report['budget_s']:.0f} s budget (preflight {pre['seconds']:.0f} s)",
             f"lookahead W={la['window']} N={la['ngram']} G={la['guesses']} lookup {la['lookup_candidates']}x"
             f"{la['lookup_tokens']} (from {report['lookahead_source']}); device time: {report['device_timer']}"]
    stages = report["stages"]
    head = (f"  {'system':<38}{'tok/s':>9}{'S':>6}{'wall ms':>9}{'dev ms':>9}{'fwd dev':>9}{'launch':>8}"
            f"{'syncs':>7}{'=gen':>6}")
    for name, info in report["models"].items():
        lines.append(f"\n{name} ({info['dtype']}, {info.get('parameters', 0) / 1e6:.1f}M parameters)")
        eager = stages.get(f"eager/{name}", {})
        if eager.get("status") == "ok":
            lines.append("  forward curve (rows: ms): " + ", ".join(
                f"{p['rows']}: {1000 * p['seconds']:.2f}" for p in eager["forward_curve"]))
            warm = eager["warm_up"]
            lines.append(f"  warm-up prompt (untimed below): generate {_f(warm['generate_ms_per_forward'])} ms per "
                         f"token, lookahead {_f(warm['lookahead_ms_per_round'])} ms per round")
        compiled = stages.get(f"compiled/{name}", {}).get("systems", {})
        systems = {**eager.get("systems", {}), **compiled}
        if systems:
            lines.append(head + "   (per round; generate: per token)")
        for sys_name, f in systems.items():
            per = "round" if "rounds" in f else "forward"
            equal = f.get("ids_equal_generate") or f.get("ids_equal_greedy_loop") or "-"
            lines.append(f"  {sys_name:<38}{_f(f['tokens_per_s'], '.1f'):>9}{_f(f.get('S')):>6}"
                         f"{_f(f.get('wall_ms_per_' + per, f.get('ms_per_token'))):>9}"
                         f"{_f(f.get('device_ms_per_' + per)):>9}"
                         f"{_f(f.get('forward_device_ms', f.get('device_ms_per_forward'))):>9}"
                         f"{_f(f.get('forward_launch_ms')):>8}"
                         f"{_f(f.get('host_syncs_per_' + per, f.get('host_syncs_per_token'))):>7}{equal:>6}")
        for sys_name, f in compiled.items():
            lines.append(f"  {'':<4}{sys_name}: compiled in {_f(f.get('compile_seconds'), '.1f')} s, "
                         f"cache {f.get('cache_slots', f.get('max_cache_len'))} slots")
        profiles = {**stages.get(f"profile/{name}", {}).get("systems", {}),
                    **{k: f["profile"] for k, f in compiled.items() if "profile" in f}}
        for sys_name, f in profiles.items():
            lines.append(f"  profile {sys_name}: {_f(f['kernels_per_round'], '.0f')} kernels, "
                         f"{_f(f['kernel_ms_per_round'])} kernel ms, {_f(f['wall_ms_per_round'])} wall ms per round "
                         f"(busy {_f(f['kernel_busy'])})")
        exact = stages.get(f"exact/{name}", {})
        if exact.get("status") == "ok":
            lines.append(f"  exact (float32, TF32 off): ids = generate {exact['ids_equal']}" + "".join(
                f"; prompt {d['prompt']} differs at {d['position']} (top-2 margin {d['reference_top2_margin']:.3g})"
                for d in exact["differences"]))
            proc, sampled = exact["processors"], exact["sampled"]
            lines.append(f"  exact with generate's processors: ids = generate {proc['ids_equal']} (they changed "
                         f"generate's ids: {proc['changed_by_them']}), S {_f(proc['S'])}; sampled with its warpers: "
                         f"S {_f(sampled['S'])}, {_f(sampled['wall_ms_per_round'])} ms and "
                         f"{_f(sampled['host_syncs_per_round'])} host syncs per round")
            row = exact["row_processor"]
            lines.append(f"  exact with a prefix_allowed_tokens_fn row by row: ids = generate {row['ids_equal']} (it "
                         f"changed them: {row['changed_by_it']}), S {_f(row['S'])}, {_f(row['wall_ms_per_round'])} ms, "
                         f"{_f(row['host_ms_per_round'])} host ms and {_f(row['host_syncs_per_round'])} host syncs per "
                         f"round; generate {_f(row['generate_ms_per_token'])} ms and "
                         f"{_f(row['generate_host_syncs_per_token'])} host syncs per token")
        for stage in (f"job/{name}", f"job-batched/{name}", f"job-compiled/{name}", f"lp-p2/{name}", f"lp-p4/{name}"):
            s = stages.get(stage)
            if s and s.get("status") == "ok":
                lines += _job_lines(stage, s)
    bad = {k: v for k, v in stages.items() if v.get("status") != "ok"}
    if bad:
        lines.append("\nnot run to the end:")
        lines += [f"  {k}: {v['status']} ({v.get('reason')})" for k, v in bad.items()]
    return "\n".join(lines)


def _job_lines(stage: str, s: dict) -> list[str]:
    m = s["summary"]
    lines = [f"  {stage.split('/')[0]} (torchrun, world {m['world_size']}, {m['backend']}, compile "
             f"{s['config']['model']['compile']}): {m['prompts']} prompts, "
             f"{_f(m['tokens_per_second'], '.1f')} tok/s ({_f(s.get('tokens_per_second_after_first'), '.1f')} "
             f"after the first prompt), S {_f(m['compression'])}, ids = baseline {s['ids_equal_baseline'] or '-'}; "
             f"job {_f(m.get('job_tokens_per_second'), '.1f')} tok/s over wall, {_f(m.get('mean_batch'))} requests "
             f"and {_f(m.get('rows_per_forward'), '.1f')} rows per forward"
             + (f", ids = batch-1 job {s['ids_equal_batch_one_job']}" if "ids_equal_batch_one_job" in s else "")
             + (f", ids = P=1 (float32) {s['ids_equal_p1']}" if "ids_equal_p1" in s else "")]
    if s["config"]["baseline"]["enabled"]:
        lines.append(f"  {'':<4}generate baseline {_f(m.get('baseline_tokens_per_second'), '.1f')} tok/s "
                     f"({_f(s.get('baseline_tokens_per_second_after_first'), '.1f')}), speedup {_f(m.get('speedup'))}x; "
                     f"per round {_f(m['collectives_per_round'], '.1f')} collectives, "
                     f"{_f(m['bytes_per_round'], '.0f')} bytes, {_f(m['host_ms_per_round'])} host ms, "
                     f"{_f(m['rows_per_round'], '.1f')} rows")
    return lines


if __name__ == "__main__":
    main()
