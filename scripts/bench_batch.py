"""Batched decoding benchmark (issue 21): job throughput of transformers' static batches, transformers'
continuous batching and lp's continuous batching (lp.engine.decode_batch) without and with drafts, in one run
on one loaded model.

The prompts, the model and the decoding are a job's (`--config`, a job YAML read with
lp.jobs.config.load_config, `--set section.key=value` overrides as `python -m lp.run` takes them): the
job's prompt ids (chat mode by default), its stop strings, `generation.max_new_tokens` and the model's
EOS ids, greedy only. Every system decodes every prompt; it is timed over the whole set (wall seconds
from the first prompt's start to the last one's end), and only useful tokens count: a prompt's ids up to
and including the token that completes a stop string or EOS, cut exactly as lp cuts them
(lp.decode.stopping.StopChecker on the generated ids).

- `generate k`: transformers `generate` at each static batch size k (`--generate-batches`): the
  prompts in task order, k at a time, left-padded with an attention mask, `stop_strings` and EOS; a
  batch runs until all its sequences stop. A prompt's latency is its batch's wall time.
- `transformers CB B`: transformers' own continuous batching (the ContinuousBatchingManager behind
  `model.generate_batch`) with at most B requests per step (`--cb-batches`, default `--batches`). It
  has no stop strings, so its outputs are streamed and a request is cancelled as soon as its ids
  complete one (the manager may run a step or two past it; those tokens do not count). Timed from the
  first request added to the last one ended, the manager's set-up (cache allocation) left out;
  latency: from a request's scheduling to its end. When it cannot run, one line says why.
- `lp no drafts B` (window 0, no pool guesses, no lookup, no suffix drafts: one row per request and
  forward) and `lp lookahead B` (the job's `lookahead` section) at each B of `--batches`, through
  decode_batch as a batched job runs them: requests join in task order as slots free up, and with
  `lookahead.job_cache` each result's ids are added to the job-wide index as it ends. Latency: a
  request's decode_seconds (its first round to its last).
  `--no-drafts-batches` sets the no-drafts batch sizes apart ('none': leave them out).

Columns: tokens/s (useful tokens over the wall time), latency p50, p95 and mean (seconds, over the prompts),
S (useful tokens / request-forwards: each prompt's forwards summed; a static batch keeps a prompt in
every forward of its batch, so S falls below 1 there once sequences stop early), rows per forward
(rows fed, padding included), rows per decoding round (lp: the same with the prefill rounds left
out), mean batch (requests per forward), admitted (the summed latencies over the wall time: the
requests in the system on average, Little's law) and ids equal (prompts whose ids equal
`generate 1`'s, the reference). Then the ratios: the best `lp lookahead` tokens/s over the best
`generate` one, `lp lookahead` over `lp no drafts` at every B, and `lp lookahead`'s p50 and mean latency
at every B over its own at B=1. The mean is the one Little's law ties to throughput: the summed latencies
are the run's wall time times the requests admitted on average (`admitted`: decoding, or waiting out a
join's prefill; a little above mean batch), so mean latency at B over B=1's is (admitted at B / admitted
at B=1) x (B=1's tokens/s) / (B's tokens/s) (docs/benchmarks.md, "All 164 prompts, every system, one run").

One untimed warm-up runs first (short `generate` runs of one prompt and of two padded ones, short
decode_batch runs of one prompt and of the first max(--batches) together), and a short transformers CB
run before that system's first timed one; then the systems run once each in a fixed order (generate,
lp no drafts, lp lookahead, transformers CB last, so that its attention switch cannot touch the
others). The figures are only comparable within one run on a quiet machine.

`--limit N` sets data.limit; every prompt of the source (164 for HumanEval) is `--set data.limit=null`
(read as YAML null by load_config: no limit).

    python scripts/bench_batch.py                                   # the default job: 20 HumanEval prompts
    python scripts/bench_batch.py --set data.limit=null --json runs/bench_batch.json   # all 164 prompts
    python scripts/bench_batch.py --limit 3 --set generation.max_new_tokens=32 --batches 1,2 --generate-batches 1,2
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch

from bench_util import writable_file
from lp.decode.arch import position_limit
from lp.decode.propose import job_cache
from lp.decode.stopping import StopChecker
from lp.engine import BatchStats, LookaheadParams, decode_batch
from lp.jobs.config import ConfigError, load_config
from lp.jobs.data import DataError, load_prompts, request_id
from lp.jobs.runner import encode_prompt, measure_costs
from lp.measure.cost_model import budget_kwargs
from lp.jobs.summary import percentile
from lp.models import ModelLoadError, load_model

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "humaneval-smollm2.yaml"


def sizes(text: str, option: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (each >= 1, no repeats)."""
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1 or len(set(out)) != len(out):
        raise click.BadParameter(f"{text!r}: expected batch sizes >= 1 separated by ',' (e.g. 1,2,4)",
                                 param_hint=option)
    return out


