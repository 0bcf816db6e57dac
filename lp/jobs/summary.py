"""What a job reports: one results.jsonl record per prompt, the job summary computed from
those records (so a resumed job gets the same summary as an uninterrupted one), and the
lines printed at the end."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from lp.engine import GenerationResult
from lp.jobs.config import JobConfig
from lp.jobs.data import Prompt, prompt_digest
from lp.jobs.results import JobDir
from lp.parallel.dist import Comm


def result_record(prompt: Prompt, input_ids: list[int], result: GenerationResult, method: str = "lookahead",
                  baseline: GenerationResult | None = None, answer: tuple[str, str] | None = None) -> dict[str, Any]:
    """One results.jsonl line; `answer` is (response, completion) when they are not both the decoded text
    (the chat mode)."""
    response, completion = answer or (result.text, result.text)
    record = {
        "task_id": prompt.task_id,
        "line": prompt.line,
        "prompt_hash": prompt_digest(prompt.prompt),
        "prompt_tokens": len(input_ids),
        "response": response,
        "completion": completion,
        "token_ids": list(result.token_ids),
        "new_tokens": result.new_tokens,
        "forwards": result.forwards,
        "compression": result.compression,
        "decode_seconds": result.decode_seconds,
        "finish_reason": result.finish_reason,
        "error": None,
        "method": method,
        "rounds": len(result.emitted_per_round),
        "emitted_per_round": list(result.emitted_per_round),
        "host_seconds": result.host_seconds if method == "lookahead" else None,
        "rows_per_round": _mean(result.rows_per_round),
        "max_rows_per_round": _mean(result.max_rows_per_round),
        "collectives": result.collectives,
        "bytes_moved": result.bytes_moved,
        # this request's share of the job's forwards (1/requests in each of its rounds) and the rows per
        # request those forwards fed, padding included (decode_batch; one request per forward otherwise)
        "batch_forwards": (sum(1 / b for b in result.batch_per_round) if result.batch_per_round
                           else float(result.forwards)),
        "fed_rows_per_round": _mean(result.fed_rows_per_round or result.rows_per_round),
    }
    if baseline is not None:
        record.update({
            "baseline_token_ids": list(baseline.token_ids),
            "baseline_new_tokens": baseline.new_tokens,
            "baseline_decode_seconds": baseline.decode_seconds,
            "baseline_finish_reason": baseline.finish_reason,
            "baseline_ids_equal": list(baseline.token_ids) == list(result.token_ids),
        })
    return record


def error_record(prompt: Prompt, error: str, input_ids: list[int] | None, method: str) -> dict[str, Any]:
    """The record of a prompt that could not be decoded."""
    return {
        "task_id": prompt.task_id,
        "line": prompt.line,
        "prompt_hash": prompt_digest(prompt.prompt),
        "prompt_tokens": None if input_ids is None else len(input_ids),
        "response": None,
        "completion": None,
        "token_ids": [],
        "new_tokens": 0,
        "forwards": 0,
        "compression": None,
        "decode_seconds": 0.0,
        "finish_reason": "error",
        "error": error,
        "method": method,
    }


@dataclass(frozen=True)
class RunFacts:
    """What only this run knows: its wall time (from the hand-out's start until every LP group is done),
    the task ids it wrote records for (the others were kept from an earlier run) and its start-up
    before the hand-out (the model load; a batched job's row-budget grid)."""
    wall_seconds: float
    task_ids: frozenset[str]
    startup_seconds: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of values, linear between the closest ranks; None when empty."""
    return sorted_percentile(sorted(values), q)


def sorted_percentile(xs: list[float], q: float) -> float | None:
    """percentile() of values sorted ascending already (no sort: a running figure keeps them sorted)."""
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def job_figures(records: list[dict[str, Any]], run: RunFacts | None, dp_size: int, lp_size: int) -> dict[str, Any]:
    """The job as a service: wall time and throughput of this run (the records it wrote, error records
    among them and counted apart, and the tokens it decoded, over its wall time), per-request latency
    (decode seconds of every decoded record: p50, p95, max) and this run's prompt and token counts per
    LP group (each record's `group`; records without one are group 0), every group of the run listed."""
    latency = [r["decode_seconds"] for r in records if r["finish_reason"] != "error"]
    ran = [r for r in records if run is not None and r["task_id"] in run.task_ids]
    wall = run.wall_seconds if run is not None else None
    groups = {k: {"prompts": 0, "new_tokens": 0} for k in range(dp_size)}
    for r in ran:
        g = groups.setdefault(int(r.get("group") or 0), {"prompts": 0, "new_tokens": 0})
        g["prompts"] += 1
        g["new_tokens"] += r["new_tokens"]
    return {
        "dp_size": dp_size,
        "lp_size": lp_size,
        "wall_seconds": wall,
        "startup_seconds": run.startup_seconds if run is not None else None,
        "job_prompts": len(ran),
        "job_errors": sum(r["finish_reason"] == "error" for r in ran),
        "job_new_tokens": sum(r["new_tokens"] for r in ran),
        "job_prompts_per_second": len(ran) / wall if wall else None,
        "job_tokens_per_second": tokens_per_second(sum(r["new_tokens"] for r in ran), wall or 0.0),
        "latency_p50_s": percentile(latency, 50),
        "latency_p95_s": percentile(latency, 95),
        "latency_max_s": max(latency) if latency else None,
        "groups": [{"group": k, **v} for k, v in sorted(groups.items())],
    }


def summarize(records: list[dict[str, Any]], cfg: JobConfig, model_name: str, comm: Comm,
              evaluation: list[dict[str, Any]] | None = None, parsed: list[bool] | None = None,
              run: RunFacts | None = None, linear_kernels: str = "torch") -> dict[str, Any]:
    """Job totals over the decoded records (error records only counted); S is summed tokens over
    summed forwards (not a mean of per-prompt S). `parsed`: per decoded record, whether its completion
    is code that parses (code sources). `run`: this run's wall time and records (job_figures).
    `linear_kernels`: what the model's linears ran on (LoadedModel.linear_kernels)."""
    ok = [r for r in records if r["finish_reason"] != "error"]
    tokens = sum(r["new_tokens"] for r in ok)
    forwards = sum(r["forwards"] for r in ok)
    seconds = sum(r["decode_seconds"] for r in ok)
    rounds = sum(r["rounds"] for r in ok)
    host = [r["host_seconds"] for r in ok]
    summary = {
        "model": model_name,
        "linear_kernels": linear_kernels,
        "method": cfg.generation.method,
        "prompts": len(records),
        "errors": len(records) - len(ok),
        "new_tokens": tokens,
        "forwards": forwards,
        "compression": tokens / forwards if forwards else None,
        "decode_seconds": seconds,
        "tokens_per_second": tokens_per_second(tokens, seconds),
        "rounds": rounds,
        "host_ms_per_round": (1000 * sum(host) / rounds if rounds and None not in host else None),
        "world_size": comm.job_world,
        "backend": comm.backend,
        **job_figures(records, run, comm.dp_size, comm.world),
        # rows rank 0 fed per round and rows the busiest rank fed (counted from the ids each packed)
        "rows_per_round": _per_round(ok, "rows_per_round", rounds),
        # batched decoding: requests per forward and rows per forward (every request's, padding included)
        **batch_figures(ok),
        "max_rows_per_round": _per_round(ok, "max_rows_per_round", rounds),
        "collectives_per_round": sum(r["collectives"] for r in ok) / rounds if rounds else None,
        "bytes_per_round": sum(r["bytes_moved"] for r in ok) / rounds if rounds else None,
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
        "lookahead": cfg.to_dict()["lookahead"],
    }
    if cfg.baseline.enabled:
        compared = [r for r in ok if "baseline_token_ids" in r]     # (a resume with --force: not every record)
        b_tokens = sum(r["baseline_new_tokens"] for r in compared)
        b_seconds = sum(r["baseline_decode_seconds"] for r in compared)
        rate = tokens_per_second(sum(r["new_tokens"] for r in compared), sum(r["decode_seconds"] for r in compared))
        b_rate = tokens_per_second(b_tokens, b_seconds)
        summary.update({
            "baseline_prompts": len(compared),
            "baseline_new_tokens": b_tokens,
            "baseline_decode_seconds": b_seconds,
            "baseline_tokens_per_second": b_rate,
            "speedup": rate / b_rate if rate and b_rate else None,
            "baseline_ids_equal_fraction": (sum(r["baseline_ids_equal"] for r in compared) / len(compared)
                                            if compared else None),
        })
    if parsed is not None:
        summary.update({"parsed": sum(parsed), "parse_fraction": sum(parsed) / len(parsed) if parsed else None})
    if evaluation is not None:
        passed = sum(e["passed"] for e in evaluation)
        summary.update({"evaluated": len(evaluation), "passed": passed,
                        "pass_at_1": passed / len(evaluation) if evaluation else None})
    summary["config"] = cfg.to_dict()
    return summary


def _errors_note(errors: int) -> str:
    return f" ({errors} error{'s' if errors != 1 else ''})" if errors else ""


# what this run did (its wall time and the records it wrote: fewer after a resume)
RUN_KEYS = frozenset({"wall_seconds", "startup_seconds", "job_prompts", "job_errors", "job_new_tokens",
                      "job_prompts_per_second", "job_tokens_per_second", "groups"})
# summary keys that vary run to run
TIMING_KEYS = frozenset({"decode_seconds", "tokens_per_second", "host_ms_per_round", "baseline_decode_seconds",
                         "baseline_tokens_per_second", "speedup", "latency_p50_s", "latency_p95_s",
                         "latency_max_s"}) | RUN_KEYS


def batch_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean requests per forward and rows per forward over the decoded records (each record carries its
    share of the forwards it was in and the rows per request they fed)."""
    forwards = sum(r.get("batch_forwards", r["forwards"]) for r in records)
    rounds = sum(r["rounds"] for r in records)
    rows = sum(r.get("fed_rows_per_round", r["rows_per_round"]) * r["rounds"] for r in records)
    return {"batch_forwards": forwards, "mean_batch": rounds / forwards if forwards else None,
            "rows_per_forward": rows / forwards if forwards else None}


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _per_round(records: list[dict[str, Any]], key: str, rounds: int) -> float | None:
    """A per-round mean over the whole job (records weighted by their rounds)."""
    return sum(r[key] * r["rounds"] for r in records) / rounds if rounds else None


def tokens_per_second(tokens: int, seconds: float) -> float | None:
    """Tokens per second, None when no time was measured."""
    return tokens / seconds if seconds > 0 else None


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else format(value, spec) + unit


def report(summary: dict[str, Any], cfg: JobConfig) -> str:
    """The lines printed at the end of a job."""
    job, n = JobDir(cfg.output.dir), summary["prompts"]
    reasons = " ".join(f"{k}={v}" for k, v in sorted(summary["finish_reasons"].items()))
    extra = len(job.result_files()[1:]) if job.dir.is_dir() else 0
    lines = [
        f"results: {job.results_path}{f' and {extra} results.group<k>.jsonl' if extra else ''} "
        f"({n} prompt{'s' if n != 1 else ''}, {summary['errors']} error"
        f"{'s' if summary['errors'] != 1 else ''})",
        f"summary: {job.summary_path}",
        f"samples: {job.samples_path}",
        f"S = {_fmt(summary['compression'], '.3f')} ({summary['new_tokens']} tokens / "
        f"{summary['forwards']} forwards, {summary['method']}), {_fmt(summary['tokens_per_second'], '.1f')} "
        f"tokens/s, host {_fmt(summary['host_ms_per_round'], '.2f')} ms/round, finish: {reasons}",
        f"world size {summary['world_size']} ({summary['backend']}), rows/round "
        f"{_fmt(summary['rows_per_round'], '.1f')} (busiest rank {_fmt(summary['max_rows_per_round'], '.1f')}), "
        f"{_fmt(summary['collectives_per_round'], '.1f')} collectives and "
        f"{_fmt(summary['bytes_per_round'], '.0f')} bytes per round; {_fmt(summary['mean_batch'], '.2f')} "
        f"requests and {_fmt(summary['rows_per_forward'], '.1f')} rows per forward "
        f"(generation.batch_size {cfg.generation.batch_size})",
        f"{summary['dp_size']} LP group{'s' if summary['dp_size'] != 1 else ''} of {summary['lp_size']} "
        f"(prompts per group {'/'.join(str(g['prompts']) for g in summary['groups']) or '-'}); this run: "
        f"{summary['job_prompts']} prompts{_errors_note(summary['job_errors'])} in "
        f"{_fmt(summary['wall_seconds'], '.1f', ' s')} wall "
        f"(after {_fmt(summary['startup_seconds'], '.1f', ' s')} of start-up), "
        f"{_fmt(summary['job_prompts_per_second'], '.2f')} prompts/s, "
        f"{_fmt(summary['job_tokens_per_second'], '.1f')} tokens/s; latency p50 "
        f"{_fmt(summary['latency_p50_s'], '.2f', ' s')}, p95 {_fmt(summary['latency_p95_s'], '.2f', ' s')}, max "
        f"{_fmt(summary['latency_max_s'], '.2f', ' s')}",
    ]
    if "speedup" in summary:
        lines.append(f"baseline (generate): {_fmt(summary['baseline_tokens_per_second'], '.1f')} tokens/s, "
                     f"speedup {_fmt(summary['speedup'], '.2f', 'x')}, "
                     f"ids equal to the baseline on "
                     f"{_fmt(summary['baseline_ids_equal_fraction'], '.1%')} of {summary['baseline_prompts']} prompts")
    if "parsed" in summary:
        lines.append(f"completions that parse as Python: {summary['parsed']}/{n - summary['errors']} "
                     f"({_fmt(summary['parse_fraction'], '.1%')})")
    if "pass_at_1" in summary:
        lines.append(f"pass@1 = {_fmt(summary['pass_at_1'], '.3f')} ({summary['passed']}/{summary['evaluated']}"
                     f" passed; {job.eval_path})")
    return "\n".join(lines)
