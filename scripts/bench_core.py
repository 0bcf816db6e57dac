"""Core benchmark: lookahead (with or without lookup candidates) vs plain decoding and
transformers' prompt lookup, on HumanEval or ClassEval prompts, in one run.

For each prompt, plain decoding (`model.generate`), transformers' prompt lookup
(`--prompt-lookup K`) and every lookahead configuration run back to back
(interleaved, so load changes hit all of them alike). Prints, per system: summed
tokens, summed forwards (prefill counted), S = tokens / forwards, the number of
prompts whose ids equal plain decoding, decode tokens/s and its ratio to plain
decoding, rows per round, host ms per round (everything but the model forward;
it includes the pool and the lookup index) and ops per round (the most launching
aten ops one round dispatches outside the model forward, lp.measure.round_ops,
counted in an untimed extra decode of the first prompt: on a GPU each is a
kernel launch).

Every system runs on one model with `--cpu-linear` kernels (default onednn: the
weights pre-packed for oneDNN's matmul, lp.models.use_onednn_linears), so the
ratio column compares decoders, not kernels; with onednn, plain decoding also
runs on a stock copy of the model ("torch linear") to show what the kernels
alone give.

A configuration is W,N,G (window, n-gram, pool guesses) or W,N,G,L,K,M with L
lookup candidates of up to K tokens matched on the last M..1 tokens; W = 0 runs
no Jacobi window (with G = 0 too: lookup candidates alone); any other
`lookahead` key follows as key=value, e.g. "0,4,0,suffix_factor=8,job_cache=true".
With `job_cache` a configuration drafts from its own earlier completions of
this run, in prompt order, as a job does.

Rows per round are printed twice: over every round (the prefill round feeds
the prompt) and over the decoding rounds only (prefill left out, as the
SuffixDecoding figures count them). `--suffix-peer B,F` adds SuffixDecoding
(arctic-inference's SuffixDecodingCache, tree drafts of at most B nodes and
F x match length) with and without its global cache, SIMULATED on the plain
greedy ids (no forwards run: S and rows only); several `B,F;B,F` trace its S
against rows, so a configuration can be read against the peer at equal rows.

    python scripts/bench_core.py                      # (15,5,15) and (7,5,7), seeding on and off
    python scripts/bench_core.py --seeding on --prompt-lookup 10 \\
        --configs "15,5,15;0,3,0,2,10,3;15,5,15,2,10,3"  # lookahead, lookup, both, and prompt lookup
    python scripts/bench_core.py --temperature 0.7 --top-p 0.9 --configs "15,5,15;7,5,7" --seeding on
    python scripts/bench_core.py --repetition-penalty 1.2 --seeding on   # generate's penalty, every system
    python scripts/bench_core.py --no-repeat-ngram-size 4 --seeding on   # generate's n-gram ban, every system
    python scripts/bench_core.py --ban-chars "'" --seeding on   # a prefix_allowed_tokens_fn, called row by row
    python scripts/bench_core.py --seeding on --suffix-peer 32,8 \
        --configs "0,4,0,suffix_factor=8,suffix_tokens=32,suffix_min_score=0.1,job_cache=true"
    python scripts/bench_core.py --data classeval --data-path ../shared/data/ClassEval_data.json --limit 10 --chat

`--data classeval` takes the class skeletons of ClassEval_data.json (`--data-path`); `--chat` sends
every prompt as a job's chat code-completion mode does (lp.jobs.runner.prompt_ids). Decoding itself is
the same: `--max-new-tokens` tokens or EOS, no stop strings.
"""
from __future__ import annotations

import itertools
import json

import click
import torch
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

import dataclasses

import yaml
from bench_util import generate, suffix_decoding_peer, writable_file
from lp.decode.propose import job_cache
from lp.engine import GenerationParams, LookaheadParams, check, lookahead_generate
from lp.jobs.config import DataSection, read_yaml
from lp.jobs.data import DataError, load_prompts
from lp.measure.round_ops import RoundOps
from lp.jobs.runner import prompt_ids
from lp.hf_processing import row_processor_of
from lp.library import lookahead_params
from lp.messages import one_line
from lp.models import ModelLoadError, load_model

KEYS = {f.name for f in dataclasses.fields(LookaheadParams)}


