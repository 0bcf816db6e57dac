"""Cost model of one LP round, and the measurements it is built from.

A round of Lookahead Parallelism on P workers costs

    t_round(P) = t_fwd(r_max) + t_verify + t_gather(P) + t_host

- `t_fwd(r)`: one forward of r new rows over a realistic prefix in the K/V cache, measured on the
  device (`forward_curve`, rows 1..512 geometric) and read off by piecewise-linear interpolation
  between the measured points (`forward_time`; linear extrapolation past the ends), after lowering
  any point above a later one (a forward of more rows is never cheaper: that is noise). A straight line
  a + b*r (`fit_linear`, least squares) is reported beside it: on a CPU the curve is close to linear,
  on a GPU it is flat up to some hundreds of rows and the interpolation follows that knee.
- `r_max`: the busiest rank's rows per round (`max_rows_per_round` of a job summary): the round
  waits for the slowest rank.
- `t_verify`: the device-side verification after the forward (argmax, the candidates' hits, the
  payload, the decision read back on the host), measured with the engine's own functions on
  synthetic logits of the job's W, N, G (`measure_verify`). Small next to a real model's forward,
  not next to a tiny one's.
- `t_gather(P)`: one all_gather of the fixed-size payload among P processes (`measure_collective`;
  0 for P = 1), timed as a round issues it: after rank 0's broadcast of the candidates and each
  rank's forward of its rows, so it includes the ranks' skew and wake-up, not only the wire latency
  (that bare latency is `measure_collective` without a model). The broadcast itself happens before
  the forward and is inside the measured host time, so it is not counted twice.
- `t_host`: host time per round outside forward -> verification -> gathered payload
  (`host_ms_per_round` of a job summary).

Against autoregressive decoding (one token per forward of one row), with S tokens per round:

    speedup(P) = S * t_fwd(1) / t_round(P)

The pure functions here take plain numbers; `forward_curve` / `measure_collective` measure them.

Splitting W workers into dp LP groups of lp (`project_splits`; W = dp * lp): every group decodes one
request at a time, its rows spread over lp ranks, so with R rows per round for one worker (one of
them the ordinary row every rank feeds)

    r_max(lp)   = 1 + (R - 1) / lp
    t_round(lp) = t_fwd(r_max(lp)) + t_verify + t_gather(lp) + t_host
    latency     = (tokens per request / S) * t_round(lp)      (one request's decode time)
    throughput  = dp * S / t_round(lp) tokens/s               (dp requests in flight, no tail)

`t_gather(lp)` = gather_s * ceil(log2 lp) (a tree/ring all-gather of a few hundred bytes; 0 for
lp = 1). Each worker is assumed to have its own device (a GPU each); on a CPU whose cores the
workers share, measure the curve with that many processes side by side (`measure_job_curve`).
`python -m lp.measure.cost_model --curve FILE ...` prints the table for every split.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time
from functools import partial
from typing import Sequence

import torch

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


# ---- pure functions ------------------------------------------------------------------------------------------


def fit_linear(curve: Sequence[dict]) -> tuple[float, float]:
    """Least-squares (a, b) of seconds = a + b * rows over `curve` ([{rows, seconds}, ...])."""
    xs = [float(p["rows"]) for p in curve]
    ys = [float(p["seconds"]) for p in curve]
    if not xs:
        raise ValueError("empty forward curve")
    if len(set(xs)) == 1:
        return statistics.fmean(ys), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def monotone(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(rows, seconds) sorted by rows, each time lowered to the least time of any larger row count:
    a forward of more rows is never cheaper, so a point above a later one is a noise spike."""
    out, low = [], float("inf")
    for x, y in sorted(points, reverse=True):
        low = min(low, y)
        if out and out[-1][0] == x:     # the same row count measured twice: its least time
            out[-1] = (x, low)
        else:
            out.append((x, low))
    return out[::-1]


