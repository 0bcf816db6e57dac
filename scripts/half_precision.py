"""Half precision against `generate`: how many of a job's outputs decoded in bfloat16 (or float16) equal
plain greedy `generate` in the same dtype, and for each that differs where, and how close generate's two
best logits were there.

A round's forward over several rows rounds differently from generate's one-row forward (other matmul
shapes, another accumulation order), so in half precision an argmax can flip wherever the two best logits
are closer than that rounding: near-ties, never far from one. Exactness itself is proven in float64
(tests/test_exactness.py, tests/test_architectures.py); this measures what it means in half precision.

    python scripts/half_precision.py                      # the default job (HE-20, chat), bfloat16, CPU
    python scripts/half_precision.py --limit 5 --max-new-tokens 64 --json out.json

It runs the job itself (lp.jobs.runner.run_job with the in-run baseline, so both decoders see the same
prompts, stop strings and model), then re-runs generate up to each first difference with its logits kept.
The margin there is printed beside the median margin of the steps before it and the share of those steps
whose margin was as small (a flip at the 1% smallest margins is a near-tie).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import click
import torch

from lp.jobs.config import ConfigError, load_config
from lp.jobs.data import load_prompts
from lp.jobs.runner import prompt_ids, run_job
from lp.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def step_margins(model, prompt: list[int], steps: int, eos: list[int]) -> list[float]:
    """generate's top-1 minus top-2 logit at each of its first `steps` greedy steps (float32 of its logits)."""
    x = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=steps,
                             eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0,
                             output_logits=True, return_dict_in_generate=True)
    margins = []
    for logits in out.logits:
        top = logits[0].float().topk(2).values
        margins.append(float(top[0] - top[1]))
    return margins


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@click.command()
@click.option("--config", "config_path", default=str(ROOT / "configs" / "humaneval-smollm2.yaml"), show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--set", "overrides", multiple=True, help="more job overrides, section.key=value")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="also write the figures here")
def main(config_path, dtype, limit, max_new_tokens, threads, overrides, json_out):
    if json_out is not None:        # before the job runs, not after
        folder = json_out.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.BadParameter(f"{json_out}: {folder} is not a directory this process can write in",
                                     param_hint="--json")
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        try:
            cfg = load_config(config_path, [f"model.dtype={dtype}", f"data.limit={limit}", "baseline=true",
                                            f"generation.max_new_tokens={max_new_tokens}", f"output.dir={out}",
                                            "model.device=cpu", *overrides])
        except ConfigError as e:
            raise click.UsageError(str(e)) from None
        run_job(cfg, fresh=True)
        records = [json.loads(line) for line in (Path(out) / "results.jsonl").read_text().splitlines()]
    loaded = load_model(cfg.model.name, **cfg.model.load_kwargs())
    prompts = {p.task_id: p for p in load_prompts(cfg.data)}
    rows = []
    for r in records:
        ours, ref = r["token_ids"], r["baseline_token_ids"]
        at = first_difference(ours, ref)
        row = dict(task_id=r["task_id"], tokens=len(ref), identical=at is None)
        if at is not None and at < len(ref):
            ids = prompt_ids(prompts[r["task_id"]].prompt, loaded.tokenizer, cfg.data)
            margins = step_margins(loaded.model, ids, at + 1, loaded.eos_token_ids)
            before = margins[:-1] or [float("nan")]
            row.update(position=at, margin=margins[-1], median_margin=statistics.median(before),
                       as_small=sum(m <= margins[-1] for m in before) / max(len(before), 1),
                       reference=ref[at], ours=ours[at])
        elif at is not None:
            row.update(position=at, note="one output is a prefix of the other")
        rows.append(row)
    same = sum(r["identical"] for r in rows)
    print(f"{cfg.model.name} in {dtype} on the CPU ({loaded.linear_kernels} linears, "
          f"{loaded.model.config._attn_implementation} attention), {len(rows)} prompts of {cfg.data.source}")
    print(f"identical to generate in {dtype}: {same}/{len(rows)} ({same / max(len(rows), 1):.0%})")
    differing = [r for r in rows if not r["identical"]]
    if differing:
        print(f"{'task':16s} {'first diff':>10s} {'margin there':>12s} {'median before':>13s} {'steps as close':>14s}")
        for r in differing:
            if "margin" in r:
                print(f"{r['task_id']:16s} {r['position']:>10d} {r['margin']:>12.4f} {r['median_margin']:>13.4f} "
                      f"{r['as_small']:>14.1%}")
            else:
                print(f"{r['task_id']:16s} {r['position']:>10d} {r['note']}")
    if json_out:
        Path(json_out).write_text(json.dumps(dict(model=cfg.model.name, dtype=dtype, identical=same,
                                                  prompts=len(rows), rows=rows), indent=1))


if __name__ == "__main__":
    main()