def parse_configs(text: str) -> list[LookaheadParams]:
    """'W,N,G[,L,K,M][,key=value...];...' -> LookaheadParams (pool seeding set later)."""
    out = []
    for item in text.split(";"):
        parts = [v.strip() for v in item.split(",")]
        named = dict(v.split("=", 1) for v in parts if "=" in v)
        try:
            values = [int(v) for v in parts if "=" not in v]
        except ValueError:
            values = []
        if len(values) not in (3, 6) or not set(named) <= KEYS:
            raise click.BadParameter(f"{item!r}: expected W,N,G or W,N,G,L,K,M, then key=value for other "
                                     f"lookahead keys ({', '.join(sorted(KEYS))})", param_hint="--configs")
        positional = ["window", "ngram", "guesses", *(["lookup_candidates", "lookup_tokens", "lookup_ngram"]
                                                      if len(values) == 6 else [])]
        twice = sorted(set(named) & {*positional, "pool_seeding"})
        if twice:
            raise click.BadParameter(f"{item!r}: {', '.join(twice)} given by position already (pool_seeding: by "
                                     f"--seeding)", param_hint="--configs")
        w, n, g, *lookup = values
        lc, k, m = lookup or (0, 10, 3)
        try:      # the keys' kinds and ranges checked as lp.generate checks them
            keys = {key: read_yaml(v) for key, v in named.items()}     # as a job config reads them
            out.append(lookahead_params(**{**vars(LookaheadParams(w, n, g, True, lc, k, m)), **keys}))
        except (yaml.YAMLError, ValueError) as e:
            raise click.BadParameter(f"{item!r}: {one_line(e, named=False)}", param_hint="--configs") from None
    return out


def bench_prompts(data: str, path: str | None, chat: bool, limit: int, tokenizer) -> list[dict]:
    """{task_id, ids} of the first `limit` prompts of `data`, raw or in the chat mode."""
    section = DataSection(source=data, path=path, limit=limit, chat_template=chat)
    problems = section.problems()
    if chat and not getattr(tokenizer, "chat_template", None):
        problems.append("--chat: the model's tokenizer has no chat template")
    if problems:
        raise click.UsageError("; ".join(problems))
    try:
        return [{"task_id": p.task_id, "ids": prompt_ids(p.prompt, tokenizer, section)} for p in load_prompts(section)]
    except DataError as e:
        raise click.UsageError(str(e))


