"""Run a job: `python -m lp.run --config FILE.yaml [--set section.key=value ...] [--quiet]`.

Order of work, cheapest checks first: config (exit 2 on any problem), prompts,
output directory (config.yaml written there), model, then one lookahead
generation per prompt. Each prompt's record is appended to
<output.dir>/results.jsonl as soon as it is done (flushed and fsynced);
summary.json is written atomically at the end.

All file output goes through JobOutput, so a multi-process launch can give
rank 0 the real one and the other ranks none.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

import click

from lp.config import ConfigError, JobConfig, load_config
from lp.data import DataError, Prompt, load_prompts
from lp.dist import Comm, init_distributed, shutdown
from lp.engine import GenerationResult, lookahead_generate
from lp.models import ModelLoadError, load_model

logger = logging.getLogger("lp.run")

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"


class JobOutput:
    """The files of one job under output.dir: config.yaml, results.jsonl, summary.json."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.results_path = self.dir / RESULTS_FILE
        self.summary_path = self.dir / SUMMARY_FILE
        self.config_path = self.dir / CONFIG_FILE
        self._results = None

    def start(self, cfg: JobConfig) -> None:
        """Create the directory, save the resolved config, start an empty results file."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.config_path, cfg.to_yaml())
        self._results = self.results_path.open("w", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._results.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._results.flush()
        os.fsync(self._results.fileno())

    def finish(self, summary: dict[str, Any]) -> None:
        self.close()
        _write_atomic(self.summary_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None


def run_job(cfg: JobConfig, comm: Comm | None = None) -> dict[str, Any] | None:
    """Run every prompt of the job. Rank 0 reads the prompts, shares each one's ids
    with the other ranks and writes the results; it returns the summary (also
    written to summary.json), the other ranks return None."""
    comm = comm or Comm()
    lead = comm.rank == 0
    prompts = load_prompts(cfg.data) if lead else []
    if lead:
        logger.info("%d prompts from %s", len(prompts), cfg.data.path or cfg.data.source)
    output = JobOutput(cfg.output.dir) if lead else None
    if output:
        output.start(cfg)
    try:
        t0 = time.perf_counter()
        device = str(comm.device) if comm.world > 1 else cfg.model.device
        loaded = load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
        logger.info("model %s loaded in %.1f s", loaded.name, time.perf_counter() - t0)
        records, queue = [], iter(prompts)
        while True:
            prompt = next(queue, None)
            input_ids = comm.share_ids(loaded.tokenizer.encode(prompt.prompt) if prompt else None)
            if input_ids is None:
                break
            result = lookahead_generate(loaded.model, input_ids, cfg.lookahead, cfg.generation,
                                        eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer,
                                        comm=comm)
            if not lead:
                continue
            record = result_record(prompt, input_ids, result)
            output.append(record)
            records.append(record)
            logger.info("[%d/%d] %s: %d tokens / %d forwards, S=%.2f, %.1f tok/s, %s",
                        len(records), len(prompts), prompt.task_id, result.new_tokens, result.forwards,
                        result.compression, result.new_tokens / max(result.decode_seconds, 1e-9),
                        result.finish_reason)
        if not lead:
            return None
        summary = summarize(records, cfg, loaded.name, comm)
        output.finish(summary)
    finally:
        if output:
            output.close()
    return summary


def result_record(prompt: Prompt, input_ids: list[int], result: GenerationResult) -> dict[str, Any]:
    """One results.jsonl line."""
    return {
        "task_id": prompt.task_id,
        "prompt_tokens": len(input_ids),
        "completion": result.text,
        "token_ids": list(result.token_ids),
        "new_tokens": result.new_tokens,
        "forwards": result.forwards,
        "compression": result.compression,
        "decode_seconds": result.decode_seconds,
        "finish_reason": result.finish_reason,
        "rounds": len(result.emitted_per_round),
        "emitted_per_round": list(result.emitted_per_round),
        "host_seconds": result.host_seconds,
        "rows_per_round": _mean(result.rows_per_round),
        "max_rows_per_round": _mean(result.max_rows_per_round),
        "collectives": result.collectives,
        "bytes_moved": result.bytes_moved,
    }


def summarize(records: list[dict[str, Any]], cfg: JobConfig, model_name: str, comm: Comm) -> dict[str, Any]:
    """Job totals; S is summed tokens over summed forwards (not a mean of per-prompt S)."""
    tokens = sum(r["new_tokens"] for r in records)
    forwards = sum(r["forwards"] for r in records)
    seconds = sum(r["decode_seconds"] for r in records)
    rounds = sum(r["rounds"] for r in records)
    return {
        "model": model_name,
        "prompts": len(records),
        "new_tokens": tokens,
        "forwards": forwards,
        "compression": tokens / forwards if forwards else None,
        "decode_seconds": seconds,
        "tokens_per_second": _rate(tokens, seconds),
        "rounds": rounds,
        "host_ms_per_round": 1000 * sum(r["host_seconds"] for r in records) / rounds if rounds else None,
        "world_size": comm.world,
        "backend": comm.backend,
        # rank 0's rows per round (all ranks are balanced to within one column) and the busiest rank's
        "rows_per_round": _per_round(records, "rows_per_round", rounds),
        "max_rows_per_round": _per_round(records, "max_rows_per_round", rounds),
        "collectives_per_round": sum(r["collectives"] for r in records) / rounds if rounds else None,
        "bytes_per_round": sum(r["bytes_moved"] for r in records) / rounds if rounds else None,
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
        "lookahead": dataclasses.asdict(cfg.lookahead),
        "config": cfg.to_dict(),
    }


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _per_round(records: list[dict[str, Any]], key: str, rounds: int) -> float | None:
    """A per-round mean over the whole job (records weighted by their rounds)."""
    return sum(r[key] * r["rounds"] for r in records) / rounds if rounds else None


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def _write_atomic(path: Path, text: str) -> None:
    """Write text to path via a temp file in the same directory and os.replace."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _rank_prefix(comm: Comm) -> str:
    return f"rank {comm.rank}: " if comm.world > 1 else ""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(code)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE.yaml", help="Job config (YAML).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override one config key (value read as YAML); repeatable.")
