"""Linear kernels on the CPU: one engine round's forward (lp.measure.cost_model.round_forward: the
static cache, the round's mask, logits of every row) at 1..N rows, on the stock model
(`F.linear`, MKL) and on the same model with oneDNN-packed linears (lp.models.use_onednn_linears),
measured side by side in one run.

Prints, per row count: the median ms of each, both as a ratio to the stock model's 1-row forward
(what a plain greedy step costs on the stock kernels), and the oneDNN forward as a ratio to its own
1-row forward (what a round costs in plain steps when both run on oneDNN, as lp's jobs and
bench_core compare them).

    python scripts/bench_kernels.py --threads 2
    python scripts/bench_kernels.py --rows 1,4,16,64 --prefix 800 --dtype bfloat16
"""
from __future__ import annotations

import json

import click
import torch

from bench_util import writable_file
from lp.measure.cost_model import forward_curve
from lp.models import ModelLoadError, load_model


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--rows", default="1,2,4,8,12,16,24,32,48,64", show_default=True, help="row counts, comma-separated")
@click.option("--prefix", default=400, show_default=True, type=click.IntRange(min=0),
              help="cached tokens before the round")
@click.option("--repeats", default=7, show_default=True, type=click.IntRange(min=1),
              help="timed passes over the row counts (median)")
@click.option("--threads", type=click.IntRange(min=0), default=0, help="torch CPU threads (0: leave as is)")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, callback=writable_file)
def main(model_name, dtype, rows, prefix, repeats, threads, json_out):
    if threads:
        torch.set_num_threads(threads)
    try:
        rows_list = sorted({int(r) for r in rows.split(",")})
    except ValueError:
        raise click.BadParameter(f"{rows!r}: expected comma-separated row counts", param_hint="--rows")
    if not rows_list or rows_list[0] < 1:
        raise click.BadParameter(f"{rows!r}: row counts must be >= 1", param_hint="--rows")
    try:
        stock = load_model(model_name, dtype, "cpu")
        fast = load_model(model_name, dtype, "cpu", cpu_linear="onednn")
    except ModelLoadError as e:
        raise click.BadParameter(str(e), param_hint="--model") from None
    if fast.linear_kernels != "onednn":
        raise click.ClickException("oneDNN's packed linears do not apply with this torch build on this CPU")
    curves = {}
    for _ in range(2):      # alternate the two models twice: a load change hits both
        for name, loaded in (("torch", stock), ("onednn", fast)):
            curve = forward_curve(loaded.model, prefix, rows_list, repeats)
            for point in curve:
                curves.setdefault(name, {}).setdefault(point["rows"], []).append(point["seconds"])
    ms = {name: {r: 1000 * min(v) for r, v in c.items()} for name, c in curves.items()}
    base, own = ms["torch"][rows_list[0]], ms["onednn"][rows_list[0]]
    click.echo(f"model {model_name} {dtype}, prefix {prefix}, torch threads {torch.get_num_threads()}; "
               f"one round forward, ms (median of {repeats}, best of 2 passes)\n")
    click.echo(f"{'rows':>5} {'torch ms':>9} {'onednn ms':>10} {'torch/t1':>9} {'onednn/t1':>10} {'onednn/o1':>10}")
    table = []
    for r in rows_list:
        t, o = ms["torch"][r], ms["onednn"][r]
        table.append(dict(rows=r, torch_ms=t, onednn_ms=o, torch_vs_torch1=t / base, onednn_vs_torch1=o / base,
                          onednn_vs_onednn1=o / own))
        click.echo(f"{r:>5} {t:>9.1f} {o:>10.1f} {t / base:>9.2f} {o / base:>10.2f} {o / own:>10.2f}")
    click.echo(f"\nt1 / o1: the {rows_list[0]}-row forward on torch / on oneDNN linears")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"model": model_name, "dtype": dtype, "prefix": prefix, "threads": torch.get_num_threads(),
                       "rows": table}, f, indent=2)


if __name__ == "__main__":
    main()