class Forwards:
    """Counts the model's forwards, the rows they fed (batch x length, padding included) and their batch rows."""

    def __init__(self, model):
        self.model, self.count, self.rows, self.batch, self.handle = model, 0, 0, 0, None

    def _hook(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.count += 1
        if ids is not None:
            self.rows += ids.numel()
            self.batch += ids.shape[0]

    def __enter__(self):
        self.count = self.rows = self.batch = 0
        self.handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class Bench:
    """The job's prompts on one loaded model, and the figures of every system run on them."""

    def __init__(self, cfg, loaded, prompts: list[dict]):
        self.cfg, self.loaded, self.prompts = cfg, loaded, prompts
        self.model, self.tok, self.eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
        self.gen = cfg.generation
        self.longest = max(len(p["ids"]) for p in prompts)
        self.systems: list[dict[str, Any]] = []
        self.reference: list[list[int]] | None = None    # generate 1's ids, per prompt in task order

    def cut(self, prompt, ids) -> list[int]:
        """The useful tokens of a generated sequence: up to and including the token that ends it, as lp ends it."""
        checker = StopChecker(self.eos, self.gen.max_new_tokens, self.gen.stop, self.tok, context=prompt)
        out = []
        for token in ids:
            out.append(int(token))
            if checker.push(int(token)) is not None:
                break
        return out

    def record(self, system: str, kind: str, batch: int, ids: list[list[int] | None], seconds: float,
               latency: list[float], request_forwards: int | None, rows: int | None, forwards: int | None,
               occupancy: int | None, **extra) -> dict[str, Any]:
        tokens = sum(len(x) for x in ids if x is not None)
        row = dict(system=system, kind=kind, batch=batch, tokens=tokens, seconds=seconds,
                   tokens_per_s=tokens / seconds if seconds > 0 else None,
                   latency_p50=percentile(latency, 50), latency_p95=percentile(latency, 95),
                   latency_mean=sum(latency) / len(latency) if latency else None, latencies=latency,
                   admitted=sum(latency) / seconds if seconds > 0 else None,
                   compression=tokens / request_forwards if request_forwards else None,
                   forwards=forwards, rows_per_forward=rows / forwards if forwards and rows is not None else None,
                   mean_batch=occupancy / forwards if forwards and occupancy is not None else None,
                   ids_equal=None, ids={p["task_id"]: x for p, x in zip(self.prompts, ids)}, **extra)
        if self.reference is None and kind == "generate" and batch == 1:
            self.reference = ids
        row["ids_equal"] = sum(x is not None and x == r for x, r in zip(ids, self.reference))
        self.systems.append(row)
        click.echo(f"  {system}: {tokens} tokens in {seconds:.2f} s, {row['ids_equal']}/{len(ids)} ids equal",
                   err=True)
        return row

    def stopping(self) -> dict[str, Any]:
        """generate's stop-string arguments (none without stop strings)."""
        return dict(stop_strings=list(self.gen.stop), tokenizer=self.tok) if self.gen.stop else {}

    def padded(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids (EOS as the pad) and their attention mask."""
        width, pad = max(map(len, batch)), self.eos[0]
        x = torch.tensor([[pad] * (width - len(b)) + b for b in batch], device=self.model.device)
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=self.model.device)
        return x, mask

    def warm_up(self, lookahead: LookaheadParams, batch: int) -> None:
        """Untimed: a short generate of one prompt and of two left-padded ones, and a short decode_batch of the
        first prompt alone and of the first `batch` prompts together (the batched paths, not only batch 1)."""
        warm = dataclasses.replace(self.gen, max_new_tokens=min(8, self.gen.max_new_tokens))
        for group in (self.prompts[:1], self.prompts[:2]):
            x, mask = self.padded([p["ids"] for p in group])
            self.model.generate(x, attention_mask=mask, max_new_tokens=warm.max_new_tokens, do_sample=False,
                                eos_token_id=self.eos, pad_token_id=self.eos[0], **self.stopping())
        for group in (self.prompts[:1], self.prompts[:batch]):
            for _ in decode_batch(self.model, [(i, p["ids"], i) for i, p in enumerate(group)], lookahead, warm,
                                  batch_size=len(group), prompt_tokens=self.longest, eos_token_ids=self.eos,
                                  tokenizer=self.tok, compile_mode=self.cfg.model.compile):
                pass

    # ---- the systems -----------------------------------------------------------------------------------

    def generate(self, k: int) -> dict[str, Any]:
        ids: list[list[int]] = []
        latency: list[float] = []
        seconds, request_forwards = 0.0, 0
        pad = self.eos[0]
        with Forwards(self.model) as counter:
            for start in range(0, len(self.prompts), k):
                batch = [p["ids"] for p in self.prompts[start:start + k]]
                x, mask = self.padded(batch)
                width = x.shape[1]
                before = counter.count
                t0 = time.perf_counter()
                out = self.model.generate(x, attention_mask=mask, max_new_tokens=self.gen.max_new_tokens,
                                          do_sample=False, eos_token_id=self.eos, pad_token_id=pad,
                                          **self.stopping())
                new = out[:, width:].tolist()
                wall = time.perf_counter() - t0
                seconds += wall
                latency += [wall] * len(batch)
                request_forwards += (counter.count - before) * len(batch)
                ids += [self.cut(prompt, row) for prompt, row in zip(batch, new)]
        return self.record(f"generate {k}", "generate", k, ids, seconds, latency, request_forwards, counter.rows,
                           counter.count, counter.batch)

    def lp(self, name: str, kind: str, params: LookaheadParams, b: int, costs=None) -> dict[str, Any]:
        corpus = job_cache(params)          # as a job makes it: None unless suffix drafts with job_cache
        stats = BatchStats()
        ids: list[list[int] | None] = [None] * len(self.prompts)
        latency, forwards, errors = [], 0, []
        work = ((i, p["ids"], request_id(p["task_id"])) for i, p in enumerate(self.prompts))
        t0 = time.perf_counter()
        for i, result in decode_batch(self.model, work, params, dataclasses.replace(self.gen, batch_size=b),
                                      batch_size=b, prompt_tokens=self.longest, eos_token_ids=self.eos,
                                      tokenizer=self.tok, corpus=corpus, compile_mode=self.cfg.model.compile,
                                      stats=stats, **budget_kwargs(costs if b > 1 else None)):
            if isinstance(result, Exception):
                errors.append(f"{self.prompts[i]['task_id']}: {result}")
                continue
            if corpus is not None and result.token_ids:
                corpus.add(result.token_ids)
            ids[i] = list(result.token_ids)
            latency.append(result.decode_seconds)
            forwards += result.forwards
        seconds = time.perf_counter() - t0
        for line in errors:
            click.echo(f"  {name}: error: {line}", err=True)
        return self.record(name, kind, b, ids, seconds, latency, forwards, stats.rows, stats.rounds,
                           stats.occupancy, errors=errors, rows_per_decoding_round=stats.decoding_rows_per_round)

    def continuous(self, b: int, warm_up: bool = False) -> dict[str, Any] | None:
        """transformers' ContinuousBatchingManager, at most `b` requests per step, streamed and cancelled at
        the first stop string or EOS (raises whatever it raises where it cannot run). `warm_up`: the first
        prompt only, a few tokens, nothing recorded."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        prompts = self.prompts[:1] if warm_up else self.prompts
        max_new = min(4, self.gen.max_new_tokens) if warm_up else self.gen.max_new_tokens
        page = ContinuousBatchingConfig().page_size
        blocks = b * -(-(self.longest + max_new + 1) // page) + b
        cb_config = ContinuousBatchingConfig(max_requests_per_batch=b, num_blocks=blocks,
                                             max_batch_tokens=self.longest + b)
        gen_config = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=self.eos,
                                      pad_token_id=self.eos[0])
        attn = self.model.config._attn_implementation
        n = len(prompts)
        checkers = [StopChecker(self.eos, max_new, self.gen.stop, self.tok, context=p["ids"]) for p in prompts]
        ids: list[list[int] | None] = [None] * n
        latency, seen = [0.0] * n, [0] * n
        try:
            with Forwards(self.model) as counter, self.model.continuous_batching_context_manager(
                    generation_config=gen_config, continuous_batching_config=cb_config, block=True, timeout=60,
                    warmup=False) as manager:
                t0 = time.perf_counter()
                index = {rid: i for i, rid in enumerate(manager.add_requests(
                    [p["ids"] for p in prompts], max_new_tokens=max_new, streaming=True))}
                done = 0
                while done < n:
                    out = manager.get_result(timeout=1)
                    if out is None:
                        if not manager.is_running():
                            raise RuntimeError("its generation thread stopped before every request ended")
                        continue
                    i = index.get(out.request_id)
                    if i is None or ids[i] is not None:
                        continue                     # another request, or one already ended and cancelled
                    if out.error is not None:
                        raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                    checker = checkers[i]
                    for token in out.generated_tokens[seen[i]:]:
                        if checker.push(int(token)) is not None:
                            break
                    seen[i] = len(out.generated_tokens)
                    if checker.reason is None and not out.is_finished():
                        continue
                    ids[i] = list(checker.tokens)
                    latency[i] = time.perf_counter() - out.lifespan[0]
                    done += 1
                    if not out.is_finished():
                        manager.cancel_request(out.request_id)
                seconds = time.perf_counter() - t0
        finally:
            if self.model.config._attn_implementation != attn:     # the manager switches it back on stop
                self.model.set_attn_implementation(attn)
        if warm_up:
            return None
        return self.record(f"transformers CB {b}", "transformers_cb", b, ids, seconds, latency, None,
                           counter.rows, counter.count, None)


def no_drafts(params: LookaheadParams) -> LookaheadParams:
    """The config's lookahead with every draft source off: one row per request and forward."""
    return dataclasses.replace(params, window=0, guesses=0, lookup_candidates=0, suffix_factor=0.0, job_cache=False)


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@click.command()
@click.option("--config", "config_path", default=str(DEFAULT_CONFIG), show_default="configs/humaneval-smollm2.yaml",
              help="a job YAML (python -m lp.run --config)")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="override a config key (repeatable), e.g. --set data.limit=null")
@click.option("--limit", default=None, type=int, help="the first N prompts (data.limit; default: the config's)")
@click.option("--batches", default="1,2,4,8,16", show_default=True, help="lp batch sizes (decode_batch batch_size)")
@click.option("--generate-batches", "generate_batches", default="1,4,8,20", show_default=True,
              help="transformers generate static batch sizes (1 is always run: it is the ids reference)")
@click.option("--cb-batches", "cb_batches", default=None,
              help="transformers continuous batching: requests per step (default: --batches; 'none': skip it)")
@click.option("--no-drafts-batches", "plain_batches", default=None,
              help="lp no drafts batch sizes (default: --batches; 'none': skip them)")
@click.option("--threads", type=click.IntRange(min=0), default=2, show_default=True,
              help="torch CPU threads (0: leave as is)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="also write every figure")
def main(config_path, overrides, limit, batches, generate_batches, cb_batches, plain_batches, threads,
         json_path):
    if threads:
        torch.set_num_threads(threads)
    lp_sizes = sizes(batches, "--batches")
    gen_sizes = sizes(generate_batches, "--generate-batches")
    gen_sizes = [1, *(k for k in gen_sizes if k != 1)]     # generate 1 first: it is the ids reference
    cb_sizes = [] if cb_batches == "none" else sizes(cb_batches, "--cb-batches") if cb_batches else lp_sizes
    plain_sizes = ([] if plain_batches == "none" else sizes(plain_batches, "--no-drafts-batches") if plain_batches
                   else lp_sizes)
    try:
        cfg = load_config(config_path, [*overrides, *([f"data.limit={limit}"] if limit is not None else [])])
    except ConfigError as e:
        raise click.UsageError(str(e))
    if cfg.generation.sampling:
        raise click.UsageError("bench_batch compares greedy decoding: generation.temperature must be 0")
    plain = no_drafts(cfg.lookahead)
    if problems := plain.problems():
        raise click.UsageError("the no-drafts lookahead is refused: " + "; ".join(problems))
    try:
        selected = load_prompts(cfg.data)
    except DataError as e:
        raise click.UsageError(str(e))
    try:
        loaded = load_model(cfg.model.name, **{**cfg.model.load_kwargs(), "device": cfg.model.device})
    except ModelLoadError as e:
        raise click.ClickException(str(e))
    if cfg.generation.stop and not hasattr(loaded.tokenizer, "get_vocab"):   # generate's stop_strings read it
        raise click.UsageError(f"generate cannot take stop strings with the tokenizer of {loaded.name} (it has no "
                               f"vocabulary to match them in): --set 'generation.stop=[]'")
    if cfg.data.chat_template and not getattr(loaded.tokenizer, "chat_template", None):
        raise click.UsageError(f"data.chat_template is true but the tokenizer of {loaded.name} has no chat template")
    positions = position_limit(loaded.model.config)
    prompts = []
    for p in selected:        # what a job would record as an error is left out of the comparison
        ids, error = encode_prompt(p, loaded, cfg, positions)
        if error is None:
            prompts.append({"task_id": p.task_id, "ids": ids})
        else:
            click.echo(f"  left out {p.task_id}: {error}", err=True)
    if not prompts:
        raise click.UsageError(f"none of the {len(selected)} selected prompts can be decoded (see above)")
    bench = Bench(cfg, loaded, prompts)

    bench.warm_up(cfg.lookahead, max(lp_sizes))
    click.echo(f"{len(prompts)} prompts (longest {bench.longest} tokens), max_new_tokens "
               f"{cfg.generation.max_new_tokens}, stop {list(cfg.generation.stop)!r}", err=True)
    for k in gen_sizes:
        bench.generate(k)
    for b in plain_sizes:
        bench.lp(f"lp no drafts {b}", "lp_no_drafts", plain, b)
    costs = None
    if cfg.lookahead.row_budget and max(lp_sizes) > 1:     # the job's row budget: its costs, measured once
        t0 = time.perf_counter()
        costs = measure_costs(dataclasses.replace(cfg, generation=dataclasses.replace(
            cfg.generation, batch_size=max(lp_sizes))), loaded, selected)
        click.echo(f"row budget's costs, measured in {time.perf_counter() - t0:.1f} s: drafting "
                   f"{1000 * costs['draft_seconds']:.2f} ms per request; forwards (requests x rows: ms) "
                   + ", ".join(f"{p['batch']}x{p['rows']}:{1000 * p['seconds']:.0f}" for p in costs["curve"]), err=True)
    for b in lp_sizes:
        bench.lp(f"lp lookahead {b}", "lp_lookahead", cfg.lookahead, b, costs)
    cb_error = None
    for b in cb_sizes:
        try:
            if b == cb_sizes[0]:
                bench.continuous(b, warm_up=True)       # untimed: its first steps on this model
            bench.continuous(b)
        except Exception as e:  # noqa: BLE001  (whatever stops transformers' continuous batching here)
            cb_error = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            break
    order = {"generate": 0, "transformers_cb": 1, "lp_no_drafts": 2, "lp_lookahead": 3}
    systems = sorted(bench.systems, key=lambda s: (order[s["kind"]], s["batch"]))

    n = len(prompts)
    click.echo(f"\nmodel {loaded.name} {cfg.model.dtype} on {loaded.model.device}, {loaded.linear_kernels} linear "
               f"kernels, {n} {cfg.data.source} prompts{' (chat)' if cfg.data.chat_template else ''}, "
               f"max_new_tokens {cfg.generation.max_new_tokens}, greedy, torch threads {torch.get_num_threads()}\n")
    click.echo(f"{'system':>22} {'tokens':>7} {'tok/s':>8} {'p50 s':>7} {'p95 s':>7} {'mean s':>7} {'S':>6} "
               f"{'rows/fwd':>8} {'rows/dec':>8} {'batch':>6} {'admitted':>8} {'ids equal':>9}")
    for s in systems:
        click.echo(f"{s['system']:>22} {s['tokens']:>7} {fmt(s['tokens_per_s'], '8.2f'):>8} "
                   f"{fmt(s['latency_p50'], '7.2f'):>7} {fmt(s['latency_p95'], '7.2f'):>7} "
                   f"{fmt(s['latency_mean'], '7.2f'):>7} "
                   f"{fmt(s['compression'], '6.3f'):>6} {fmt(s['rows_per_forward'], '8.1f'):>8} "
                   f"{fmt(s.get('rows_per_decoding_round'), '8.1f'):>8} "
                   f"{fmt(s['mean_batch'], '6.2f'):>6} {fmt(s['admitted'], '8.2f'):>8} "
                   f"{str(s['ids_equal']) + '/' + str(n):>9}")
    if cb_error is not None:
        click.echo(f"transformers continuous batching: n/a ({cb_error})")

    def of(kind):
        return {s["batch"]: s for s in systems if s["kind"] == kind}

    gen, plain_rows, look, cb = of("generate"), of("lp_no_drafts"), of("lp_lookahead"), of("transformers_cb")

    def best(rows):
        return max(rows.values(), key=lambda s: s["tokens_per_s"] or 0.0)

    top, top_gen = best(look), best(gen)
    ratios: dict[str, Any] = {
        "lp_lookahead_best_over_generate_best": top["tokens_per_s"] / top_gen["tokens_per_s"],
        "lp_lookahead_best_batch": top["batch"], "generate_best_batch": top_gen["batch"],
        "lp_lookahead_over_no_drafts": {b: look[b]["tokens_per_s"] / plain_rows[b]["tokens_per_s"] for b in lp_sizes
                                        if b in plain_rows},
    }
    click.echo(f"\nbest lp lookahead / best transformers generate: {ratios['lp_lookahead_best_over_generate_best']:.2f}x"
               f" ({top['tokens_per_s']:.2f} tok/s at B={top['batch']} vs {top_gen['tokens_per_s']:.2f} tok/s at "
               f"k={top_gen['batch']})")
    if cb:
        top_cb = best(cb)
        ratios["lp_lookahead_best_over_cb_best"] = top["tokens_per_s"] / top_cb["tokens_per_s"]
        ratios["cb_best_batch"] = top_cb["batch"]
        click.echo(f"best lp lookahead / best transformers CB: {ratios['lp_lookahead_best_over_cb_best']:.2f}x "
                   f"({top_cb['tokens_per_s']:.2f} tok/s at B={top_cb['batch']})")
    if plain_rows:
        click.echo("lp lookahead / lp no drafts, tok/s: "
                   + ", ".join(f"B={b} {r:.2f}x" for b, r in ratios["lp_lookahead_over_no_drafts"].items()))
    base = min(lp_sizes)                     # B=1 unless --batches leaves it out
    ratios["latency_p50_base_batch"] = base
    for key, what in (("p50", "p50"), ("mean", "mean latency")):
        over = {b: look[b][f"latency_{key}"] / look[base][f"latency_{key}"] for b in lp_sizes}
        ratios[f"lp_lookahead_{key}_over_base_{key}"] = over
        click.echo(f"lp lookahead {what} / its B={base} {key}: " + ", ".join(f"B={b} {r:.2f}" for b, r in over.items()))
    job = cfg.generation.batch_size              # the config's own batch size: what its job ships with
    if job in look:
        ratios["job_batch"] = job
        ratios["job_batch_over_generate_best"] = look[job]["tokens_per_s"] / top_gen["tokens_per_s"]
        click.echo(f"the config's batch size B={job}: {ratios['job_batch_over_generate_best']:.2f}x the best "
                   f"transformers generate, p50 {ratios['lp_lookahead_p50_over_base_p50'][job]:.2f}x its B={base} p50")

    if json_path:
        report = dict(config=config_path, overrides=list(overrides), limit=cfg.data.limit, model=loaded.name,
                      dtype=cfg.model.dtype, device=str(loaded.model.device), linear_kernels=loaded.linear_kernels,
                      data=cfg.data.source, chat=cfg.data.chat_template, prompts=n,
                      task_ids=[p["task_id"] for p in prompts], max_new_tokens=cfg.generation.max_new_tokens,
                      stop=list(cfg.generation.stop), threads=torch.get_num_threads(),
                      lookahead=dataclasses.asdict(cfg.lookahead), no_drafts=dataclasses.asdict(plain),
                      reference="generate 1", transformers_cb_error=cb_error, systems=systems, ratios=ratios,
                      argv=sys.argv[1:])
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