def forward_time(curve: Sequence[dict], rows: float) -> float:
    """t_fwd(rows): piecewise-linear interpolation of the measured curve made non-decreasing
    (`monotone`), with linear extrapolation past its ends (never below 0)."""
    pts = monotone([(float(p["rows"]), float(p["seconds"])) for p in curve])
    if not pts:
        raise ValueError("empty forward curve")
    if len(pts) == 1:
        return pts[0][1]
    if rows <= pts[0][0]:
        (x0, y0), (x1, y1) = pts[0], pts[1]
    elif rows >= pts[-1][0]:
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
    else:
        i = next(k for k in range(1, len(pts)) if pts[k][0] >= rows)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return max(y0 + (y1 - y0) * (rows - x0) / (x1 - x0), 0.0)


def project_round_seconds(curve: Sequence[dict], max_rows: float, collective_s: float, host_s: float,
                          verify_s: float = 0.0) -> float:
    """t_round = t_fwd(max rows of any rank) + verification + one all_gather + host time (seconds)."""
    return forward_time(curve, max_rows) + verify_s + collective_s + host_s


def projected_speedup(compression: float, curve: Sequence[dict], round_s: float) -> float:
    """S * t_fwd(1) / t_round: tokens per second of LP over those of one-row autoregressive decoding."""
    return compression * forward_time(curve, 1) / round_s


def batched(summary: dict) -> float | None:
    """A summary's mean requests per forward where a forward held more than one (a batched job's), else
    None: the model prices a round as one request's forward, which such a job's per-round figures are not
    (its rounds overlap in the forwards the requests share)."""
    mean = summary.get("mean_batch")
    return mean if isinstance(mean, (int, float)) and not isinstance(mean, bool) and mean > 1 + 1e-9 else None


def project(summary: dict, curve: Sequence[dict], collective_s: float, verify_s: float = 0.0) -> dict:
    """Projected and measured per-round seconds and speedup for one job summary (summary.json)."""
    rounds = summary.get("rounds") or 0
    host_s = (summary.get("host_ms_per_round") or 0.0) / 1000
    round_s = project_round_seconds(curve, summary["max_rows_per_round"], collective_s, host_s, verify_s)
    return {
        "projected_round_ms": 1000 * round_s,
        "measured_round_ms": 1000 * summary["decode_seconds"] / rounds if rounds else None,
        "projected_forward_ms": 1000 * forward_time(curve, summary["max_rows_per_round"]),
        "verify_ms": 1000 * verify_s,
        "collective_ms": 1000 * collective_s,
        "projected_speedup": projected_speedup(summary["compression"], curve, round_s)
        if summary.get("compression") else None,
    }


def gather_seconds(lp: int, gather_s: float) -> float:
    """t_gather(lp): gather_s per doubling of the group (0 for one worker)."""
    return gather_s * math.ceil(math.log2(lp)) if lp > 1 else 0.0


