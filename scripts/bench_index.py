"""The job cache's host memory and time: lp.decode.suffix.SuffixIndex grown with a job's completions,
bounded (`most_tokens`, the job cache's JOB_CACHE_TOKENS unless `--most`) and unbounded, in one run.

The completions are random code-like sequences (`--completions` of `--tokens` each, drawn from a
3,000-word vocabulary with Zipf-like frequencies over a 49,152-id tokenizer, seeded). For each
variant it prints the tokens kept and the traced Python memory (tracemalloc) after each quarter of the
completions, then, in a second pass without tracing, the seconds to add them all and to draw
`--drafts` drafts and lookups at the end (contexts from the latest completions, which both variants
hold: a context the bounded index forgot matches shorter and costs more to draft from); and the
ratios bounded / unbounded.

    python scripts/bench_index.py                              # 2,000 x 500 tokens, bound 250,000
    python scripts/bench_index.py --completions 4000 --most 1048576
"""
from __future__ import annotations

import random
import sys
import time
import tracemalloc
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lp.decode.propose import SUFFIX_NGRAM  # noqa: E402
from lp.decode.suffix import SuffixIndex  # noqa: E402


def completions(count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    r = random.Random(seed)
    words = [r.randrange(49152) for _ in range(3000)]
    return [[words[min(int(r.paretovariate(1.1)) - 1, 2999)] for _ in range(tokens)] for _ in range(count)]


def grown(seqs: list[list[int]], most: int | None, traced: bool) -> tuple[SuffixIndex, list[tuple[int, int, int]]]:
    """The index of `seqs` added in order; with `traced`, (completions, tokens kept, traced bytes) at
    each quarter."""
    index, marks = SuffixIndex(SUFFIX_NGRAM, most_tokens=most), []
    quarters = {len(seqs) * q // 4 for q in (1, 2, 3, 4)}
    if traced:
        tracemalloc.start()
    for k, seq in enumerate(seqs, 1):
        index.add(seq)
        if traced and k in quarters:
            marks.append((k, len(index), tracemalloc.get_traced_memory()[0]))
    if traced:
        tracemalloc.stop()
    return index, marks


@click.command()
@click.option("--completions", "count", default=2000, show_default=True, help="completions added")
@click.option("--tokens", default=500, show_default=True, help="tokens per completion")
@click.option("--most", default=250_000, show_default=True, help="the bounded index's most_tokens")
@click.option("--drafts", default=2000, show_default=True, help="drafts and lookups timed at the end")
def main(count: int, tokens: int, most: int, drafts: int) -> None:
    if min(count, tokens, most, drafts) < 1:
        raise click.BadParameter("--completions, --tokens, --most and --drafts must be >= 1")
    seqs = completions(count, tokens)
    kept = seqs[-max(1, min(count, most // tokens)):]          # the completions both variants hold
    contexts = [seq[:k] for seq, k in zip(kept * (drafts // len(kept) + 1),
                                          random.Random(1).choices(range(8, tokens + 1), k=drafts))]
    figures = {}
    for name, bound in (("unbounded", None), ("bounded", most)):
        _, marks = grown(seqs, bound, traced=True)
        for k, kept, size in marks:
            print(f"{name:>9}: {k:>6} completions, {kept:>9,} tokens kept, {size / 2**20:8.1f} MiB traced "
                  f"({size / max(kept, 1):5.0f} bytes a kept token)", flush=True)
        t0 = time.perf_counter()
        index, _ = grown(seqs, bound, traced=False)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        for context in contexts:
            index.draft(context, 32, 8.0, 0.1)
            index.spans(context, 2, 16, 3)
        drawn = time.perf_counter() - t0
        figures[name] = (marks[-1][2], built, drawn)
        print(f"{name:>9}: added in {built:.2f} s ({1e6 * built / (count * tokens):.1f} us a token), "
              f"{drafts} drafts and lookups in {1000 * drawn:.0f} ms", flush=True)
    (mb, tb, db), (mu, tu, du) = figures["bounded"], figures["unbounded"]
    print(f"bounded / unbounded: memory {mb / mu:.3f}x, adding {tb / tu:.3f}x, drafts {db / du:.3f}x")


if __name__ == "__main__":
    main()