@click.option("--quiet", is_flag=True, help="No progress messages, only the final summary.")
def main(config_path: str, overrides: tuple[str, ...], quiet: bool) -> None:
    """Run a Lookahead Decoding job described by a YAML config."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("lp").setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # model loading/conversion bars
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        if int(os.environ.get("RANK", "0")) == 0:
            click.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    try:
        comm = init_distributed(cfg.distributed.backend, cfg.distributed.timeout_s, cfg.model.device)
    except Exception as e:  # noqa: BLE001  (rendezvous, backend or device problems)
        _fail(f"distributed setup failed: {_one_line(e)}", 1)
    try:
        summary = run_job(cfg, comm)
    except (DataError, ModelLoadError, OSError) as e:
        _fail(f"{_rank_prefix(comm)}{e}", 1)
    except Exception as e:  # noqa: BLE001  (a dead peer or a collective timeout ends every rank)
        if comm.world == 1:
            raise
        _fail(f"{_rank_prefix(comm)}worker failed: {_one_line(e)}", 1)
    finally:
        shutdown()
    if summary is None:
        return

    out, n = JobOutput(cfg.output.dir), summary["prompts"]
    reasons = " ".join(f"{k}={v}" for k, v in sorted(summary["finish_reasons"].items()))
    click.echo(f"results: {out.results_path} ({n} prompt{'s' if n != 1 else ''})\n"
               f"summary: {out.summary_path}\n"
               f"S = {_fmt(summary['compression'], '.3f')} ({summary['new_tokens']} tokens / "
               f"{summary['forwards']} forwards), {_fmt(summary['tokens_per_second'], '.1f')} tokens/s, "
               f"host {_fmt(summary['host_ms_per_round'], '.2f')} ms/round, finish: {reasons}\n"
               f"world size {summary['world_size']} ({summary['backend']}), rows/round {_fmt(summary['rows_per_round'], '.1f')}"
               f" (busiest rank {_fmt(summary['max_rows_per_round'], '.1f')}), "
               f"{_fmt(summary['collectives_per_round'], '.1f')} collectives and "
               f"{_fmt(summary['bytes_per_round'], '.0f')} bytes per round")

if __name__ == "__main__":
    main()
