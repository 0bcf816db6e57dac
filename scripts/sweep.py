"""Strong-scaling sweep: one torchrun job per grid point, a CSV of their summaries, PNG plots and the
cost model's projected per-round time next to the measured one.

    PYTHONPATH=. python scripts/sweep.py --config configs/sweeps/cpu-smoke.yaml [--output DIR]

A sweep file is

    base: configs/example-jsonl.yaml      # a job config file, or an inline job mapping
    grid:                                 # points = the cartesian product of these lists
      world_size: [1, 2]                  # special key: torchrun's --nproc-per-node
      lp_size: [1, 2]                     # special key: distributed.lp_size (workers per LP group)
      lookahead.window: [7, 15]           # any section.key of a job config
    output: runs/sweeps/NAME              # optional; --output wins; default runs/sweeps/<file stem>

Any other top-level key, a grid key output.dir (the sweep sets each point's), both lp_size and
distributed.lp_size, and a value listed twice in one grid list are refused (exit 2, one line), as are two points that would get the same name.
Each point's job config is written to DIR/points/<point>.yaml with output.dir DIR/points/<point>, and run
as `python -m torch.distributed.run --standalone --nproc-per-node=P -m lp.run --config ... --quiet`
(PYTHONPATH = the repository root, OMP_NUM_THREADS=1; the output goes to DIR/logs/<point>.log). A
finished point (its summary.json counts a decoded prompt) is skipped (a rerun does no work). A point
directory holding results made with another job config than the sweep's now (points/<point>.yaml, every key
but FIGURE_NEUTRAL_KEYS: where results go, evaluation, the timeout, the prompt file's path) refuses the whole
sweep up front (exit 2, naming the point and the keys): its figures are the old config's. Use another
--output or remove that point's directory. A point that
fails is recorded as failed with its error and the sweep goes on; one that runs past --timeout is stopped
with its whole process group (torchrun and its workers). DIR/sweep.csv gets one row per point, and DIR holds
speedup_vs_world_size.png, compression_vs_rows.png, tokens_per_second_vs_world_size.png and
latency_vs_throughput.png (per-request latency p50, with p95, against job tokens/s over the wall time:
one point per (world_size, lp_size) split). A point whose lp_size does not divide its world size is
recorded as failed with lp.run's own message. The latency/throughput table is printed at the end.
sweep.csv's prompts and job_prompts are the summary's (all prompts; those the run that wrote it decoded): a
point resumed after an interrupted sweep has job_prompts < prompts, and its wall_seconds,
job_prompts_per_second and job_tokens_per_second (that run's alone) are left empty, with a warning.

Cost model (lp/measure/cost_model.py): the model's forward-time curve is measured once per model and world size
(rows 1..512, prefix = the point's mean prompt length plus half its mean output, the engine's masked
forward, one CPU thread like each rank; on a CPU by P processes side by side, since P ranks share its cores),
and one all_gather per world size; both are cached under DIR/cost/, as is the verification time (per model,
device, window, ngram, guesses and max rows per round). The projected
per-round time t_fwd(max rows per rank) + t_verify + t_gather(P) + host ms is printed beside the measured one
(decode_seconds / rounds) and both go into sweep.csv. The all_gather is measured among lp_size
processes (an LP group), the curve with world_size processes side by side (all of them share the CPU).
Finally the cost model projects latency and throughput of every dp x lp split of 8 workers from the
curve of the first point with lp_size 1 (one worker per group: its rows are one worker's rows;
lp.measure.cost_model.project_splits) and prints the table.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench_util import exit_on_term_and_hangup, seconds  # noqa: E402
from lp.measure.cost_model import batched  # noqa: E402
from lp.messages import one_line  # noqa: E402
from lp.processes import stop_tree  # noqa: E402
from lp.jobs.config import (ConfigError, baseline_section, differences, environment_problems,  # noqa: E402
                             load_config_dict, read_yaml, yaml_text)

SUMMARY_FIELDS = ("world_size", "dp_size", "lp_size", "backend", "errors", "compression", "tokens_per_second",
                  "baseline_tokens_per_second", "speedup", "rows_per_round", "max_rows_per_round", "host_ms_per_round",
                  "collectives_per_round", "bytes_per_round", "decode_seconds", "rounds", "new_tokens",
                  "wall_seconds", "job_prompts_per_second", "job_tokens_per_second", "latency_p50_s",
                  "latency_p95_s", "latency_max_s")
SPECIAL = ("world_size", "lp_size")     # grid keys that are not a section.key
TOP_KEYS = ("base", "grid", "output")    # the keys of a sweep file
COST_FIELDS = ("measured_round_ms", "projected_round_ms", "projection_error", "projected_forward_ms",
               "verify_ms", "collective_ms", "projected_speedup")
# a job's figures over the wall time of the run that wrote its summary (lp.jobs.summary.job_figures): of a
# resumed point, only the prompts that run decoded
RUN_FIELDS = ("wall_seconds", "job_prompts_per_second", "job_tokens_per_second")
PLOTS = ("speedup_vs_world_size.png", "compression_vs_rows.png", "tokens_per_second_vs_world_size.png",
         "latency_vs_throughput.png")


class SweepError(ValueError):
    pass


# ---- the sweep file -----------------------------------------------------------------------------------------


def load_sweep(path: Path) -> tuple[dict, dict[str, list], str | None]:
    """(base job mapping, grid, output dir from the file or None)."""
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SweepError(f"cannot read sweep file {path}: {one_line(e, named=False)}") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with `base:` and `grid:`")
    unknown = [str(k) for k in raw if k not in TOP_KEYS]
    if unknown:
        raise SweepError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} (a sweep file has {', '.join(TOP_KEYS)})")
    if "grid" not in raw:
        raise SweepError(f"{path}: a sweep file is a mapping with `base:` and `grid:`")
    output = raw.get("output")
    if output is not None and (not isinstance(output, str) or not output.strip()):
        raise SweepError(f"{path}: output must be a directory path (a string); got {output!r}")
    base = raw.get("base") or {}
    if isinstance(base, str):
        candidates = [Path(base), path.parent / base, ROOT / base]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise SweepError(f"{path}: base job config {base!r} not found")
        try:
            base = read_yaml(found.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise SweepError(f"{path}: cannot read base job config {found}: {one_line(e, named=False)}") from None
    if not isinstance(base, dict):
        raise SweepError(f"{path}: base must be a job config path or a job mapping")
    grid = raw["grid"]
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"{path}: grid must map config keys (or world_size) to lists of values")
    grid = {str(k): (v if isinstance(v, list) else [v]) for k, v in grid.items()}
    for key, values in grid.items():
        if not values:
            raise SweepError(f"{path}: grid.{key} is an empty list")
        if key not in SPECIAL and len(key.split(".")) != 2:
            raise SweepError(f"{path}: grid key {key!r} must be world_size, lp_size or section.key")
        if key == "output.dir":
            raise SweepError(f"{path}: grid key 'output.dir' cannot be swept: the sweep sets each point's "
                             f"output.dir (DIR/points/<point>)")
        if key == "distributed.lp_size" and "lp_size" in grid:
            raise SweepError(f"{path}: grid keys 'lp_size' and 'distributed.lp_size' name one setting; keep one")
        seen: set[str] = set()
        twice = [v for v in values if _canonical(v) in seen or seen.add(_canonical(v))]
        if twice:
            raise SweepError(f"{path}: grid.{key} lists {', '.join(map(repr, twice))} more than once "
                             f"(each value is one point)")
    wrong = [v for v in grid.get("world_size", []) if not isinstance(v, int) or isinstance(v, bool)]
    if wrong:
        raise SweepError(f"{path}: grid.world_size values must be integers (workers per point); got "
                         f"{', '.join(map(repr, wrong))}")
    return base, grid, output


def _canonical(value) -> str:
    """A grid value as its YAML type and value (1, 1.0 and true are three values; [1] and [1] one)."""
    return json.dumps(value, sort_keys=True, default=repr)


def points(grid: dict[str, list]) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_name(point: dict) -> str:
    parts = []
    ordered = {**{k: point[k] for k in SPECIAL if k in point}, **point}   # P<world>_L<lp> first
    for key, value in ordered.items():
        short = {"world_size": "P", "lp_size": "L"}.get(key) or key.split(".")[-1]
        parts.append(f"{short}{value}" if key in SPECIAL else f"{short}-{value}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts)) or "point"


def point_config(base: dict, point: dict, out_dir: Path) -> dict:
    raw = copy.deepcopy(base)
    if "baseline" in raw:
        raw["baseline"] = baseline_section(raw["baseline"])
    for key, value in point.items():
        if key == "world_size":
            continue
        section, name = ("distributed", "lp_size") if key == "lp_size" else key.split(".")
        if not isinstance(raw.get(section), dict):
            raw[section] = {}
        raw[section][name] = value
    raw.setdefault("output", {})
    raw["output"]["dir"] = str(out_dir)
    return raw


def plan(base: dict, grid: dict[str, list], out: Path) -> list[tuple[str, dict, dict]]:
    """(name, point, job mapping) of every point; SweepError where two points would share a name (and so
    a directory: the second would take the first's results for its own)."""
    planned = []
    for point in points(grid):
        name = point_name(point)
        planned.append((name, point, point_config(base, point, out / "points" / name)))
    names = [name for name, _, _ in planned]
    same = sorted({n for n in names if names.count(n) > 1})
    if same:
        raise SweepError(f"points {', '.join(same)} would share a directory: two grid values (or keys) give "
                         f"the same point name; rename them")
    return planned


def changed_points(planned: list[tuple[str, dict, dict]], out: Path) -> list[str]:
    """`<point> (key: old -> new; ...)` for every point whose directory holds results (a summary or
    records) made with a job config other than the one the sweep would run now: a finished one would be
    skipped, its old figures taken for the new config's."""
    found = []
    for name, _, raw in planned:
        point_dir = Path(raw["output"]["dir"])
        if not ((point_dir / "summary.json").is_file() or any(point_dir.glob("results*.jsonl"))):
            continue
        recorded = next((p for p in (out / "points" / f"{name}.yaml", point_dir / "config.yaml") if p.is_file()),
                        None)
        if recorded is None:
            continue
        try:
            old = read_yaml(recorded.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            found.append(f"{name} ({recorded} cannot be read: {one_line(e, named=False)})")
            continue
        changes = config_changes(old, raw)
        if changes:
            found.append(f"{name} ({'; '.join(changes)})")
    return found


# keys whose change leaves a finished point's figures as they are: where results go, evaluation, the
# collectives' timeout and where the prompt file lies (lp.run's resume also lets data.limit/offset,
# lp_size and the backend change, since it recomputes the summary; a skipped point does not)
FIGURE_NEUTRAL_KEYS = ("output.dir", "output.evaluate", "output.evaluate_timeout_s", "distributed.timeout_s",
                       "data.path")


def config_changes(old, new: dict) -> list[str]:
    """`section.key: old -> new` for every key but FIGURE_NEUTRAL_KEYS whose value differs between the
    checked configs; none when the new one is not valid (its point fails with lp.run's own message)."""
    try:
        current = load_config_dict(copy.deepcopy(new))
    except ConfigError:
        return []
    try:
        recorded = load_config_dict(copy.deepcopy(old))
    except ConfigError as e:
        return [f"the recorded config is not a valid job config now: {e.problems[0]}"]
    return differences(recorded, current, ignore=FIGURE_NEUTRAL_KEYS)


# ---- running one point ----------------------------------------------------------------------------------------


def run_point(name: str, point: dict, raw: dict, out: Path, timeout_s: float) -> tuple[str, str | None, bool]:
    """(status, error, skipped) of one point."""
    point_dir = Path(raw["output"]["dir"])
    cfg_path = out / "points" / f"{name}.yaml"
    try:  # a bad key or override fails here with lp's own message, without starting workers (and before a
        # finished point is skipped: its figures are not the invalid config's)
        cfg = load_config_dict(copy.deepcopy(raw), source=str(cfg_path))
    except ConfigError as e:
        return "failed", e.problems[-1] if e.problems else str(e), False
    if finished(point_dir):
        return "ok", None, True
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml_text(raw), encoding="utf-8")
    world = int(point.get("world_size", 1))
    if world < 1:
        return "failed", f"world_size: {world!r} must be >= 1", False
    import torch

    problems = environment_problems(cfg, world, torch.cuda.is_available())   # e.g. an lp_size that does not divide
    if problems:
        return "failed", "; ".join(problems), False
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "lp.run", "--config", str(cfg_path), "--quiet"]
    # its own session, and its output in files, not pipes: on a timeout (or Ctrl-C here) stop_tree stops
    # torchrun and its workers (each in a session of its own), and nothing left alive holds the sweep
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(cmd, env=env, cwd=os.getcwd(), stdout=out_file, stderr=err_file, text=True,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_tree(proc)
        except BaseException:
            stop_tree(proc)
            raise
        finally:        # the log of an interrupted point too
            stdout, stderr = (f.seek(0) or f.read() for f in (out_file, err_file))
            log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", encoding="utf-8")
    if timed_out:
        return "failed", f"timed out after {timeout_s:.0f} s", False
    if proc.returncode == 0 and finished(point_dir):
        return "ok", None, False
    return "failed", last_error_line(stderr) or f"exit status {proc.returncode}", False


def finished(point_dir: Path) -> bool:
    """A point whose job wrote its summary with at least one decoded prompt (lp.run also writes the
    summary of a job whose every prompt was an error, and exits 1)."""
    try:
        summary = json.loads((point_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("errors", 0) < summary.get("prompts", 0)


def resumed(summary: dict) -> bool:
    """Whether the run that wrote the summary decoded only some of its prompts (the others kept from an
    earlier, interrupted run)."""
    ran, total = summary.get("job_prompts"), summary.get("prompts")
    return isinstance(ran, int) and isinstance(total, int) and ran < total


def last_error_line(stderr: str) -> str | None:
    """The worker's own error line when there is one (torchrun prints its report after it): global rank
    0's where the others only say that it refused the job."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for pattern in (r"^error: ", r"\b\w*(Error|Exception)\b: "):
        found = [line for line in lines if re.search(pattern, line)]
        own = [line for line in found if not re.search(r"global rank 0 refused the job", line)]
        if found:
            return (own or found)[-1]
    return lines[-1] if lines else None


# ---- cost model ---------------------------------------------------------------------------------------------


def point_prefix(point_dir: Path) -> int:
    """A realistic cache prefix for the point: mean prompt tokens + half the mean output."""
    decoded = [r for r in _decoded(point_dir) if r.get("prompt_tokens")]
    if not decoded:
        return 128
    prompts = sum(r["prompt_tokens"] for r in decoded) / len(decoded)
    return max(1, round(prompts + sum(r.get("new_tokens") or 0 for r in decoded) / len(decoded) / 2))


def cached(path: Path, compute):
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")
    return value


def cost_figures(row: dict, raw: dict, summary: dict, out: Path) -> dict:
    from lp.measure import cost_model

    cfg = load_config_dict(copy.deepcopy(raw))
    prefix = point_prefix(Path(raw["output"]["dir"]))
    world = int(summary.get("world_size") or 1)
    lp = int(summary.get("lp_size") or world)      # the all-gather's processes: one LP group
    key = json.dumps([cfg.model.name, cfg.model.dtype, cfg.model.device, prefix, world])
    gkey = json.dumps([cfg.model.name, cfg.model.dtype, cfg.model.device, prefix, lp])
    curve_file = out / "cost" / f"curve-{hashlib.sha1(key.encode()).hexdigest()[:10]}.json"
    curve = cached(curve_file, lambda: {"model": cfg.model.name, "dtype": cfg.model.dtype, "prefix": prefix,
                                        "concurrent": world,
                                        "curve": cost_model.measure_job_curve(cfg, prefix, concurrent=world)}
                   )["curve"]
    collective_s = 0.0
    if lp > 1:
        per_collective = (summary.get("bytes_per_round") or 0) / max(summary.get("collectives_per_round") or 1, 1)
        numel = max(1, round(per_collective / 8 / lp))   # int64 payload elements per rank
        backend = summary.get("backend") if summary.get("backend") in ("gloo", "nccl") else "gloo"
        rows = max(1, round(summary.get("rows_per_round") or 1))
        candidates = 1 + cfg.lookahead.guesses * (cfg.lookahead.ngram - 1)
        collective_s = cached(
            out / "cost" / f"gather-{hashlib.sha1(gkey.encode()).hexdigest()[:10]}-{backend}-n{numel}-r{rows}.json",
            lambda: {"seconds": cost_model.measure_collective(lp, numel, backend=backend, cfg=cfg, prefix=prefix,
                                                              rows=rows, candidates=candidates)})["seconds"]
    la = cfg.lookahead
    max_rows = round(summary.get("max_rows_per_round") or 1)
    device = str(cost_model._job_device(cfg))
    # every input of measure_verify: the tree (W, N, G), the rows, the vocabulary (the model's) and device
    vkey = json.dumps([cfg.model.name, device, la.window, la.ngram, la.guesses, max_rows])
    verify_s = cached(out / "cost" / f"verify-{hashlib.sha1(vkey.encode()).hexdigest()[:10]}.json",
                      lambda: {"model": cfg.model.name, "device": device, "window": la.window, "ngram": la.ngram,
                               "guesses": la.guesses, "rows": max_rows,
                               "seconds": cost_model.measure_verify(la.window, la.ngram, la.guesses, max_rows,
                                                                    _vocab(cfg), device)})["seconds"]
    figures = cost_model.project(summary, curve, collective_s, verify_s)
    figures["curve"], figures["verify_s"] = curve, verify_s      # for the splits projection (not in the CSV)
    measured = figures["measured_round_ms"]
    figures["projection_error"] = (figures["projected_round_ms"] / measured - 1) if measured else None
    return figures


def _vocab(cfg) -> int:
    from lp.models import load_model

    return load_model(cfg.model.name, dtype=cfg.model.dtype, device="cpu" if cfg.model.device == "auto"
                      else cfg.model.device).model.config.vocab_size


# ---- plots --------------------------------------------------------------------------------------------------


def plot(rows: list[dict], grid: dict[str, list], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    others = [k for k in grid if k not in SPECIAL]
    split = "lp_size" in grid and len(grid["lp_size"]) > 1     # one line per split along world size
    labelled = (["lp_size"] if split else []) + others

    def series(ykey):
        groups: dict[str, list[tuple[float, float]]] = {}
        for r in ok:
            if r.get(ykey) in (None, ""):
                continue
            label = ", ".join(f"{k}={r[k]}" for k in labelled) or ykey
            groups.setdefault(label, []).append((float(r["world_size"]), float(r[ykey])))
        return {k: sorted(v) for k, v in groups.items()}

    paths = []
    specs = [
        (PLOTS[0], "speedup", "world size P", "speedup over autoregressive", "Speedup vs world size"),
        # the summary's tokens_per_second: one request's decode speed (tokens over its decode seconds), as its
        # baseline's; the job's throughput over the wall time is latency_vs_throughput's
        (PLOTS[2], "tokens_per_second", "world size P", "per-request tokens / s (decode)",
         "Per-request tokens/s vs world size"),
    ]
    for filename, ykey, xlabel, ylabel, title in specs:
        fig, ax = plt.subplots(figsize=(6, 4))
        data = series(ykey)
        for label, pts in data.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if ykey == "tokens_per_second":
            base = series("baseline_tokens_per_second")
            for label, pts in base.items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="x", linestyle="--",
                        label=f"autoregressive ({label})" if labelled else "autoregressive")
        if ykey == "speedup" and data:
            ax.axhline(1.0, color="grey", linewidth=0.8)
        _finish(ax, fig, xlabel, ylabel, title, out / filename, paths,
                empty="no speedup: the base job has no baseline" if ok and ykey == "speedup" else None)
    fig, ax = plt.subplots(figsize=(6, 4))
    pts = [(float(r["rows_per_round"]), float(r["compression"])) for r in ok
           if r.get("rows_per_round") not in (None, "") and r.get("compression") not in (None, "")]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts])
        for r in ok:
            if r.get("rows_per_round") not in (None, "") and r.get("compression") not in (None, ""):
                ax.annotate(r["point"], (float(r["rows_per_round"]), float(r["compression"])), fontsize=7)
    _finish(ax, fig, "rows per round (rank 0)", "S (tokens per forward)", "S vs rows per round",
            out / PLOTS[1], paths)
    fig, ax = plt.subplots(figsize=(6, 4))
    pts = [r for r in ok if r.get("job_tokens_per_second") not in (None, "") and r.get("latency_p50_s") not in (None, "")]
    def series_of(r):     # one line per world size (and other grid values): its lp splits
        return ", ".join([f"P={r['world_size']}", *(f"{k}={r[k]}" for k in others)])

    for label in dict.fromkeys(series_of(r) for r in pts):
        mine = sorted((r for r in pts if series_of(r) == label), key=lambda r: int(r["lp_size"]))
        xs = [float(r["job_tokens_per_second"]) for r in mine]
        line, = ax.plot(xs, [float(r["latency_p50_s"]) for r in mine], marker="o", label=f"{label} p50")
        ax.scatter(xs, [float(r["latency_p95_s"]) for r in mine], marker="^", color=line.get_color(),
                   label=f"{label} p95")
        for r in mine:
            ax.annotate(f"{r['dp_size']}x{r['lp_size']}", (float(r["job_tokens_per_second"]),
                                                          float(r["latency_p50_s"])), fontsize=8)
    _finish(ax, fig, "job tokens / s (wall time)", "per-request latency (s)",
            "Latency vs throughput (dp x lp)", out / PLOTS[3], paths)
    plt.close("all")
    return paths


def _finish(ax, fig, xlabel, ylabel, title, path, paths, empty: str | None = None):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    if not ax.has_data():
        ax.text(0.5, 0.5, empty or "no finished points", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    paths.append(path)


def latency_table(rows: list[dict]) -> str:
    """One line per finished point: the split, the compression S beside the rows per round (rank 0's
    share under LP) that bought it, job throughput over the wall time and per-request latency."""
    lines = ["point                      dp x lp     S  rows/round  wall s  prompts/s  tokens/s  latency p50 s  p95 s  "
             "max s"]
    for r in rows:
        if r["status"] != "ok":
            continue
        f = lambda key, width, digits: (f"{r[key]:>{width}.{digits}f}" if r.get(key) is not None  # noqa: E731
                                        else f"{'-':>{width}}")
        dp_size, lp_size = _fmt(r.get("dp_size")) or "-", _fmt(r.get("lp_size")) or "-"
        lines.append(f"{r['point']:<26} {dp_size:>2} x {lp_size:<2} {f('compression', 5, 2)} "
                     f"{f('rows_per_round', 11, 1)} {f('wall_seconds', 6, 2)} "
                     f"{f('job_prompts_per_second', 10, 2)} {f('job_tokens_per_second', 9, 1)} "
                     f"{f('latency_p50_s', 14, 3)} {f('latency_p95_s', 6, 3)} {f('latency_max_s', 6, 3)}")
    return "\n".join(lines)


def _decoded(point_dir: Path):
    """The point's decoded (non-error) records."""
    results = point_dir / "results.jsonl"
    for path in [results, *sorted(point_dir.glob("results.group*.jsonl"))]:
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r.get("finish_reason") != "error":
                    yield r


# ---- command line -------------------------------------------------------------------------------------------


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Sweep file (YAML): base + grid.")
@click.option("--output", "output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Sweep directory (default: the file's `output`, else runs/sweeps/<file stem>).")
@click.option("--timeout", "timeout_s", type=float, callback=seconds, default=3600.0, show_default=True,
              help="Seconds one point may run.")
@click.option("--no-cost-model", is_flag=True, help="Do not measure the forward curve and collective latency.")
def main(config_path: Path, output: Path | None, timeout_s: float, no_cost_model: bool) -> None:
    """Run every grid point of a sweep (skipping finished ones), write sweep.csv and the plots."""
    exit_on_term_and_hangup()
    try:
        base, grid, file_output = load_sweep(config_path)
    except SweepError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    out = Path(output or file_output or Path("runs/sweeps") / config_path.stem)
    try:
        all_points = plan(base, grid, out)
    except SweepError as e:
        click.echo(f"error: {config_path}: {e}", err=True)
        raise SystemExit(2)
    changed = changed_points(all_points, out)
    if changed:     # a skipped point would report the old config's figures as the new one's
        several = len(changed) > 1
        which = "those points' directories" if several else "that point's directory"
        click.echo(f"error: {out} holds results made with a different job config for point{'s' * several} "
                   f"{'; '.join(changed)}; use another --output directory or remove {which} under "
                   f"{out / 'points'}", err=True)
        raise SystemExit(2)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        click.echo(f"error: sweep directory {out} cannot be used: {e.strerror or e}", err=True)
        raise SystemExit(1)
    rows, start = [], time.perf_counter()
    for i, (name, point, raw) in enumerate(all_points, 1):
        t0 = time.perf_counter()
        status, error, skipped = run_point(name, point, raw, out, timeout_s)
        row = {**point, "point": name, "status": status, "error": error}
        if skipped:
            click.echo(f"[{i}/{len(all_points)}] {name}: skip (finished)")
        else:
            click.echo(f"[{i}/{len(all_points)}] {name}: {status} in {time.perf_counter() - t0:.1f} s"
                       + (f": {error}" if error else ""))
        if status == "ok":
            summary = json.loads((Path(raw["output"]["dir"]) / "summary.json").read_text(encoding="utf-8"))
            row.update({k: summary.get(k) for k in SUMMARY_FIELDS})
            row.update(prompts=summary.get("prompts"), job_prompts=summary.get("job_prompts"))
            if summary.get("errors"):   # error records count as prompts in prompts/s
                click.echo(f"  warning: {name}: {summary['errors']} of {summary['prompts']} prompts are error "
                           f"records (see {Path(raw['output']['dir']) / 'results.jsonl'}); its figures cover "
                           f"the others, its prompts/s counts them all")
            if resumed(summary):     # this run's wall time and throughput cover only the prompts it decoded
                row.update(dict.fromkeys(RUN_FIELDS))
                click.echo(f"  warning: {name} was resumed: its last run decoded {summary['job_prompts']} of "
                           f"{summary['prompts']} prompts, so its wall time and job prompts/s and tokens/s are "
                           f"not the point's; left empty (remove {Path(raw['output']['dir'])} and rerun to "
                           f"measure them)")
            if not no_cost_model and batched(summary):
                click.echo(f"  cost model: no projection for {name}, a batched point ({batched(summary):.2f} "
                           f"requests per forward): it prices one request per forward")
            elif not no_cost_model:
                try:
                    row.update(cost_figures(row, raw, summary, out))
                except Exception as e:  # noqa: BLE001  (the sweep's figures stand without the model)
                    click.echo(f"  cost model failed: {type(e).__name__}: {e}", err=True)
        rows.append(row)
    fields = list(dict.fromkeys([*grid, "point", "status", "error", *SUMMARY_FIELDS, "prompts", "job_prompts",
                                 *COST_FIELDS]))
    with open(out / "sweep.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k)) for k in fields})
    if not no_cost_model:
        click.echo("per-round time, projected (t_fwd(max rows) + verify + all_gather + host) vs measured "
                   "(decode_seconds / rounds):")
        for row in rows:
            if row.get("projected_round_ms") is None:
                continue
            err = row.get("projection_error")
            click.echo(f"  {row['point']}: measured {row['measured_round_ms']:.3f} ms, projected "
                       f"{row['projected_round_ms']:.3f} ms = fwd({row['max_rows_per_round']:.1f} rows) "
                       f"{row['projected_forward_ms']:.3f} + verify {row['verify_ms']:.3f} + gather {row['collective_ms']:.3f} + host "
                       f"{row['host_ms_per_round']:.3f}; "
                       + (f"{100 * err:+.1f}%" if err is not None else "n/a")
                       + (f"; S={row['compression']:.2f}, projected speedup {row['projected_speedup']:.2f}"
                          + (f", measured {row['speedup']:.2f}" if row.get("speedup") else "")
                          if row.get("projected_speedup") else ""))
    click.echo(latency_table(rows))
    if not no_cost_model:
        one = next((r for r in rows if r.get("curve") and int(r.get("lp_size") or 0) == 1), None)
        if one is not None:
            from lp.measure.cost_model import project_splits, splits_table

            decoded = [r["new_tokens"] for r in _decoded(out / "points" / one["point"])]
            tokens = sum(decoded) / max(1, len(decoded))
            pair = next((r for r in rows if r.get("curve") and int(r.get("lp_size") or 0) == 2), None)
            gather_ms = float(pair["collective_ms"]) if pair else 0.0   # one doubling, measured among 2
            click.echo(f"projected splits of 8 workers (the curve, S, rows and host ms of {one['point']}, the "
                       f"all-gather of {pair['point'] if pair else 'none'}: {gather_ms:.3f} ms per doubling; "
                       f"each worker on its own device):")
            click.echo(splits_table(project_splits(one["curve"], 8, float(one["compression"]),
                                                   float(one["rows_per_round"]), tokens,
                                                   float(one["host_ms_per_round"] or 0) / 1000, one["verify_s"],
                                                   gather_ms / 1000)))
    plot(rows, grid, out)
    failed = sum(r["status"] != "ok" for r in rows)
    click.echo(f"wrote {out / 'sweep.csv'} ({len(rows)} points, {failed} failed) and {len(PLOTS)} plots "
               f"in {time.perf_counter() - start:.1f} s")
    if rows and failed == len(rows):      # as a job whose every prompt failed: nothing was measured
        raise SystemExit(1)


if __name__ == "__main__":
    main()