def splits(world: int) -> list[tuple[int, int]]:
    """Every (dp, lp) with dp * lp = world, from one group of `world` to `world` groups of one."""
    return [(world // lp, lp) for lp in range(world, 0, -1) if world % lp == 0]


def project_splits(curve: Sequence[dict], world: int, compression: float, rows_per_round: float,
                   tokens_per_request: float, host_s: float = 0.0, verify_s: float = 0.0,
                   gather_s: float = 0.0) -> list[dict]:
    """Per (dp, lp) split of `world` workers: projected round time, per-request latency and job
    throughput (module docstring). `rows_per_round`: rows one worker feeds per round (R)."""
    out = []
    for dp, lp in splits(world):
        max_rows = 1 + (rows_per_round - 1) / lp
        round_s = project_round_seconds(curve, max_rows, gather_seconds(lp, gather_s), host_s, verify_s)
        tokens_per_s = dp * compression / round_s
        out.append({"dp": dp, "lp": lp, "max_rows": max_rows, "round_ms": 1000 * round_s,
                    "latency_s": tokens_per_request / compression * round_s, "tokens_per_s": tokens_per_s,
                    "prompts_per_s": tokens_per_s / tokens_per_request})
    return out


def splits_table(rows: Sequence[dict]) -> str:
    """The projection of every split as a fixed-width table."""
    lines = [f"{'dp x lp':>8} {'rows/rank':>9} {'round ms':>9} {'latency s':>10} {'tokens/s':>10} {'prompts/s':>10}"]
    for r in rows:
        lines.append(f"{r['dp']:>3} x {r['lp']:<2} {r['max_rows']:>9.1f} {r['round_ms']:>9.3f} {r['latency_s']:>10.3f} "
                     f"{r['tokens_per_s']:>10.1f} {r['prompts_per_s']:>10.3f}")
    return "\n".join(lines)


def find_curves(data, path: str = "") -> list[tuple[str, list[dict]]]:
    """Every forward curve ([{rows, seconds}, ...]) in a JSON document, with where it lies
    (`stages/eager/llama-7b/forward_curve`): scripts/gpu_check.py's report (one under `forward_curve` per
    stage and model), a sweep's cost/curve-*.json (under `curve`), or a bare list."""
    if isinstance(data, list) and data and all(isinstance(p, dict) and {"rows", "seconds"} <= set(p) for p in data):
        return [(path, data)]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    return [found for key, child in items if isinstance(child, (dict, list))
            for found in find_curves(child, f"{path}/{key}" if path else str(key))]


def find_curve(data, which: str | None = None) -> list[dict] | None:
    """The forward curve in a JSON document (find_curves); where it holds several (a gpu_check report of
    several models or stages), the one whose place contains `which`; ValueError when that is not one."""
    found = find_curves(data)
    if which is not None:       # a whole part of the place (llama-7b, not codellama-7b), else any part of it
        found = ([(path, curve) for path, curve in found if which in path.split("/")]
                 or [(path, curve) for path, curve in found if which in path])
    if len(found) > 1:
        raise ValueError(f"it holds {len(found)} forward curves ({', '.join(path for path, _ in found)}); "
                         f"choose one by a part of its place")
    return found[0][1] if found else None


# ---- measurements --------------------------------------------------------------------------------------------


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _probe_plan(ids: Sequence[int], past: int, logits: bool):
    """A round of `ids` over `past` cached tokens: ordinary rows (a prefill: z*'s logits only), or
    with `logits` one ordinary row and the rest a chain of tree nodes (every row's logits, as a
    round's drafts get them)."""
    from lp.decode.layout import build_round
    from lp.decode.request import RoundPlan
    from lp.decode.tree import EMPTY, tree_of

    tree = tree_of([tuple(ids[1:])]) if logits and len(ids) > 1 else EMPTY
    ordinary = ids[:1] if logits else list(ids)
    return RoundPlan(build_round(ordinary, past + len(ordinary) - 1, [], tree), tree, range(len(tree)))


def _probe_rounds(model, prefix: int, batch: int, rows_list: Sequence[int]) -> dict[int, object]:
    """Closures running one round's forward as lp.engine runs it (lp.decode.batch: `batch` requests
    of `rows` new rows each over `prefix` cached tokens apiece, one cache row per request, the mask
    built on the device from the uploaded rows, attention over the slots in use, every row's
    logits), their argmax read back on the host; one per rows count, over one cache whose
    prefixes are written once: row 0's by a prefill, the others copied from it (a forward's time
    does not depend on what the cache holds, and `batch` prefills would cost more than the grid)."""
    from lp.decode.arch import input_vocab, text_config
    from lp.decode.batch import forward_round, pack_round
    from lp.decode.device import Uploader
    from lp.decode.kv_cache import attended, copy_prefix, round_cache
    from lp.decode.verify import greedy_ids

    gen = torch.Generator().manual_seed(prefix * 1000 + 100 * batch + max(rows_list))
    vocab = input_vocab(model) or text_config(model.config).vocab_size     # a multimodal config holds no vocab_size
    random_ids = lambda k: torch.randint(vocab, (k,), generator=gen).tolist()  # noqa: E731
    cache = round_cache(model, prefix + max(rows_list), batch)
    uploader = Uploader(next(model.parameters()).device)

    def prepared(past: int, k: int, first: int, count: int, logits: bool = True):
        plans = [_probe_plan(random_ids(k), past, logits) for _ in range(count)]
        sections, shape = pack_round(plans, [past] * count, list(range(first, first + count)), max(k - 1, 1))
        return uploader.send(sections), shape, attended(past + shape.q, cache.length)

    with torch.inference_mode():
        if prefix:
            dev, shape, span = prepared(0, prefix, 0, 1, logits=False)
            forward_round(model, dev, 1, shape, 0, cache, span=span)
            for row in range(1, batch):
                copy_prefix(cache, 0, row, prefix)

    def closure(rows: int):
        dev, shape, span = prepared(prefix, rows, 0, batch)

        @torch.inference_mode()
        def run():
            logits, *_ = forward_round(model, dev, batch, shape, 0, cache, span=span)
            greedy_ids(logits).tolist()
        return run
    return {rows: closure(rows) for rows in rows_list}


def round_forward(model, prefix: int, rows: int):
    """A closure running one engine round's forward of `rows` rows over `prefix` cached tokens
    (`_probe_rounds` with one request)."""
    return _probe_rounds(model, prefix, 1, [rows])[rows]


def forward_curve(model, prefix: int, rows_list: Sequence[int], repeats: int, device=None,
                  barrier=None) -> list[dict]:
    """Median seconds of one engine round's forward (`round_forward`) of `rows` new rows over a
    `prefix`-token cache, for each of `rows_list`; `barrier` is waited on before each forward
    (processes measuring side by side stay in step)."""
    runs = [(rows, round_forward(model, prefix, rows)) for rows in rows_list]
    device = next(model.parameters()).device
    times = {rows: [] for rows in rows_list}
    # whole passes over the row counts, so a burst of load on a shared machine spoils one sample of
    # each row count rather than every sample of one; the first pass warms up
    for _ in range(repeats + 1):
        for rows, run in runs:
            if barrier is not None:
                barrier.wait()
            sync(device)
            t = time.perf_counter()
            run()
            sync(device)
            times[rows].append(time.perf_counter() - t)
    return [{"rows": rows, "seconds": statistics.median(times[rows][1:])} for rows in rows_list]


def batch_curve(model, prefix: int, batches: Sequence[int], rows_list: Sequence[int], repeats: int,
                most: int = 512) -> list[dict]:
    """Seconds of one batched round's forward (`_probe_rounds`) for each batch size and rows per
    request, with at most `most` rows in all (a batch of more than `most` requests: its fewest rows
    each only): [{"batch", "rows", "seconds"}]; the fastest of
    `repeats` timed passes: whatever else runs on the device only adds time (on the 2-core CPU,
    the 16-request, 1-row cell as the median of two passes read 71.6, 72.6 and 84.5 ms in three
    start-ups)."""
    device = next(model.parameters()).device
    out = []
    for b in batches:          # one batch size's cache at a time (a job holds one batch's cache)
        runs = _probe_rounds(model, prefix, b, [r for r in rows_list if b * r <= most] or [min(rows_list)])
        times = {r: [] for r in runs}
        for _ in range(repeats + 1):     # whole passes; the first warms up
            for r, run in runs.items():
                sync(device)
                t = time.perf_counter()
                run()
                sync(device)
                times[r].append(time.perf_counter() - t)
        out += [{"batch": b, "rows": r, "seconds": min(ts[1:])} for r, ts in times.items()]
    return out


def batch_forward_time(curve: Sequence[dict], batch: int, rows: float) -> float:
    """Seconds of a batched forward of `batch` requests of `rows` rows each, read off `batch_curve`'s
    points: along rows for the measured batch sizes on either side (`forward_time`), then linearly
    between them (extended past the largest)."""
    sizes = sorted({p["batch"] for p in curve})
    at = lambda b: forward_time([p for p in curve if p["batch"] == b], rows)  # noqa: E731
    lo = max((b for b in sizes if b <= batch), default=sizes[0])
    hi = min((b for b in sizes if b >= batch), default=sizes[-1])
    if lo == hi:
        if batch <= sizes[-1] or len(sizes) == 1:
            return at(lo)
        lo, hi = sizes[-2], sizes[-1]
    t_lo, t_hi = at(lo), at(hi)
    return max(t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo), 0.0)


CURVE_PREFIX = 256    # cached tokens the row budget's forward-time curve is measured over


def curve_prefix(model, rows: int) -> int:
    """The cached tokens the grid is measured over: CURVE_PREFIX, less where the model's context (a learned
    position table ends there) would not hold it and a round of `rows` rows after it."""
    from lp.decode.arch import position_limit

    limit = position_limit(model.config)
    return CURVE_PREFIX if limit is None else max(0, min(CURVE_PREFIX, limit - rows))


def curve_batches(batch_size: int) -> list[int]:
    """The request counts the row budget's grid measures: 1, 4, 16, ... up to the batch size, and
    the batch size. The budget reads the sizes between linearly (batch_forward_time): a forward's
    time grows about linearly in the requests at a fixed row count, and a measured cell is itself
    only as steady as two timings of one forward, so cells between these sizes would lengthen the
    start-up more than they would sharpen the budget (docs/configuration.md gives the start-up it
    takes)."""
    return sorted({4 ** k for k in range(batch_size.bit_length()) if 4 ** k <= batch_size} | {batch_size})


def row_costs(model, params, batch_size: int, prompts: Sequence[Sequence[int]]) -> dict:
    """The row budget's costs on the model's device, for batches of up to `batch_size` requests with
    the lookahead `params` (a LookaheadParams): {"curve": seconds of one batched round's forward by
    requests and rows per request (batch_curve: `curve_batches` requests, by powers of two of rows up
    to what a round can feed, at most 64 per request, 512 in all; read off linearly past them),
    "draft_seconds": host seconds of one request's drafting in a round (draft_time, on the first
    `batch_size` of `prompts`' ids)}."""
    from lp.decode.request import round_rows_bound

    most = min(64, round_rows_bound(params, params.width))
    rows = [1 << k for k in range(7) if 1 << k <= 2 * most]
    curve = batch_curve(model, curve_prefix(model, max(rows)), curve_batches(batch_size), rows, repeats=2)
    return {"curve": curve, "draft_seconds": draft_time(params, list(prompts)[:batch_size])}


def budget_kwargs(costs: dict | None) -> dict:
    """lp.engine.decode_batch's row budget arguments from `row_costs`' costs (None: no budget)."""
    if costs is None:
        return {}
    return {"row_cost": partial(batch_forward_time, costs["curve"]), "draft_cost": costs["draft_seconds"]}


def draft_time(params, prompts: Sequence[Sequence[int]], repeats: int = 3) -> float:
    """Median host seconds of one request's drafting in a budgeted round (lp.engine.Rounds.propose:
    its proposer's candidates and their chances, ranked; `params` a LookaheadParams), over
    `prompts`, each drafting from its own prompt and, with a job cache, from an index of the other
    prompts (standing in for the job's earlier completions); a first pass warms up."""
    from lp.decode.budget import Acceptance, ranked_chances
    from lp.decode.propose import Proposer, job_cache

    corpus = job_cache(params)
    for ids in prompts if corpus is not None else ():
        corpus.add(ids)        # its own copy has nothing after the context's end: it never matches
    proposers, acceptance = [Proposer(params, ids, corpus) for ids in prompts], Acceptance()
    times = []
    for _ in range(repeats + 1):
        for proposer in proposers:
            t = time.perf_counter()
            ranked_chances(proposer.candidates(), acceptance, params.tree_budget or None)
            times.append(time.perf_counter() - t)
    return statistics.median(times[len(proposers):]) if proposers else 0.0


@torch.inference_mode()
def measure_verify(window: int, ngram: int, guesses: int, rows: int, vocab: int, device="cpu",
                   repeats: int = 50) -> float:
    """Median seconds of a round's device-side verification (lp.engine's path after the forward:
    argmax of the frame of [rows, vocab] logits, node_mismatch and path_verdicts of a tree of
    `guesses` chains, pack_payloads, decide on the payload read back), on synthetic logits."""
    from lp.decode.tree import tree_of
    from lp.decode.verify import (decide, frame_ancestors, greedy_ids, node_frame, node_mismatch, pack_payloads,
                                  path_verdicts)

    device = torch.device(device)
    s, deep_slots = ngram - 1, window + ngram - 2
    tree = tree_of([tuple(range(c * s, (c + 1) * s)) for c in range(guesses)])
    nodes = len(tree)
    rows = max(rows, 1 + nodes + window)
    logits = torch.randn(1, rows, vocab, device=device)
    frame = {k: torch.tensor([v], device=device) for k, v in node_frame(tree, range(nodes), nodes, s, ends=True).items()}
    ancestors = frame_ancestors(frame["end"])
    meta = torch.tensor([[0, window, rows]], device=device)
    times = []
    for _ in range(repeats + 3):
        sync(device)
        t = time.perf_counter()
        predicted = greedy_ids(logits[:, rows - window - 1 - nodes:])      # deep cells, z*, nodes
        off_path = node_mismatch(predicted[:, window:], frame["tok"], frame["par"], ancestors)
        hits, node, after, _ = path_verdicts(predicted[:, window], off_path, predicted[:, window + 1:],
                                             frame["depth"], frame["step"], meta[:, 0], s)
        payload = pack_payloads(predicted[:, window], hits, node, meta[:, 1:], after, predicted[:, :window],
                                deep_slots)
        decide(payload.tolist(), s)
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_worker(rank: int, world: int, port: int, numel: int, repeats: int, backend: str, queue,
                   cfg=None, prefix: int = 0, rows: int = 1, candidates: int = 0) -> None:
    import torch.distributed as dist

    from lp.parallel.dist import _all_gather_single

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        round_forward = _round_forward(cfg, prefix, rows, device) if cfg is not None else None
        payload = torch.full((numel,), rank, dtype=torch.long, device=device)
        out = torch.empty(world * numel, dtype=torch.long, device=device)
        shared = torch.zeros(max(candidates, 1), dtype=torch.long)   # a CPU tensor, as the engine's
        cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else None   # over gloo (NCCL: GPU only)
        times = []
        dist.barrier()
        for _ in range(repeats + 3):
            if round_forward is None:
                dist.barrier()
            else:   # the engine's round: rank 0 broadcasts the candidates, every rank runs its rows
                dist.broadcast(shared, 0, group=cpu_group)
                round_forward()
            t = time.perf_counter()
            _all_gather_single()(out, payload)
            out[:1].tolist()   # the engine reads the gathered payload on the host
            times.append(time.perf_counter() - t)
        if rank == 0:   # the mean: a round's measured time is a mean, and waits have a long tail
            queue.put(statistics.fmean(times[3:]) if cfg is not None else statistics.median(times[3:]))
    finally:
        dist.destroy_process_group()


def _round_forward(cfg, prefix: int, rows: int, device):
    """`round_forward` on the job's model, loaded on `device` (a CUDA rank) or the job's device."""
    from lp.models import load_model

    model = load_model(cfg.model.name, **{**cfg.model.load_kwargs(),
                                          "device": str(device) if device.type == "cuda" else cfg.model.device}).model
    return round_forward(model, prefix, rows)


def measure_collective(world: int, numel: int = 64, repeats: int = 100, backend: str = "gloo",
                       cfg=None, prefix: int = 0, rows: int = 1, candidates: int = 0) -> float:
    """Seconds of one all_gather of an int64 [numel] payload among `world` local processes.

    Without `cfg` the ranks enter each all_gather together (a barrier first): the bare latency
    (median).
    With a job config (lp.jobs.config.JobConfig) each all_gather follows what an LP round does before
    it: rank 0 broadcasts a [candidates] buffer and every rank runs a masked forward of `rows` rows
    over a `prefix` cache; the time then includes the ranks' skew and wake-up, as in a round (mean,
    like the measured per-round time it is compared with: on a shared CPU the waits have a long tail)."""
    if world <= 1:
        return 0.0
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.start_processes(_gather_worker, args=(world, _free_port(), numel, repeats, backend, queue, cfg,
                                                 prefix, rows, candidates),
                           nprocs=world, join=True, start_method="spawn")
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
    return queue.get()


def measure_job_curve(cfg, prefix: int, rows_list: Sequence[int] = ROWS, repeats: int = 9,
                      threads: int | None = 1, concurrent: int = 1) -> list[dict]:
    """The forward curve of a job config's model (lp.jobs.config.JobConfig) on its device, with the
    engine's masked forward; `threads` fixes torch's CPU threads (the sweep runs ranks with one).

    concurrent: on a CPU device, P workers share the machine's cores and memory bandwidth, so the
    curve is measured by that many processes at once (rank 0's curve is returned); a GPU rank has
    its device to itself and is measured alone."""
    if concurrent > 1 and _job_device(cfg).type == "cpu":
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue, barrier = ctx.SimpleQueue(), ctx.Barrier(concurrent)
        mp.start_processes(_curve_worker, args=(cfg, prefix, list(rows_list), repeats, threads, barrier, queue),
                           nprocs=concurrent, join=True, start_method="spawn")
        return queue.get()
    return _measure_curve(cfg, prefix, rows_list, repeats, threads)


def _job_device(cfg) -> torch.device:
    from lp.models import _device

    return torch.device(_device(cfg.model.device))


def _measure_curve(cfg, prefix, rows_list, repeats, threads, barrier=None):
    from lp.models import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    loaded = load_model(cfg.model.name, **cfg.model.load_kwargs())
    return forward_curve(loaded.model, prefix, list(rows_list), repeats, barrier=barrier)


def _curve_worker(rank, cfg, prefix, rows_list, repeats, threads, barrier, queue):
    curve = _measure_curve(cfg, prefix, rows_list, repeats, threads, barrier)
    if rank == 0:
        queue.put(curve)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def main(argv: Sequence[str] | None = None) -> None:
    """python -m lp.measure.cost_model --curve FILE [--summary summary.json] [--world 8] ...: the
    projected round time, per-request latency and job throughput of every dp x lp split."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m lp.measure.cost_model", description=main.__doc__)
    ap.add_argument("--curve", required=True, help="JSON holding a forward curve (gpu_check's report, a sweep's "
                                                   "cost/curve-*.json, or a list of {rows, seconds})")
    ap.add_argument("--curve-of", metavar="PART", help="the curve of a --curve file that holds several (gpu_check's: "
                                                       "one per stage and model): a part of its place, e.g. llama-7b")
    ap.add_argument("--summary", help="a job's summary.json: S, rows per round, host ms and tokens per request "
                                      "from it (a run of one worker, lp_size 1, at batch_size 1, gives the rows R)")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--compression", type=float, help="S (tokens per round)")
    ap.add_argument("--rows", type=float, help="rows one worker feeds per round (R)")
    ap.add_argument("--tokens", type=float, help="new tokens per request")
    ap.add_argument("--host-ms", type=float, help="host ms per round")
    ap.add_argument("--verify-ms", type=float, default=0.0)
    ap.add_argument("--gather-ms", type=float, default=0.05, help="all-gather ms per doubling of the group")
    a = ap.parse_args(argv)

    def read(option: str, path: str):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"{option}: cannot read {path}: {getattr(e, 'strerror', None) or e}")
    try:
        curve = find_curve(read("--curve", a.curve), a.curve_of)
    except ValueError as e:
        ap.error(f"--curve: {a.curve}: {e} with --curve-of")
    if not curve:
        ap.error(f"--curve: no forward curve in {a.curve}" + (f" whose place contains {a.curve_of!r}"
                                                               if a.curve_of else ""))
    bad = [p for p in curve if not all(_finite(p[k]) and p[k] >= 0 for k in ("rows", "seconds"))]
    if bad:
        ap.error(f"--curve: {a.curve} holds points whose rows and seconds are not finite numbers >= 0: {bad[:3]}")
    s = read("--summary", a.summary) if a.summary else {}
    if not isinstance(s, dict):
        ap.error(f"--summary: {a.summary} is not a job's summary.json")
    if a.world < 1:
        ap.error(f"--world: {a.world} must be >= 1")
    decoded = (s.get("prompts") or 0) - (s.get("errors") or 0)
    given = lambda value, fallback: value if value is not None else fallback  # noqa: E731  (0 is a value)
    figures = {
        "compression": given(a.compression, s.get("compression")),
        "rows": given(a.rows, s.get("rows_per_round")),
        "tokens": given(a.tokens, s["new_tokens"] / decoded if decoded and "new_tokens" in s else None),
        "host_ms": given(a.host_ms, s.get("host_ms_per_round") or 0.0),
    }
    missing = [k for k, v in figures.items() if v is None]
    if missing:
        ap.error(f"give --{' --'.join(k.replace('_', '-') for k in missing)}" + (f" (the summary {a.summary} has no decoded prompt)"
                                                    if a.summary else " or --summary"))
    taken = [k for k in figures if getattr(a, k) is None]      # the figures read from the summary
    lp_size = s.get("lp_size")
    if taken and batched(s):
        ap.error(f"--summary: {a.summary} is a batched run's ({batched(s):.2f} requests per forward): its "
                 f"per-round figures are shared by a forward's requests, and the model prices one request per "
                 f"forward. Give a run's at generation.batch_size 1, or --{' --'.join(k.replace('_', '-') for k in taken)}")
    if isinstance(lp_size, int) and lp_size > 1 and {"rows", "host_ms"} & set(taken):
        ap.error(f"--summary: {a.summary} is an LP group's (lp_size {lp_size}): its rows and host ms per round "
                 f"are rank 0's share, not one worker's R. Give a run's at lp_size 1, or --rows and --host-ms")
    # S and R are at least 1 (a round emits a token and feeds a row), the times finite and >= 0
    values = {**figures, "verify_ms": a.verify_ms, "gather_ms": a.gather_ms}
    least = {"compression": 1, "rows": 1, "tokens": 0, "host_ms": 0, "verify_ms": 0, "gather_ms": 0}
    rule = lambda k: "> 0" if k == "tokens" else f">= {least[k]}"  # noqa: E731
    wrong = [k for k, low in least.items()
             if not (_finite(values[k]) and (values[k] > low if k == "tokens" else values[k] >= low))]
    if wrong:       # a figure not given as an option came from the summary
        summary_only = {k for k in figures if getattr(a, k) is None}
        ap.error("; ".join(f"--{k.replace('_', '-')}{' (from --summary)' if k in summary_only else ''}: "
                           f"{values[k]!r} must be a finite number {rule(k)}" for k in wrong))
    rows = project_splits(curve, a.world, figures["compression"], figures["rows"], figures["tokens"],
                          figures["host_ms"] / 1000, a.verify_ms / 1000, a.gather_ms / 1000)
    print(f"{a.world} workers, S = {figures['compression']:.3f}, {figures['rows']:.1f} rows/round on one worker, "
          f"{figures['tokens']:.0f} tokens/request, host {figures['host_ms']:.3f} ms, verify {a.verify_ms:.3f} ms, "
          f"all-gather {a.gather_ms:.3f} ms per doubling; t_fwd(1) = {1000 * forward_time(curve, 1):.3f} ms")
    print(splits_table(rows))


if __name__ == "__main__":
    main()
