"""Core benchmark: lookahead (with or without lookup candidates) vs plain decoding and
transformers' prompt lookup, on HumanEval or ClassEval prompts, in one run.

For each prompt, plain decoding (`model.generate`), transformers' prompt lookup
(`--prompt-lookup K`) and every lookahead configuration run back to back
(interleaved, so load changes hit all of them alike). Prints, per system: summed
tokens, summed forwards (prefill counted), S = tokens / forwards, the number of
prompts whose ids equal plain decoding, decode tokens/s and its ratio to plain
decoding, rows per round and host ms per round (everything but the model forward;
it includes the pool and the lookup index).

A configuration is W,N,G (window, n-gram, pool guesses) or W,N,G,L,K,M with L
lookup candidates of up to K tokens matched on the last M..1 tokens; W = 0 runs
no Jacobi window (with G = 0 too: lookup candidates alone).

    python scripts/bench_core.py                      # (15,5,15) and (7,5,7), seeding on and off
    python scripts/bench_core.py --seeding on --prompt-lookup 10 \\
        --configs "15,5,15;0,3,0,2,10,3;15,5,15,2,10,3"  # lookahead, lookup, both, and prompt lookup
    python scripts/bench_core.py --temperature 0.7 --top-p 0.9 --configs "15,5,15;7,5,7" --seeding on
    python scripts/bench_core.py --data classeval --data-path ../shared/data/ClassEval_data.json --limit 10 --chat

`--data classeval` takes the class skeletons of ClassEval_data.json (`--data-path`); `--chat` sends
every prompt as a job's chat code-completion mode does (lp.jobs.runner.prompt_ids). Decoding itself is
the same: `--max-new-tokens` tokens or EOS, no stop strings.
"""
from __future__ import annotations

import json

import click
import torch

from bench_util import generate
from lp.engine import GenerationParams, LookaheadParams, check, lookahead_generate
from lp.jobs.config import DataSection
from lp.jobs.data import DataError, load_prompts
from lp.jobs.runner import prompt_ids
from lp.models import load_model


def parse_configs(text: str) -> list[LookaheadParams]:
    """'W,N,G[,L,K,M];...' -> LookaheadParams (pool seeding set later)."""
    out = []
    for item in text.split(";"):
        values = [int(v) for v in item.split(",")]
        if len(values) not in (3, 6):
            raise click.BadParameter(f"{item!r}: expected W,N,G or W,N,G,L,K,M", param_hint="--configs")
        w, n, g, *lookup = values
        lc, k, m = lookup or (0, 10, 3)
        out.append(LookaheadParams(w, n, g, True, lc, k, m))
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


def label(p: LookaheadParams) -> str:
    lookup = f" L{p.lookup_candidates}k{p.lookup_tokens}m{p.lookup_ngram}" if p.lookup_candidates else ""
    return f"{p.window},{p.ngram},{p.guesses}{lookup}{'' if p.pool_seeding else ' noseed'}"


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--limit", default=20, show_default=True, help="first N prompts")
@click.option("--data", type=click.Choice(["humaneval", "classeval"]), default="humaneval", show_default=True)
@click.option("--data-path", default=None, help="ClassEval_data.json (--data classeval)")
@click.option("--chat", is_flag=True, help="prompts in the jobs' chat code-completion mode (instruct models)")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--configs", default="15,5,15;7,5,7", show_default=True,
              help="W,N,G or W,N,G,L,K,M (L lookup candidates, K tokens, M n-gram) separated by ';'")
@click.option("--seeding", type=click.Choice(["on", "off", "both"]), default="both", show_default=True)
@click.option("--prompt-lookup", "prompt_lookup", default=0, show_default=True,
              help="also run transformers' prompt lookup with prompt_lookup_num_tokens=K (greedy; 0: off)")
