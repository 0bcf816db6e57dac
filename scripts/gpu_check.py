"""The device check: lp's real job path on one GPU, plus the figures the job does not give, in
one run that stays inside a time budget and writes one JSON file.

    bash scripts/gpu_check.sh --out gpu_check.json                   # one CUDA GPU, < 8 minutes
    bash scripts/gpu_check.sh --small --device cpu --out check.json   # tiny shapes on the CPU (tests)

Nothing is downloaded. The check builds random-weight Llamas of two shapes (a 7B Llama in float16,
as configs/codellama-7b-humaneval.yaml runs CodeLlama-7B, and SmolLM2-135M's shape in bfloat16),
saves each with save_pretrained into a temporary directory beside a word-level tokenizer whose
vocabulary names every model id (so AutoTokenizer loads it and decoding never meets an unknown id),
and writes prompts in that vocabulary to a JSONL file. Then, stage by stage, in priority order:

1. eager/<model>: in this process, the model loaded the way a job loads it (lp.models.load_model
   of the directory); the forward-time curve (lp.measure.cost_model.forward_curve); plain
   `generate` (the baseline) and lookahead with the GPU config's `lookahead` section under a
   world-of-one process group (NCCL on CUDA, gloo on the CPU: the job's two collectives per
   round), each timed per round on the device (CUDA events recorded around the engine's round
   and forward by wrapping lp's functions from here: no sync added) against the wall clock, with
   the host syncs counted (torch.cuda.set_sync_debug_mode("warn"), one warning per sync);
2. job/<model>: `python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m lp.run
   --config job.yaml`, world size 1 (the process group and its collectives are real), the GPU
   config's candidates, the in-run generate baseline; its summary.json and results.jsonl;
3. job-compiled/<model>: the same job with `model.compile: reduce-overhead` (CUDA graphs; the
   CPU run uses `default`); its first prompt holds the compilation, so tokens/s after the first
   prompt are given too;
4. compiled/<model>: in a worker process, lookahead and a static-cache greedy loop
   (lookahead_generate with LookaheadParams(0, 3, 0), as scripts/bench_core.py runs it) compiled
   the same way, after an untimed pass that compiles every round shape, timed and counted as in 1.

A stage is skipped, with the reason recorded, when the time left in the budget (--budget-s) is
below its estimate; a stage in a subprocess is stopped when the budget runs out, and a watchdog
ends the whole check HARD_STOP_S seconds later (a stage in this process cannot be stopped
otherwise). The JSON is rewritten after every stage. Random weights
make S (tokens per round) meaningless; time per round, device time against wall time, host
syncs, the forward-time curve and whether the ids equal plain greedy decoding's are not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import random
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

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = ROOT / "configs" / "codellama-7b-humaneval.yaml"   # the shipped GPU setting

SHAPES = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
}
SMALL_SHAPES = {   # the same two kinds of attention (full heads; grouped K/V heads) in miniature
    "tiny-llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=512),
    "tiny-smol": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=384, tie_word_embeddings=True),
}


@dataclasses.dataclass
class Plan:
    """What one run of the check does."""
    models: dict            # name -> (shape, dtype)
    compiled_models: list   # models whose compiled stages run, in priority order
    prompts: int            # prompts in the JSONL file (the jobs decode them all)
    prompt_tokens: int
    new_tokens: int
    inprocess_prompts: int  # the first k prompts, decoded in process (eager and compiled)
    compiled_job_prompts: int | None   # the compiled jobs' data.limit (None: every prompt)
    rows: list
    prefix: int
    repeats: int
    # the compiled stages' `lookahead` section; None: the GPU config's
    compiled_lookahead: dict | None = None
    estimates: dict = dataclasses.field(default_factory=dict)   # stage kind -> seconds it needs at least
    tiny: bool = False      # tiny shapes: larger initial weights (see build_model)


# 96 + 156 tokens: lp's static cache then has 512 slots for the GPU config's lookahead (prompt +
# new tokens + 256 for its largest round) and for the greedy loop (+ 8) alike, so the compiled
# greedy loop adds one round shape (8 rows) to those lookahead compiles, not a second cache length
FULL = Plan(
    models={"llama-7b": (SHAPES["llama-7b"], "float16"), "smollm2-135m": (SHAPES["smollm2-135m"], "bfloat16")},
    compiled_models=["llama-7b", "smollm2-135m"],
    prompts=4, prompt_tokens=96, new_tokens=156, inprocess_prompts=2, compiled_job_prompts=None,
    rows=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], prefix=512, repeats=5,
    estimates={"eager": 45, "job": 45, "job-batched": 45, "job-compiled": 90, "compiled": 90},
)
# tiny shapes and few tokens: the CPU smoke run of the tests. The float32 model is the one whose
# ids can be asserted (lower precision legitimately flips near-tied argmaxes between the packed
# rounds, generate and compiled kernels). Compilation dominates on a CPU, so the compiled stages
# decode one 4-token prompt with a candidate set whose every round fits 8 rows: one compiled graph
# serves the compiled lookahead, the compiled greedy loop and (from inductor's on-disk cache)
# the compiled job.
SMALL = Plan(
    models={"tiny-llama": (SMALL_SHAPES["tiny-llama"], "float16"), "tiny-smol": (SMALL_SHAPES["tiny-smol"], "float32")},
    compiled_models=["tiny-smol"],
    prompts=3, prompt_tokens=4, new_tokens=12, inprocess_prompts=2, compiled_job_prompts=1,
    rows=[1, 2, 4, 8, 16], prefix=32, repeats=2,
    compiled_lookahead=dict(window=0, ngram=3, guesses=1, pool_seeding=True, lookup_candidates=1,
                            lookup_tokens=2, lookup_ngram=2),
    estimates={"eager": 5, "job": 15, "job-batched": 15, "job-compiled": 20, "compiled": 30}, tiny=True,
)
STAGE_KINDS = ("eager", "job", "job-batched", "job-compiled", "compiled")
HARD_STOP_S = 40   # past the budget by this much the whole check ends (420 + 40 s: inside 8 minutes)
GREEDY_LOOP = dict(window=0, ngram=3, guesses=0, pool_seeding=False, lookup_candidates=0)
SYNC_WARNING = "synchronizing CUDA operation"   # torch.cuda.set_sync_debug_mode("warn")'s message
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "TORCHELASTIC_RUN_ID")


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


def run_generate(loaded, prompts: list[list[int]], new_tokens: int, cuda: bool) -> dict:
    """Plain greedy `generate` (lp.baseline, the jobs' baseline), timed per forward."""
    from lp.baseline import autoregressive_generate
    from lp.engine import GenerationParams

    marks, out, results = Marks(cuda), {}, []
    times = ForwardTimes(marks)
    sync(cuda)
    with times.hooked(loaded.model), counted_syncs(cuda, out):
        for ids in prompts:
            results.append(autoregressive_generate(loaded.model, ids, GenerationParams(new_tokens),
                                                   eos_token_ids=loaded.eos_token_ids))
    sync(cuda)
    tokens = sum(r.new_tokens for r in results)
    seconds = sum(r.decode_seconds for r in results)
    fig = {"prompts": len(results), "tokens": tokens, "forwards": tokens, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "wall_ms_per_forward": 1000 * seconds / tokens, **times.figures()}
    fig["device_busy"] = fig.get("device_ms_per_forward", 0) / fig["wall_ms_per_forward"]
    fig.update(out)
    fig["host_syncs_per_forward"] = None if out["host_syncs"] is None else out["host_syncs"] / tokens
    fig["token_ids"] = [r.token_ids for r in results]
    return fig


def run_lookahead(loaded, prompts: list[list[int]], new_tokens: int, params: dict, cuda: bool,
                  compile_mode: str = "off", comm=None) -> dict:
    """lookahead_generate over `prompts`, each round timed on the device and against the wall."""
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate

    marks, out, results = Marks(cuda), {}, []
    times = RoundTimes(marks)
    sync(cuda)
    with times.patched(), counted_syncs(cuda, out):
        for k, ids in enumerate(prompts):
            results.append(lookahead_generate(loaded.model, ids, LookaheadParams(**params),
                                              GenerationParams(new_tokens), eos_token_ids=loaded.eos_token_ids,
                                              tokenizer=loaded.tokenizer, comm=comm, request=k,
                                              compile_mode=compile_mode))
    sync(cuda)
    tokens = sum(r.new_tokens for r in results)
    rounds = sum(r.forwards for r in results)
    seconds = sum(r.decode_seconds for r in results)
    fig = {"prompts": len(results), "tokens": tokens, "rounds": rounds, "S": tokens / rounds, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "wall_ms_per_round": 1000 * seconds / rounds,
           "host_ms_per_round": 1000 * sum(r.host_seconds for r in results) / rounds,
           "rows_per_round": sum(sum(r.rows_per_round) for r in results) / rounds,
           "collectives_per_round": sum(r.collectives for r in results) / rounds, **times.figures()}
    fig["device_busy"] = fig.get("device_ms_per_round", 0) / fig["wall_ms_per_round"]
    fig.update(out)
    fig["host_syncs_per_round"] = None if out["host_syncs"] is None else out["host_syncs"] / rounds
    fig["token_ids"] = [r.token_ids for r in results]
    return fig


def world_of_one(backend: str, device: str):
    """A real process group of one rank, set up the way lp.run sets it up under torchrun
    (lp.parallel.dist.init_distributed), so the engine runs its two collectives per round."""
    from lp.parallel.dist import init_distributed

    saved = {k: os.environ.get(k) for k in DIST_ENV}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    try:
        return init_distributed(backend, 120.0, device)
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
        out["process_group_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        with contextlib.suppress(Exception):
            shutdown()
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compiled_worker(spec_path: str) -> None:
    """The compiled stage (a subprocess, so the budget can stop it): per system an untimed pass
    that compiles every round shape, then the timed pass; the figures so far are rewritten to
    spec['out'] after each system, so a stopped worker still leaves them."""
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
    from lp.models import load_model
    from lp.parallel.dist import shutdown

    spec = json.loads(Path(spec_path).read_text())
    cuda = spec["device"].startswith("cuda")
    t = time.perf_counter()
    loaded = load_model(spec["model_dir"], dtype=spec["dtype"], device=spec["device"])
    figures = {"load_seconds": time.perf_counter() - t, "compile_mode": spec["compile"], "systems": {}}
    comm = group_or_none(spec["backend"], spec["device"], figures)
    # lookahead as the job runs it (a world of one: its two collectives per round); the greedy
    # loop, a baseline like generate, without collectives
    systems = [("lookahead compiled", spec["lookahead"], comm), ("greedy loop compiled", GREEDY_LOOP, None)]
    prompts, new = spec["prompts"], spec["new_tokens"]
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
            fig.update(warmup_seconds=warm, lookahead=params, world_size=group.world if group else 1,
                       backend=group.backend if group else "none")
            figures["systems"][name] = fig
            figures["dynamo_counters"] = dynamo_counters()
            tmp = Path(spec["out"] + ".tmp")
            tmp.write_text(json.dumps(figures))
            os.replace(tmp, spec["out"])    # whole or not at all: the budget may stop this process
    finally:
        shutdown()


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


def child_env() -> dict:
    """This environment for a child: lp importable from this tree, no hub access, none of a process
    group's variables (torchrun sets its own); on the CPU one torch thread (see main)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if torch.get_num_threads() == 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def run_child(cmd: list[str], log: Path, timeout: float) -> int:
    """Run `cmd`, output to `log`; past `timeout` seconds it and every process it started are
    stopped (SIGTERM, then SIGKILL 10 s later) and StageTimeout raised. torchrun starts its workers
    in sessions of their own, so they are found by parentage, not by process group."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            pids = [proc.pid, *descendants(proc.pid)]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.2)
                if not any(_alive(pid) for pid in pids):
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            raise StageTimeout(f"stopped when the budget ran out, after {timeout:.0f} s") from None


def descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"   # zombie: exited
    except (OSError, IndexError):
        return False


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# ---- the torchrun job ----------------------------------------------------------------------------------


def job_config(model_dir: Path, dtype: str, device: str, compile_mode: str, backend: str, lookahead: dict,
               plan: Plan, prompts: Path, out_dir: Path, limit: int | None, batch_size: int = 1) -> dict:
    return {
        "model": {"name": str(model_dir), "dtype": dtype, "device": device, "compile": compile_mode},
        "lookahead": lookahead,
        "generation": {"method": "lookahead", "max_new_tokens": plan.new_tokens, "stop": [],
                       "batch_size": batch_size},
        "data": {"source": "jsonl", "path": str(prompts), "offset": 0, "limit": limit},
        "output": {"dir": str(out_dir)},
        "distributed": {"backend": backend, "timeout_s": 120},
        "baseline": {"enabled": batch_size == 1},    # the in-run baseline times one prompt at a time
    }


def run_job(name: str, config: dict, work: Path, timeout: float, reference: list | None) -> dict:
    """torchrun, world size 1, `python3 -m lp.run` on `config`; what its output directory says."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = work / f"{name}.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "lp.run", "--config", str(path), "--quiet"]
    t = time.perf_counter()
    fig = {"command": " ".join(cmd[1:]), "config": config}
    out_dir = Path(config["output"]["dir"])
    try:
        rc = run_child(cmd, log, timeout)
    except StageTimeout as e:     # keep the prompts it finished
        fig.update(log_tail=tail(log), records_so_far=_record_figures(out_dir))
        raise StageTimeout(e.reason, fig) from None
    fig.update(returncode=rc, wall_seconds=time.perf_counter() - t, log_tail=tail(log))
    summary_path = out_dir / "summary.json"
    if rc != 0 or not summary_path.exists():
        fig["records_so_far"] = _record_figures(out_dir)
        raise StageError(f"torchrun exited {rc}" + ("" if summary_path.exists() else ", no summary.json")
                         + (": " + fig["log_tail"][-1] if fig["log_tail"] else ""), figures=fig)
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

    def stage(self, name: str, estimate: float, fn, needs: list[str] = ()):
        """Run fn(seconds left) as stage `name` unless the budget or a failed prerequisite says no."""
        missing = [n for n in needs if self.report["stages"].get(n, {}).get("status") != "ok"]
        reason = (f"{', '.join(missing)} did not succeed" if missing else None) or self.skip_reason(estimate)
        record = {"status": "skipped", "reason": reason} if reason else None
        if record is None:
            click.echo(f"[{self.elapsed():5.0f} s] {name} ...", err=True)
            t = time.perf_counter()
            self.running = name
            try:
                record = {"status": "ok", **fn(self.left())}
            except StageError as e:
                record = {"status": e.status, "reason": e.reason, **e.figures}
            except Exception as e:  # noqa: BLE001  (a failed stage is a finding; the check goes on)
                record = {"status": "failed", "reason": f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"}
            record["seconds"] = time.perf_counter() - t
            self.running = None
            free(self.cuda)   # whatever a failed stage left behind, before the next one
        else:
            click.echo(f"[{self.elapsed():5.0f} s] {name}: skipped ({reason})", err=True)
        self.report["stages"][name] = record
        self.save()
        return record

    def save(self) -> None:
        self.report["seconds"] = self.elapsed()
        tmp = self.out_path.with_name(self.out_path.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1))
        os.replace(tmp, self.out_path)


def equal_count(ids: list, reference: list | None) -> str | None:
    if not reference:
        return None
    pairs = list(zip(ids, reference))
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


@click.command()
@click.option("--out", "out_path", default="gpu_check.json", show_default=True, type=click.Path(dir_okay=False))
@click.option("--small", is_flag=True, help="tiny shapes, few tokens: the smoke run of the tests (CPU or GPU)")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cuda", "cpu"]))
@click.option("--budget-s", default=420.0, show_default=True,
              help="stages that would not fit in this many seconds are skipped; subprocesses are stopped at it")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="where models, prompts and job directories go (default: a new temporary directory)")
@click.option("--keep", is_flag=True, help="keep the work directory (default: removed at the end)")
@click.option("--stages", default=",".join(STAGE_KINDS), show_default=True,
              help="the kinds of stage to run (the models are always built), e.g. job-compiled,compiled")
@click.option("--models", "only_models", default="", help="run these models only (comma-separated; default: all)")
@click.option("--worker", type=click.Path(dir_okay=False), default=None, hidden=True)
def main(out_path, small, device, budget_s, work_dir, keep, stages, only_models, worker):
    if worker:   # the compiled stage's subprocess (OMP_NUM_THREADS comes from the parent)
        return compiled_worker(worker)
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
                                   compiled_models=[m for m in plan.compiled_models if m in names])
    dev = "cuda" if cuda else "cpu"
    if not cuda:   # tiny forwards on a shared CPU: more threads only wait for each other
        torch.set_num_threads(1)
    compile_mode = "reduce-overhead" if cuda else "default"   # CUDA graphs need CUDA
    backend = "nccl" if cuda else "gloo"
    from lp.jobs.config import load_config

    gpu_lookahead = dataclasses.asdict(load_config(GPU_CONFIG).lookahead)
    compiled_lookahead = plan.compiled_lookahead or gpu_lookahead
    import transformers

    report = {
        "check": "lp gpu_check", "small": small, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "budget_s": budget_s, "stage_kinds": kinds, "compile_mode": compile_mode, "backend": backend,
        "device_timer": "CUDA events" if cuda else "host clock (the CPU is the device)",
        "host_syncs": ("counted with torch.cuda.set_sync_debug_mode('warn') (it does not cover torch.distributed)"
                       if cuda else "not applicable: no CUDA device (nothing to synchronize with)"),
        "lookahead": gpu_lookahead, "lookahead_source": str(GPU_CONFIG.relative_to(ROOT)),
        "compiled_lookahead": compiled_lookahead,
        "workload": {"prompts": plan.prompts, "prompt_tokens": plan.prompt_tokens, "new_tokens": plan.new_tokens,
                     "inprocess_prompts": plan.inprocess_prompts, "compiled_job_prompts": plan.compiled_job_prompts},
        "models": {},
    }
    check = Check(Path(out_path), budget_s, report, cuda)
    work = Path(work_dir).resolve() if work_dir else Path(tempfile.mkdtemp(prefix="lp-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if not keep and not work_dir:
        check.cleanup = lambda: shutil.rmtree(work, ignore_errors=True)
    watchdog = check.watchdog(budget_s + HARD_STOP_S)
    try:
        _run(check, plan, kinds, work, dev, cuda, compile_mode, backend, gpu_lookahead, compiled_lookahead)
    finally:
        watchdog.cancel()
        check.save()
        check.cleanup()
    click.echo(render(report))
    click.echo(f"wrote {out_path} in {report['seconds']:.0f} s")


def _run(check, plan, kinds, work, dev, cuda, compile_mode, backend, gpu_lookahead, compiled_lookahead):
    report = check.report
    prompts_path = work / "prompts.jsonl"
    vocab = min(shape["vocab_size"] for shape, _ in plan.models.values())   # every model knows these words
    texts = write_prompts(prompts_path, plan, vocab)
    report["prompts_file"] = str(prompts_path)

    def setup(_left):
        out = {}
        for name, (shape, dtype) in plan.models.items():
            t = time.perf_counter()
            model = build_model(shape, getattr(torch, dtype), torch.device(dev), plan.tiny)
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(work / name)
            word_tokenizer(shape["vocab_size"]).save_pretrained(work / name)
            del model
            free(cuda)
            report["models"][name] = {"dtype": dtype, "shape": shape, "parameters": params, "dir": str(work / name)}
            out[name] = {"build_and_save_seconds": time.perf_counter() - t}
        return out

    if check.stage("setup", 0, setup)["status"] != "ok":
        return

    inprocess: dict[str, dict] = {}     # model -> eager figures (their ids are the references)
    comm = None

    def eager(name):
        def run(_left):
            nonlocal comm
            from lp.measure.cost_model import forward_curve
            from lp.models import load_model

            _, dtype = plan.models[name]
            t = time.perf_counter()
            loaded = load_model(str(work / name), dtype=dtype, device=dev)
            out = {"load_seconds": time.perf_counter() - t}
            if comm is None:
                comm = group_or_none(backend, dev, out)
            out["forward_curve"] = forward_curve(loaded.model, plan.prefix, plan.rows, plan.repeats)
            prompts = [loaded.tokenizer.encode(x) for x in texts[:plan.inprocess_prompts]]
            assert all(len(p) == plan.prompt_tokens for p in prompts), "the tokenizer must give one id per word"
            run_generate(loaded, prompts[:1], 4, cuda)                      # warm-up: first CUDA calls
            run_lookahead(loaded, prompts[:1], 4, gpu_lookahead, cuda, comm=comm)
            gen = run_generate(loaded, prompts, plan.new_tokens, cuda)
            look = run_lookahead(loaded, prompts, plan.new_tokens, gpu_lookahead, cuda, comm=comm)
            look["world_size"], look["backend"] = (comm.world, comm.backend) if comm else (1, "none")
            look["ids_equal_generate"] = equal_count(look["token_ids"], gen["token_ids"])
            out["systems"] = {"generate eager": gen, "lookahead eager": look}
            inprocess[name] = out
            del loaded
            free(cuda)
            return out
        return run

    for name in plan.models if "eager" in kinds else ():
        check.stage(f"eager/{name}", plan.estimates["eager"], eager(name), needs=["setup"])
    if comm is not None:
        from lp.parallel.dist import shutdown

        shutdown()
        free(cuda)

    def job(name, compiled, batched=False):
        def run(left):
            _, dtype = plan.models[name]
            stage = f"job-compiled-{name}" if compiled else f"job-batched-{name}" if batched else f"job-{name}"
            config = job_config(work / name, dtype, dev, compile_mode if compiled else "off", backend,
                                compiled_lookahead if compiled else gpu_lookahead, plan, prompts_path,
                                work / "runs" / stage, plan.compiled_job_prompts if compiled else None,
                                batch_size=plan.prompts if batched else 1)   # batched: every prompt at once
            ref = inprocess.get(name, {}).get("systems", {}).get("lookahead eager", {}).get("token_ids")
            fig = run_job(stage, config, work, left, None if compiled else ref)
            if batched:     # the batch-1 job's ids of the same prompts (exact at batch 1 and in batches alike)
                one = check.report["stages"].get(f"job/{name}", {}).get("token_ids")
                fig["ids_equal_batch_one_job"] = equal_count(fig["token_ids"], one)
            gen = inprocess.get(name, {}).get("systems", {}).get("generate eager", {}).get("token_ids")
            fig["ids_equal_inprocess_generate"] = equal_count(fig["token_ids"], gen)
            return fig
        return run

    for name in plan.models if "job" in kinds else ():
        check.stage(f"job/{name}", plan.estimates["job"], job(name, False), needs=["setup"])
    for name in plan.models if "job-batched" in kinds else ():
        check.stage(f"job-batched/{name}", plan.estimates["job-batched"], job(name, False, batched=True),
                    needs=["setup"])

    def compiled(name):
        def run(left):
            _, dtype = plan.models[name]
            spec = {"model_dir": str(work / name), "dtype": dtype, "device": dev, "compile": compile_mode,
                    "backend": backend, "lookahead": compiled_lookahead, "new_tokens": plan.new_tokens,
                    "prompts": [prompt_ids(k, plan.prompt_tokens, vocab)
                                for k in range(plan.compiled_job_prompts or plan.inprocess_prompts)],
                    "out": str(work / f"compiled-{name}.json")}
            spec_path = work / f"compiled-{name}.spec.json"
            spec_path.write_text(json.dumps(spec))
            log = work / f"compiled-{name}.log"
            timeout = None
            try:
                rc = run_child([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)], log, left)
            except StageTimeout as e:
                timeout, rc = e, None
            out = json.loads(Path(spec["out"]).read_text()) if Path(spec["out"]).exists() else {"systems": {}}
            eager_systems = inprocess.get(name, {}).get("systems", {})
            for fig in out["systems"].values():
                k = len(fig["token_ids"])
                for ref_name, key in (("generate eager", "ids_equal_generate"),
                                      ("lookahead eager", "ids_equal_lookahead_eager")):
                    ref = eager_systems.get(ref_name, {}).get("token_ids")
                    fig[key] = equal_count(fig["token_ids"], ref[:k] if ref else None)
            out["log_tail"] = tail(log)
            if timeout is not None:
                raise StageTimeout(timeout.reason, out)
            if rc != 0:
                raise StageError(f"worker exited {rc}: " + (out["log_tail"][-1] if out["log_tail"] else ""),
                                 figures=out)
            return out
        return run

    for name in plan.compiled_models:
        if "job-compiled" in kinds:
            check.stage(f"job-compiled/{name}", plan.estimates["job-compiled"], job(name, True), needs=["setup"])
        if "compiled" in kinds:
            check.stage(f"compiled/{name}", plan.estimates["compiled"], compiled(name), needs=["setup"])


def free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


# ---- the printed summary -----------------------------------------------------------------------------------


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render(report: dict) -> str:
    la = report["lookahead"]
    lines = [f"device {report['device']}, torch {report['torch']}, transformers {report['transformers']}, "
             f"{report['backend']}, compile {report['compile_mode']}; {report['seconds']:.0f} s of a "
             f"{report['budget_s']:.0f} s budget",
             f"lookahead W={la['window']} N={la['ngram']} G={la['guesses']} lookup {la['lookup_candidates']}x"
             f"{la['lookup_tokens']} (from {report['lookahead_source']}); device time: {report['device_timer']}"]
    stages = report["stages"]
    head = (f"  {'system':<26}{'tok/s':>9}{'S':>6}{'wall ms':>9}{'dev ms':>9}{'fwd dev':>9}{'launch':>8}"
            f"{'syncs':>7}{'=gen':>6}")
    for name, info in report["models"].items():
        lines.append(f"\n{name} ({info['dtype']}, {info.get('parameters', 0) / 1e6:.1f}M parameters)")
        eager = stages.get(f"eager/{name}", {})
        if eager.get("status") == "ok":
            lines.append("  forward curve (rows: ms): " + ", ".join(
                f"{p['rows']}: {1000 * p['seconds']:.2f}" for p in eager["forward_curve"]))
        systems = dict(eager.get("systems", {}))
        systems.update(stages.get(f"compiled/{name}", {}).get("systems", {}))
        if systems:
            lines.append(head + "   (per round; generate: per token)")
        for sys_name, f in systems.items():
            per = "round" if "rounds" in f else "forward"
            lines.append(f"  {sys_name:<26}{_f(f['tokens_per_s'], '.1f'):>9}{_f(f.get('S')):>6}"
                         f"{_f(f.get('wall_ms_per_' + per)):>9}{_f(f.get('device_ms_per_' + per)):>9}"
                         f"{_f(f.get('forward_device_ms', f.get('device_ms_per_forward'))):>9}"
                         f"{_f(f.get('forward_launch_ms')):>8}{_f(f.get('host_syncs_per_' + per)):>7}"
                         f"{f.get('ids_equal_generate') or '-':>6}")
        for stage in (f"job/{name}", f"job-batched/{name}", f"job-compiled/{name}"):
            s = stages.get(stage)
            if s and s.get("status") == "ok":
                m, after = s["summary"], "after the first prompt"
                lines.append(
                    f"  {stage.split('/')[0]} (torchrun, world {m['world_size']}, {m['backend']}, compile "
                    f"{s['config']['model']['compile']}): {m['prompts']} prompts, "
                    f"{_f(m['tokens_per_second'], '.1f')} tok/s ({_f(s.get('tokens_per_second_after_first'), '.1f')} "
                    f"{after}), S {_f(m['compression'])}, ids = baseline {s['ids_equal_baseline'] or '-'}; job "
                    f"{_f(m.get('job_tokens_per_second'), '.1f')} tok/s over wall, {_f(m.get('mean_batch'))} requests "
                    f"and {_f(m.get('rows_per_forward'), '.1f')} rows per forward"
                    + (f", ids = batch-1 job {s['ids_equal_batch_one_job']}" if "ids_equal_batch_one_job" in s else ""))
                lines.append(
                    f"  {'':<4}generate baseline {_f(m.get('baseline_tokens_per_second'), '.1f')} tok/s "
                    f"({_f(s.get('baseline_tokens_per_second_after_first'), '.1f')}), speedup {_f(m.get('speedup'))}x; "
                    f"per round {_f(m['collectives_per_round'], '.1f')} collectives, "
                    f"{_f(m['bytes_per_round'], '.0f')} bytes, {_f(m['host_ms_per_round'])} host ms, "
                    f"{_f(m['rows_per_round'], '.1f')} rows")
    bad = {k: v for k, v in stages.items() if v.get("status") != "ok"}
    if bad:
        lines.append("\nnot run to the end:")
        lines += [f"  {k}: {v['status']} ({v.get('reason')})" for k, v in bad.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
