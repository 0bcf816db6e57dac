"""Python's garbage collector during a batched job: the pauses it takes while lp decodes, with lp's
frozen heap (lp.engine.heap_frozen: gc.freeze for the decode, the default) and without it, in one run.

A full (generation 2) collection walks every object the process holds: the model, torch and
transformers, about 400,000 objects. The drafts' indexes make long-lived objects as the job goes, so
full collections come during the decode, and each stops every request in the batch. The script runs
the job in this process (lp.jobs.runner.run_job, the batched config, `--limit` prompts), alternating
the two variants `--repeats` times, and prints each run's wall time, job tokens/s and the collections
that ran while lp decoded (their count, the full ones, their summed and longest pause), then the
ratios frozen / thawed. Tokens are the same in both (the collector changes no computation).

    python scripts/bench_gc.py                     # 60 prompts, batch 16, twice each
    python scripts/bench_gc.py --limit 164 --repeats 1
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click
import torch

import lp.engine
from lp.jobs.config import load_config
from lp.jobs.runner import run_job

ROOT = Path(__file__).resolve().parents[1]


class Pauses:
    """The collections that run while `on` is true: count, full ones, summed and longest seconds."""

    def __init__(self):
        self.on, self.started = False, 0.0
        self.count = self.full = 0
        self.seconds = self.longest = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self.started = time.perf_counter()
            return
        spent = time.perf_counter() - self.started
        self.count, self.seconds, self.longest = self.count + 1, self.seconds + spent, max(self.longest, spent)
        self.full += info["generation"] == 2


DECODE_BATCH, HEAP_FROZEN = lp.engine.decode_batch, lp.engine.heap_frozen


def decoding_watched(pauses: Pauses, frozen: bool):
    """lp.engine.decode_batch with `pauses` watching while it runs, the heap frozen (lp's) or not."""
    def watched(*args, **kwargs):
        lp.engine.heap_frozen = HEAP_FROZEN if frozen else contextlib.nullcontext
        pauses.on = True
        try:
            yield from DECODE_BATCH(*args, **kwargs)
        finally:
            pauses.on = False
            lp.engine.heap_frozen = HEAP_FROZEN
    return watched


@click.command()
@click.option("--config", default=str(ROOT / "configs" / "humaneval-smollm2-batched.yaml"), show_default=True)
@click.option("--limit", default=60, show_default=True, type=click.IntRange(min=1), help="prompts per run")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1), help="runs of each variant")
@click.option("--threads", type=click.IntRange(min=0), default=0, help="torch CPU threads (0: leave as is)")
def main(config: str, limit: int, repeats: int, threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
    import lp.jobs.runner as runner
    rows, pauses = [], Pauses()
    gc.callbacks.append(pauses)
    for run in range(repeats):
        for frozen in (False, True):
            with tempfile.TemporaryDirectory() as out:
                cfg = load_config(config, [f"data.limit={limit}", f"output.dir={out}"])
                if not runner.batched(cfg):
                    raise click.BadParameter(f"{config}: a batched lookahead job (generation.batch_size > 1) is "
                                             f"what this watches", param_hint="--config")
                pauses.__init__()
                runner.decode_batch = decoding_watched(pauses, frozen)
                summary = run_job(cfg)
            rows.append(dict(variant="frozen" if frozen else "thawed", run=run + 1,
                             wall=summary["wall_seconds"], tps=summary["job_tokens_per_second"],
                             tokens=summary["new_tokens"], count=pauses.count, full=pauses.full,
                             ms=1000 * pauses.seconds, longest=1000 * pauses.longest))
            r = rows[-1]
            print(f"{r['variant']:>6} run {r['run']}: {r['wall']:6.1f} s wall, {r['tps']:6.1f} job tok/s, "
                  f"{r['tokens']} tokens; collections while decoding {r['count']} ({r['full']} full), "
                  f"{r['ms']:.0f} ms, longest {r['longest']:.0f} ms", flush=True)
    gc.callbacks.remove(pauses)

    def median(variant, key):
        return statistics.median(r[key] for r in rows if r["variant"] == variant)
    if len({r["tokens"] for r in rows}) != 1:
        sys.exit("the variants decoded different token counts: the collector must change no computation")
    print(f"frozen / thawed (medians): job tok/s {median('frozen', 'tps') / median('thawed', 'tps'):.3f}x, "
          f"collector time {median('frozen', 'ms') / max(median('thawed', 'ms'), 1e-9):.3f}x, "
          f"longest pause {median('frozen', 'longest') / max(median('thawed', 'longest'), 1e-9):.3f}x")


if __name__ == "__main__":
    main()