@click.option("--temperature", default=0.0, show_default=True, help="> 0: exact sampling (and plain sampling as the baseline)")
@click.option("--top-k", default=0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--threads", default=0, help="torch CPU threads (0: leave as is)")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="also write the figures as JSON")
def main(model_name, dtype, device, limit, data, data_path, chat, max_new_tokens, configs, seeding, prompt_lookup,
         temperature, top_k, top_p, threads, json_out):
    if threads:
        torch.set_num_threads(threads)
    gen = GenerationParams(max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    seedings = {"on": [True], "off": [False], "both": [True, False]}[seeding]
    variants = [LookaheadParams(**{**vars(p), "pool_seeding": s}) for p in parse_configs(configs) for s in seedings]
    try:
        check(gen, *variants)
    except ValueError as e:
        raise click.UsageError(str(e))
    if prompt_lookup and gen.sampling:
        raise click.UsageError("--prompt-lookup runs greedy only: drop it or --temperature")
    loaded = load_model(model_name, dtype, device)
    model, tok, eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
    prompts = bench_prompts(data, data_path, chat, limit, tok)
    base = "sampling" if gen.sampling else "greedy"
    sampling = dict(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p) if gen.sampling else None

    systems = [f"plain {base}"] + ([f"prompt lookup k={prompt_lookup}"] if prompt_lookup else []) \
        + [label(v) for v in variants]
    stats = {s: dict(tokens=0, forwards=0, seconds=0.0, host=None, rows=0, same=0) for s in systems}

    def add(system, ids, ref, seconds, forwards, rows, host=None):
        st = stats[system]
        st["tokens"] += len(ids)
        st["forwards"] += forwards
        st["seconds"] += seconds
        st["rows"] += rows
        st["same"] += ids == ref
        if host is not None:
            st["host"] = (st["host"] or 0.0) + host

    for i, problem in enumerate(prompts):
        ids = problem["ids"]
        torch.manual_seed(i)
        ref = generate(model, ids, max_new_tokens, eos, sampling)
        add(systems[0], ref.ids, ref.ids, ref.seconds, ref.forwards, ref.rows)
        line = [f"{problem['task_id']:>14} {base} {len(ref.ids) / ref.seconds:6.1f} tok/s"]
        if prompt_lookup:
            pl = generate(model, ids, max_new_tokens, eos, prompt_lookup_num_tokens=prompt_lookup)
            add(systems[1], pl.ids, ref.ids, pl.seconds, pl.forwards, pl.rows)
            line.append(f"PLD S={len(pl.ids) / pl.forwards:.2f}{'' if pl.ids == ref.ids else ' DIFF'}")
        for v in variants:
            r = lookahead_generate(model, ids, v, gen, eos_token_ids=eos, request=problem["task_id"])
            add(label(v), r.token_ids, ref.ids, r.decode_seconds, r.forwards, sum(r.rows_per_round), r.host_seconds)
            line.append(f"({label(v)}) S={r.compression:.2f}{'' if r.token_ids == ref.ids else ' DIFF'}")
        click.echo(f"[{i + 1}/{len(prompts)}] " + " | ".join(line), err=True)

    plain = stats[systems[0]]
    plain_tps = plain["tokens"] / plain["seconds"]
    mode = f"sampling T={temperature} top_k={top_k} top_p={top_p}" if gen.sampling else "greedy"
    names = {"humaneval": "HumanEval", "classeval": "ClassEval"}
    click.echo(f"\nmodel {model_name} {dtype}, {len(prompts)} {names[data]} prompts{' (chat)' if chat else ''}, "
               f"{max_new_tokens} new tokens, "
               f"{mode}, torch threads {torch.get_num_threads()}"
               + ("; 'same' compares ids with plain sampling, which draws differently" if gen.sampling else "")
               + "\n")
    click.echo(f"{'system':>24} {'tokens':>7} {'forwards':>8} {'S':>6} {'same':>6} "
               f"{'tok/s':>7} {'ratio':>6} {'rows/rnd':>8} {'host ms':>8}")
    report = {"model": model_name, "dtype": dtype, "data": data, "chat": chat,
              "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "prompts": len(prompts), "max_new_tokens": max_new_tokens, "plain_tokens": plain["tokens"],
              "plain_tokens_per_s": plain_tps, "systems": []}
    for name, st in stats.items():
        tps = st["tokens"] / st["seconds"]
        row = dict(system=name, tokens=st["tokens"], forwards=st["forwards"],
                   compression=st["tokens"] / st["forwards"], same_as_plain=st["same"], tokens_per_s=tps,
                   speedup=tps / plain_tps, rows_per_round=st["rows"] / st["forwards"],
                   host_ms_per_round=None if st["host"] is None else 1000 * st["host"] / st["forwards"])
        report["systems"].append(row)
        host = "-" if row["host_ms_per_round"] is None else f"{row['host_ms_per_round']:.2f}"
        click.echo(f"{name:>24} {st['tokens']:>7} {st['forwards']:>8} {row['compression']:>6.3f} "
                   f"{st['same']:>3}/{len(prompts):<2} {tps:>7.2f} {row['speedup']:>6.2f} "
                   f"{row['rows_per_round']:>8.1f} {host:>8}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