def allowed_without(tokenizer, chars: str, eos: list[int]) -> list[int]:
    """The token ids whose text holds none of `chars`, and the EOS ids."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
    return sorted({i for i in range(size) if not set(tokenizer.decode([i])) & set(chars)} | set(eos))


def unique_labels(variants: list[LookaheadParams]) -> list[str]:
    """Each configuration's label, numbered where two share one (the same settings given twice, or
    settings a label does not show): the table keeps a row per configuration."""
    names = [label(v) for v in variants]
    return [f"{name} #{names[:i].count(name) + 1}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def label(p: LookaheadParams) -> str:
    lookup = f" L{p.lookup_candidates}k{p.lookup_tokens}m{p.lookup_ngram}" if p.lookup_candidates else ""
    suffix = ""
    if p.suffix:
        suffix = (f" S{p.suffix_factor:g}x{p.suffix_tokens}" + (f">{p.suffix_min_score:g}" if p.suffix_min_score else "")
                  + ("+job" if p.job_cache else ""))
    budget = f" B{p.tree_budget}" if p.tree_budget else ""
    return f"{p.window},{p.ngram},{p.guesses}{lookup}{suffix}{budget}{'' if p.pool_seeding else ' noseed'}"


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="first N prompts")
@click.option("--data", type=click.Choice(["humaneval", "classeval"]), default="humaneval", show_default=True)
@click.option("--data-path", default=None, help="ClassEval_data.json (--data classeval)")
@click.option("--chat", is_flag=True, help="prompts in the jobs' chat code-completion mode (instruct models)")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--configs", default="15,5,15;7,5,7", show_default=True,
              help="W,N,G or W,N,G,L,K,M (L lookup candidates, K tokens, M n-gram) separated by ';'")
@click.option("--seeding", type=click.Choice(["on", "off", "both"]), default="both", show_default=True)
@click.option("--prompt-lookup", "prompt_lookup", default=0, show_default=True, type=click.IntRange(min=0),
              help="also run transformers' prompt lookup with prompt_lookup_num_tokens=K (greedy; 0: off)")
@click.option("--temperature", default=0.0, show_default=True, help="> 0: exact sampling (and plain sampling as the baseline)")
@click.option("--top-k", default=0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--repetition-penalty", "repetition_penalty", default=1.0, show_default=True,
              help="generate's repetition penalty, for every system (1: off)")
@click.option("--min-new-tokens", "min_new_tokens", default=0, show_default=True,
              help="no EOS before this many new tokens, for every system (0: off)")
@click.option("--no-repeat-ngram-size", "no_repeat", default=0, show_default=True,
              help="generate's n-gram ban (the host lists each row's bans), for every system (0: off)")
@click.option("--ban-chars", "ban_chars", default="", metavar="CHARS",
              help="generate's prefix_allowed_tokens_fn for every system: only tokens whose text holds none of "
                   "CHARS, and EOS (lookahead calls it on every verified row; '': off)")
@click.option("--suffix-peer", "suffix_peer", default="", metavar="B,F[;B,F...]",
              help="also simulate SuffixDecoding (arctic-inference) with tree drafts of at most B nodes and "
                   "F x match length, with and without its global cache (greedy only); several B,F "
                   "separated by ';' trace its S against rows")
@click.option("--compile", "compile_mode", type=click.Choice(["off", "default", "reduce-overhead"]), default="off",
              show_default=True, help="also run every configuration with its round forward compiled "
                                      "(torch.compile, fixed-size rounds), and a static-cache greedy loop "
                                      "compiled the same way")
@click.option("--cpu-linear", "cpu_linear", type=click.Choice(["onednn", "torch"]), default="onednn",
              show_default=True, help="the linear kernels of the model every system shares (lp.models."
                                      "use_onednn_linears); with onednn, plain decoding also runs on a stock copy")
@click.option("--threads", type=click.IntRange(min=0), default=0, help="torch CPU threads (0: leave as is)")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="also write the figures as JSON")
def main(model_name, dtype, device, limit, data, data_path, chat, max_new_tokens, configs, seeding, prompt_lookup,
         temperature, top_k, top_p, repetition_penalty, min_new_tokens, no_repeat, ban_chars, suffix_peer,
         compile_mode, cpu_linear, threads, json_out):
    if threads:
        torch.set_num_threads(threads)
    gen = GenerationParams(max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           repetition_penalty=repetition_penalty, min_new_tokens=min_new_tokens,
                           no_repeat_ngram_size=no_repeat)
    processors = dict(repetition_penalty=repetition_penalty, min_new_tokens=min_new_tokens or None,  # plain's
                      no_repeat_ngram_size=no_repeat or None)
    seedings = {"on": [True], "off": [False], "both": [True, False]}[seeding]
    variants = [LookaheadParams(**{**vars(p), "pool_seeding": s}) for p in parse_configs(configs) for s in seedings]
    try:
        check(gen, *variants)
    except ValueError as e:
        raise click.UsageError(str(e))
    if (prompt_lookup or suffix_peer) and gen.sampling:
        raise click.UsageError("--prompt-lookup and --suffix-peer run greedy only: drop them or --temperature")
    peers = []                                               # (budget, factor) of each simulated peer
    for item in filter(None, suffix_peer.split(";")):
        try:
            budget, factor = item.split(",")
            peers.append((int(budget), float(factor)))
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected B,F (e.g. 32,8)", param_hint="--suffix-peer")
    if compile_mode != "off" and cpu_linear == "onednn":
        click.echo("--compile: every system runs torch linear kernels (inductor cannot lower oneDNN's "
                   "pre-packed weights)", err=True)
        cpu_linear = "torch"
    # every system shares one model with `cpu_linear` kernels; with onednn plain decoding also runs on a
    # stock copy, so the same run shows what the kernels alone give
    try:
        loaded = load_model(model_name, dtype, device, cpu_linear=cpu_linear)
    except ModelLoadError as e:
        raise click.ClickException(str(e))
    model, tok, eos, kernels = loaded.model, loaded.tokenizer, loaded.eos_token_ids, loaded.linear_kernels
    stock = load_model(model_name, dtype, device).model if kernels == "onednn" else model
    prompts = bench_prompts(data, data_path, chat, limit, tok)
    row_processor = None
    if ban_chars:      # plain decoding gets the function, lookahead the same processor row by row (as lp.generate)
        allowed = allowed_without(tok, ban_chars, eos)
        processors["prefix_allowed_tokens_fn"] = lambda batch_id, ids: allowed
        row_processor = row_processor_of([PrefixConstrainedLogitsProcessor(processors["prefix_allowed_tokens_fn"], 1)])
    base = "sampling" if gen.sampling else "greedy"
    sampling = dict(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p) if gen.sampling else None

    # (label, params, compile mode): every configuration eager, and compiled with --compile; a
    # static-cache greedy loop (no candidates at all) compiled the same way
    labels = unique_labels(variants)
    runs = [(name, v, "off") for name, v in zip(labels, variants)]
    if compile_mode != "off":
        runs += [(f"{name} compiled", v, compile_mode) for name, v in zip(labels, variants)]
        runs.append(("greedy loop compiled", LookaheadParams(0, 3, 0), compile_mode))
    systems = [f"plain {base}"] + ([f"plain {base}, torch linear"] if kernels == "onednn" else []) \
        + ([f"prompt lookup k={prompt_lookup}"] if prompt_lookup else []) + [name for name, _, _ in runs]
    stats = {s: dict(tokens=0, forwards=0, seconds=0.0, host=None, rows=0, decode_rows=0, same=0) for s in systems}
    corpora = {name: job_cache(v) for name, v, _ in runs}   # each run's own job-wide cache
    greedy_runs = []                                         # (prompt ids, plain greedy ids) for --suffix-peer

    def add(system, ids, ref, seconds, forwards, rows, decode_rows, host=None):
        st = stats[system]
        st["tokens"] += len(ids)
        st["forwards"] += forwards
        st["seconds"] += seconds
        st["rows"] += rows
        st["decode_rows"] += decode_rows
        st["same"] += ids == ref
        if host is not None:
            st["host"] = (st["host"] or 0.0) + host

    if compile_mode != "off":       # compile every round shape first: compilation is not decoding time
        click.echo("compiling the round shapes of every prompt (untimed warm-up pass)", err=True)
        for problem in prompts:
            for name, v, mode in runs:
                if mode != "off":
                    lookahead_generate(model, problem["ids"], v, gen, eos_token_ids=eos,
                                       compile_mode=mode, row_processor=row_processor)
    for i, problem in enumerate(prompts):
        ids = problem["ids"]
        torch.manual_seed(i)
        ref = generate(model, ids, max_new_tokens, eos, sampling, **processors)
        add(systems[0], ref.ids, ref.ids, ref.seconds, ref.forwards, ref.rows, ref.rows - len(ids))
        greedy_runs.append((ids, ref.ids))
        line = [f"{problem['task_id']:>14} {base} {len(ref.ids) / ref.seconds:6.1f} tok/s"]
        if kernels == "onednn":
            torch.manual_seed(i)
            st = generate(stock, ids, max_new_tokens, eos, sampling, **processors)
            add(f"plain {base}, torch linear", st.ids, ref.ids, st.seconds, st.forwards, st.rows, st.rows - len(ids))
            line.append(f"torch linear {len(st.ids) / st.seconds:6.1f} tok/s")
        if prompt_lookup:
            pl = generate(model, ids, max_new_tokens, eos, prompt_lookup_num_tokens=prompt_lookup, **processors)
            add(f"prompt lookup k={prompt_lookup}", pl.ids, ref.ids, pl.seconds, pl.forwards, pl.rows,
                pl.rows - len(ids))
            line.append(f"PLD S={len(pl.ids) / pl.forwards:.2f}{'' if pl.ids == ref.ids else ' DIFF'}")
        for name, v, mode in runs:
            corpus = corpora[name]
            r = lookahead_generate(model, ids, v, gen, eos_token_ids=eos, request=problem["task_id"], corpus=corpus,
                                   compile_mode=mode, row_processor=row_processor)
            if corpus is not None and r.token_ids:
                corpus.add(r.token_ids)
            add(name, r.token_ids, ref.ids, r.decode_seconds, r.forwards, sum(r.rows_per_round),
                sum(r.rows_per_round[1:]), r.host_seconds)
            line.append(f"({name}) S={r.compression:.2f}{'' if r.token_ids == ref.ids else ' DIFF'}")
        click.echo(f"[{i + 1}/{len(prompts)}] " + " | ".join(line), err=True)
    for name, v, mode in runs:        # untimed: the count's dispatch mode slows every op down
        with RoundOps().counting() as ops:
            lookahead_generate(model, prompts[0]["ids"], v, gen, eos_token_ids=eos, request=prompts[0]["task_id"],
                               corpus=corpora[name], compile_mode=mode, row_processor=row_processor)
        stats[name]["ops"] = max(ops.rounds)

    plain = stats[systems[0]]
    plain_tps = plain["tokens"] / plain["seconds"]
    mode = f"sampling T={temperature} top_k={top_k} top_p={top_p}" if gen.sampling else "greedy"
    if repetition_penalty != 1.0 or min_new_tokens:
        mode += f", repetition_penalty {repetition_penalty}, min_new_tokens {min_new_tokens}"
    if no_repeat:
        mode += f", no_repeat_ngram_size {no_repeat}"
    if ban_chars:
        mode += f", prefix_allowed_tokens_fn banning {ban_chars!r}"
    names = {"humaneval": "HumanEval", "classeval": "ClassEval"}
    click.echo(f"\nmodel {model_name} {dtype}, {kernels} linear kernels, {len(prompts)} {names[data]} prompts"
               f"{' (chat)' if chat else ''}, {max_new_tokens} new tokens, "
               f"{mode}, torch threads {torch.get_num_threads()}"
               + ("; 'same' compares ids with plain sampling, which draws differently" if gen.sampling else "")
               + "\n")
    click.echo(f"{'system':>40} {'tokens':>7} {'forwards':>8} {'S':>6} {'same':>6} "
               f"{'tok/s':>7} {'ratio':>6} {'rows/rnd':>8} {'rows/dec':>8} {'host ms':>8} {'ops/rnd':>7}")
    report = {"model": model_name, "dtype": dtype, "cpu_linear": kernels, "data": data, "chat": chat,
              "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "repetition_penalty": repetition_penalty, "min_new_tokens": min_new_tokens,
              "no_repeat_ngram_size": no_repeat, "ban_chars": ban_chars,
              "prompts": len(prompts), "max_new_tokens": max_new_tokens, "plain_tokens": plain["tokens"],
              "plain_tokens_per_s": plain_tps, "systems": []}
    for name, st in stats.items():
        tps = st["tokens"] / st["seconds"]
        decode_rounds = st["forwards"] - len(prompts)
        row = dict(system=name, tokens=st["tokens"], forwards=st["forwards"],
                   compression=st["tokens"] / st["forwards"], same_as_plain=st["same"], tokens_per_s=tps,
                   speedup=tps / plain_tps, rows_per_round=st["rows"] / st["forwards"],
                   rows_per_decode_round=st["decode_rows"] / decode_rounds if decode_rounds else None,
                   host_ms_per_round=None if st["host"] is None else 1000 * st["host"] / st["forwards"],
                   ops_per_round=st.get("ops"))
        report["systems"].append(row)
        echo_row(row, len(prompts))
    if peers:
        click.echo("SuffixDecoding (arctic-inference) SIMULATED on the plain greedy ids: no forwards run, "
                   "so no tok/s; BF: budget B nodes, factor F, tree drafts, min_token_prob 0")
    for (peer_budget, peer_factor), glob in itertools.product(peers, (False, True)):
        sim = suffix_decoding_peer(greedy_runs, peer_budget, peer_factor, 0.0, glob)
        row = dict(system=f"SuffixDecoding B{peer_budget} F{peer_factor:g}" + (" +global" if glob else ""),
                   tokens=sim.tokens, forwards=sim.forwards, compression=sim.tokens / sim.forwards,
                   same_as_plain=len(prompts), tokens_per_s=None, speedup=None, rows_per_round=None,
                   rows_per_decode_round=sim.decode_rows / sim.decode_rounds if sim.decode_rounds else None,
                   host_ms_per_round=None, ops_per_round=None, simulated=True)
        report["systems"].append(row)
        echo_row(row, len(prompts))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)


def echo_row(row: dict, prompts: int) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    click.echo(f"{row['system']:>40} {row['tokens']:>7} {row['forwards']:>8} {row['compression']:>6.3f} "
               f"{row['same_as_plain']:>3}/{prompts:<2} {fmt(row['tokens_per_s'], '7.2f'):>7} "
               f"{fmt(row['speedup'], '6.2f'):>6} {fmt(row['rows_per_round'], '8.1f'):>8} "
               f"{fmt(row['rows_per_decode_round'], '8.1f'):>8} {fmt(row['host_ms_per_round'], '8.2f'):>8} "
               f"{fmt(row['ops_per_round'], '7d'):>7}")


if __name__ == "__main__":
    main()
