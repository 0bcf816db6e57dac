"""The job loop behind `python -m lp.run` (lp/run.py is the command line).

Order of work, cheapest checks first: config (exit 2 on any problem), prompts
(exit 1 when the data file is missing), the output directory (resume check:
exit 2 when it holds results of a different config, unless --force), model
(exit 1 when it cannot be loaded), then one generation per prompt not yet in
results.jsonl. A prompt that cannot be decoded (empty, longer than the
model's context, a bad JSONL line) gets an error record and the job goes on.
Each record is appended to <output.dir>/results.jsonl as soon as it is done
(flushed and fsynced); when every prompt has a record, summary.json and
samples.jsonl are written from that file (so a resumed job gets the same
summary as an uninterrupted one), after the optional evaluation (HumanEval or
ClassEval tests). In the chat mode (`data.chat_template`, lp/jobs/code.py) a
record keeps the whole answer (`response`) and the code taken from it
(`completion`, what samples.jsonl and the evaluation use).

Under torchrun rank 0 reads the prompts, owns the output directory and sends
each decodable prompt (its request id, a hash of the task id, and its ids) to the other ranks; a prompt it
rejects is never sent, so the others are unaffected. Before the model is
loaded rank 0 sends one go/stop message, so a startup error on rank 0 ends
the other ranks at once instead of at the collective timeout. Every rank runs
the same decodes in the same order: lookahead together, autoregressive and
baseline decodes each on its own replica (identical work, so the ranks stay in
step for the next prompt).

With `distributed.lp_size` below the world size the ranks form world / lp_size LP
groups (lp.parallel.dist.mesh); each group's leader plays rank 0's part above for
its own group (it reads the prompts, claims them one at a time from the job-wide
counter of lp.jobs.handout and appends to its own results file); global rank 0
alone opens the directory, sends the go/stop and writes the summary once every
group is done.
"""
from __future__ import annotations

import bisect
import contextlib
import logging
import sys
from itertools import islice
import time
from pathlib import Path
from typing import Any, Sequence

from lp.baseline import autoregressive_generate
from lp.decode.arch import input_vocab, logits_size, outside_vocabulary, position_limit
from lp.decode.processors import vocabulary_problem
from lp.decode.propose import job_cache
from lp.decode.sampling import NoDistribution
from lp.decode.suffix import SuffixIndex
from lp.engine import GenerationResult, decode_batch, lookahead_generate
from lp.hf_processing import unapplied_defaults
from lp.jobs.code import chat_completion, chat_message, parses
from lp.jobs.config import CODE_SOURCES, DataSection, JobConfig
from lp.jobs.data import DataError, Prompt, load_prompts, prompt_digest, read_classeval, request_id
from lp.jobs.handout import Handout, store_prefix
from lp.jobs.evaluate import evaluate_classeval, evaluate_humaneval, solution
from lp.jobs.results import JobDir, JobDirError, ResumeRefused
from lp.jobs.summary import RunFacts, error_record, result_record, sorted_percentile, summarize, tokens_per_second
from lp.measure.cost_model import CURVE_PREFIX, budget_kwargs, row_costs
from lp.messages import one_line
from lp.models import LoadedModel, ModelLoadError, load_model, model_digest
from lp.parallel.dist import Comm

logger = logging.getLogger("lp.jobs")


class JobError(RuntimeError):
    """A job that cannot start for a reason found after loading the model (exit 1)."""


class StartRefused(JobError):
    """Another rank of the job: global rank 0 refused the job at startup; this rank ends with its status."""

    def __init__(self, status: int):
        self.status = status
        super().__init__(f"global rank 0 refused the job at startup (exit {status}): its error line says why")


def start_status(failure: BaseException | None) -> int:
    """The exit status global rank 0 stops a job with when it cannot open it (lp.run: 2 for a refused
    resume, 1 otherwise), 0 to go."""
    return 0 if failure is None else 2 if isinstance(failure, ResumeRefused) else 1


def run_job(cfg: JobConfig, comm: Comm | None = None, *, force: bool = False, fresh: bool = False,
            progress: bool = False) -> dict[str, Any] | None:
    """Run every prompt of the job that has no record yet. Global rank 0 returns the summary
    (also written to summary.json); the other ranks return None.

    With several LP groups (distributed.lp_size) global rank 0 opens the output directory first;
    after its go, each other group's leader reads the prompts and attaches to the directory, every
    rank loads the model, and once all have (one barrier: nobody writes before every leader has
    read the kept records) the leaders claim prompts from the job's counter (lp.jobs.handout)."""
    comm = comm or Comm()
    first = comm.job_rank == 0
    job, prompts, failure = None, [], None
    if first:
        try:
            prompts = load_prompts(cfg.data)
            logger.info("%d prompts from %s", len(prompts), cfg.data.path or cfg.data.source)
            digest = model_digest(cfg.model.name)   # a name that finds no model stops the job before open clears
            job = JobDir(cfg.output.dir)
            job.open(cfg, force=force, fresh=fresh, prompt_hashes=_hashes(prompts), model_digest=digest)
        except (DataError, ModelLoadError, JobDirError, ResumeRefused, OSError) as e:
            failure = e
    if comm.job_world > 1 and (status := comm.job_go(start_status(failure))):   # go / stop for every rank
        if first:
            raise failure
        raise StartRefused(status)
    if failure:
        raise failure
    try:
        if comm.lead and not first:     # another LP group's leader
            prompts = load_prompts(cfg.data)
            job = JobDir(cfg.output.dir, comm.dp_rank)
            job.attach()
        t0 = time.perf_counter()
        device = str(comm.device) if comm.job_world > 1 else cfg.model.device
        loaded = load_model(cfg.model.name, **{**cfg.model.load_kwargs(), "device": device})
        if cfg.data.chat_template and not getattr(loaded.tokenizer, "chat_template", None):
            raise JobError(f"data.chat_template is true but the tokenizer of {loaded.name} has no chat template "
                           f"(for a base model set data.chat_template: false)")
        if (limit := position_limit(loaded.model.config)) is not None and cfg.generation.max_new_tokens >= limit:
            raise JobError(f"generation.max_new_tokens={cfg.generation.max_new_tokens} leaves no room for a prompt "
                           f"in the {limit} positions of {loaded.name}: set it below {limit}")
        if problem := vocabulary_problem(cfg.generation, logits_size(loaded.model)):
            raise JobError(problem)
        logger.info("model %s loaded in %.1f s (%s linear kernels)", loaded.name, time.perf_counter() - t0,
                    loaded.linear_kernels)
        if comm.rank == 0 and (unapplied := unapplied_defaults(loaded.model.generation_config, cfg.generation)):
            logger.warning("%s's generation_config sets %s, which model.generate applies by default; a job applies "
                           "its own generation keys only: set them there (generation.<key>) to decode as generate "
                           "does", loaded.name, ", ".join(unapplied))
        handout = Handout(comm.store if comm.dp_size > 1 else None, len(prompts), comm.dp_size)
        costs = None      # the row budget's costs: measured once, kept with the job for a resume
        if budgeted(cfg):   # by global rank 0, the others waiting for it (past timeout_s while it beats)
            costs = comm.rank_0_alone(store_prefix() + "row-budget measurement", lambda: job.read_costs(
                costs_for(cfg)) or job.write_costs(measure_costs(cfg, loaded, prompts), costs_for(cfg)),
                cfg.distributed.timeout_s)
        if comm.dp_size > 1:
            comm.world_barrier()
        if comm.lead and not first and budgeted(cfg):
            costs = job.read_costs(costs_for(cfg))
        start = time.perf_counter()
        if not comm.lead:
            _follow(cfg, loaded, comm)
            handout.wait_complete()
            return None
        bar = Progress(len(prompts), sum(p.task_id in job.records for p in prompts), enabled=progress)
        try:
            _lead(cfg, loaded, comm, prompts, job, bar, handout, costs)
            if not first:
                job.close()     # closed (and fsynced line by line) before the group counts itself done
                handout.done()
                handout.wait_complete()
                return None
            handout.done()
            handout.wait_all(poll=lambda: bar.advance(done=bar.kept + handout.finished()))
        finally:
            bar.close()
        wall = time.perf_counter() - start
        records = job.job_records(p.task_id for p in prompts)
        evaluation = evaluate(cfg, records) if cfg.output.evaluate else None
        parsed = parse_checks(cfg, prompts, records) if cfg.data.source in CODE_SOURCES else None
        summary = summarize(records, cfg, loaded.name, comm, evaluation, parsed,
                            run=RunFacts(wall, frozenset(r["task_id"] for r in records) - job.kept_ids,
                                         startup_seconds=start - t0),
                            linear_kernels=loaded.linear_kernels)
        job.finish(summary, [{"task_id": r["task_id"], "completion": r["completion"]}
                             for r in records if r["finish_reason"] != "error"], evaluation)
        return summary
    finally:
        if job:
            job.close()


def check_job(cfg: JobConfig, *, force: bool = False, fresh: bool = False) -> str:
    """What run_job checks before it loads the model, without loading it or writing anything: the prompts
    load, output.dir can be opened and resumed, and the model can be found (DataError, JobDirError,
    ResumeRefused, ModelLoadError as run_job raises them). Returns one line: how many prompts the job would
    decode."""
    prompts = load_prompts(cfg.data)
    digest = model_digest(cfg.model.name)
    records = JobDir(cfg.output.dir).check(cfg, force=force, fresh=fresh, prompt_hashes=_hashes(prompts),
                                           model_digest=digest)
    left = [p for p in prompts if p.task_id not in records]
    bad = sum(p.error is not None for p in left)
    return (f"{len(left)} of {len(prompts)} prompts to decode into {cfg.output.dir}"
            + (f" ({bad} of them bad lines, to be recorded as errors)" if bad else ""))


def _hashes(prompts: Sequence[Prompt]) -> dict[str, str]:
    """Each task's prompt digest, as its record keeps it (a resume checks them)."""
    return {p.task_id: prompt_digest(p.prompt) for p in prompts}


def evaluate(cfg: JobConfig, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tests of the job's problems run on its completions (HumanEval or ClassEval)."""
    logger.info("evaluating %d completions (%s tests)", len(records), cfg.data.source)
    if cfg.data.source == "classeval":
        return evaluate_classeval(records, read_classeval(Path(cfg.data.path)), standalone(cfg),
                                  cfg.output.evaluate_timeout_s)
    return evaluate_humaneval(records, cfg.output.evaluate_timeout_s)


def standalone(cfg: JobConfig) -> bool:
    """Whether a completion is a whole program rather than the prompt's continuation (lp.jobs.evaluate)."""
    return cfg.data.source == "classeval" and cfg.data.chat_template


def parse_checks(cfg: JobConfig, prompts: list[Prompt], records: list[dict[str, Any]]) -> list[bool]:
    """Per decoded record: the completion holds code (not blank) and its program parses as Python."""
    text = {p.task_id: p.prompt for p in prompts}
    return [bool(r["completion"].strip()) and parses(solution(text[r["task_id"]], r["completion"], standalone(cfg)))
            for r in records if r["finish_reason"] != "error"]


def answer(cfg: JobConfig, prompt: Prompt, text: str) -> tuple[str, str]:
    """(response, completion) of a decoded output: in the chat mode the answer (the response prefix,
    then the output) and the code taken from it; otherwise the output, twice."""
    if not cfg.data.chat_template:
        return text, text
    response = cfg.data.response_prefix + text
    return response, chat_completion(response, prompt.prompt)


# ---- the prompt loop --------------------------------------------------------------------------------------


def _lead(cfg: JobConfig, loaded: LoadedModel, comm: Comm, prompts: list[Prompt], job: JobDir,
          bar: "Progress", handout: Handout, costs: dict | None = None) -> None:
    """A group's leader: decode (and share with its group) every prompt it claims that has no record,
    append each record (with the group's index) to its group's results file, and count it on the
    handout, so that `bar` (global rank 0's) shows every group's records.

    With `generation.batch_size` > 1 the prompts go through lp.engine.decode_batch, up to that many per
    forward: a record is written as each request ends, in the order they end, and the next claim joins
    the batch then; the cache is sized once for the longest of the prompts still to decode (sent to
    the group first). With `lookahead.row_budget` the leader cuts each round's trees to what the
    job's recorded forward-time `curve` says pays (measured once, kept in the output directory).

    With `lookahead.job_cache` the leader grows the job-wide index of completions in the order they
    end: a claimed prompt that already has a record adds its recorded ids when it is claimed, so a
    resumed job drafts from the same completions (with batches, possibly at other rounds than an
    uninterrupted run: tokens are the same, forwards may differ). With one LP group and batch 1 that
    is task order (the dp = 1 behaviour); with several groups, each group's cache holds only the
    completions its own claims brought (tokens stay those of any other split, since greedy and sampled
    output never depend on the candidates, but per-prompt forwards may differ)."""
    todo = [p for p in prompts if p.task_id not in job.records]
    corpus = job_cache(cfg.lookahead) if cfg.generation.method == "lookahead" else None
    if job.kept:
        logger.info("%d of %d prompts already have a record; %d to go", len(prompts) - len(todo),
                    len(prompts), len(todo))
    limit = position_limit(loaded.model.config)
    encoded = {p.task_id: encode_prompt(p, loaded, cfg, limit) for p in todo}

    def claims():
        """(prompt, ids, request) of each claimed prompt to decode, shared with the group as it is taken;
        a prompt that cannot be decoded gets its error record here and is never sent."""
        for index in handout:
            prompt = prompts[index]
            if prompt.task_id in job.records:
                if corpus is not None and job.records[prompt.task_id]["token_ids"]:
                    corpus.add(job.records[prompt.task_id]["token_ids"])
                continue
            ids, error = encoded[prompt.task_id]
            if error is not None:
                fail(prompt, ids, error)
                continue
            request = request_id(prompt.task_id)   # the sampling draws' request: the task's, not its position
            comm.share_ids([request, *ids])
            yield prompt, ids, request
        comm.share_ids(None)  # no more work (only after a clean loop: a failed collective must not hide the error)

    def fail(prompt: Prompt, ids: list[int] | None, error: str) -> None:
        job.append({**error_record(prompt, error, ids, cfg.generation.method), "group": comm.dp_rank})
        logger.warning("%s: error: %s", prompt.task_id, error)
        bar.advance(done=_count(bar, handout))

    if batched(cfg):
        longest = max((len(ids) for ids, error in encoded.values() if error is None), default=1)
        comm.share_ids([longest])
        outcomes = ((prompt, ids, (result, None)) for (prompt, ids), result in
                    decode_batch(loaded.model, (((p, ids), ids, r) for p, ids, r in claims()), cfg.lookahead,
                                 cfg.generation, batch_size=cfg.generation.batch_size, prompt_tokens=longest,
                                 eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, comm=comm,
                                 corpus=corpus, compile_mode=cfg.model.compile,
                                 **budget_kwargs(costs)))
    else:
        outcomes = ((prompt, ids, decode(cfg, loaded, ids, comm, request, shared, corpus))
                    for shared, (prompt, ids, request) in enumerate(claims()))
    with contextlib.closing(outcomes):     # an error here closes decode_batch (its heap_frozen thaws)
        for prompt, ids, (result, base) in outcomes:
            if isinstance(result, Exception):     # a prompt the batch's cache cannot hold, or NoDistribution
                fail(prompt, ids, str(result))
                continue
            if corpus is not None and result.token_ids:
                corpus.add(result.token_ids)
            record = {**result_record(prompt, ids, result, cfg.generation.method, base,
                                      answer=answer(cfg, prompt, result.text)), "group": comm.dp_rank}
            job.append(record)
            bar.advance(result, done=_count(bar, handout))
            logger.info("[%d/%d] %s: %d tokens / %d forwards, S=%.2f, %.1f tok/s, %s%s",
                        bar.done, len(prompts), prompt.task_id, result.new_tokens, result.forwards,
                        result.compression, result.new_tokens / max(result.decode_seconds, 1e-9),
                        result.finish_reason,
                        "" if base is None else
                        f", baseline {tokens_per_second(base.new_tokens, base.decode_seconds) or 0:.1f}"
                        f" tok/s, ids {'equal' if record['baseline_ids_equal'] else 'DIFFER'}")


def _follow(cfg: JobConfig, loaded: LoadedModel, comm: Comm) -> None:
    """Ranks other than 0: run the same decodes as rank 0 until it says there is no more work
    (each message is the request id, then the prompt ids; with batches, the longest prompt first)."""
    def messages():
        while (message := comm.share_ids(None)) is not None:
            yield message[1:], message[0]

    if batched(cfg):
        longest = comm.share_ids(None)[0]
        for _ in decode_batch(loaded.model, ((None, ids, r) for ids, r in messages()), cfg.lookahead,
                              cfg.generation, batch_size=cfg.generation.batch_size, prompt_tokens=longest,
                              eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, comm=comm,
                              compile_mode=cfg.model.compile):
            pass
        return
    for shared, (ids, request) in enumerate(messages()):
        decode(cfg, loaded, ids, comm, request, shared)


def batched(cfg: JobConfig) -> bool:
    """Whether the job decodes several prompts per forward (lp.engine.decode_batch)."""
    return cfg.generation.method == "lookahead" and cfg.generation.batch_size > 1


def budgeted(cfg: JobConfig) -> bool:
    """Whether the job's batched rounds cut their trees by the row budget."""
    return batched(cfg) and cfg.lookahead.row_budget


def costs_for(cfg: JobConfig) -> dict[str, Any]:
    """What the row budget's measured costs hold for: the model section (name, dtype, device, attention,
    compile), the batch size, the lookahead section and the cached prefix the grid is measured over."""
    sections = cfg.to_dict()
    return dict(model=sections["model"], batch_size=cfg.generation.batch_size, lookahead=sections["lookahead"],
                prefix_tokens=CURVE_PREFIX)


def measure_costs(cfg: JobConfig, loaded: LoadedModel, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """The row budget's costs for the job on this device (lp.measure.cost_model.row_costs), its
    drafting timed on the first batch_size prompts that encode."""
    t0 = time.perf_counter()
    limit = position_limit(loaded.model.config)
    encoded = (encode_prompt(p, loaded, cfg, limit) for p in prompts)
    firsts = list(islice((ids for ids, error in encoded if error is None), cfg.generation.batch_size))
    costs = row_costs(loaded.model, cfg.lookahead, cfg.generation.batch_size, firsts)
    logger.info("row budget: forward times of %d cells and drafting (%.2f ms per request) measured in %.1f s",
                len(costs["curve"]), 1000 * costs["draft_seconds"], time.perf_counter() - t0)
    return costs


def decode(cfg: JobConfig, loaded: LoadedModel, ids: list[int], comm: Comm, request: int, shared: int,
           corpus: SuffixIndex | None = None) -> tuple[GenerationResult | Exception, GenerationResult | None]:
    """The job's decode of one prompt, and the baseline's when enabled. The baseline goes first on
    every other prompt, so warm-up and load drift do not favour either side. `corpus` is the
    job-wide index of earlier completions (rank 0 only). A sampled decode that finds no token to draw
    is the prompt's error (NoDistribution), as decode_batch yields it; the baseline's (its draws are
    generate's own) is logged and leaves the record without a baseline."""
    def main() -> GenerationResult | Exception:
        try:
            if cfg.generation.method == "autoregressive":
                return autoregressive_generate(loaded.model, ids, cfg.generation, eos_token_ids=loaded.eos_token_ids,
                                               tokenizer=loaded.tokenizer, request=request)
            return lookahead_generate(loaded.model, ids, cfg.lookahead, cfg.generation,
                                      eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, comm=comm,
                                      request=request, corpus=corpus, compile_mode=cfg.model.compile)
        except NoDistribution as e:
            return e

    def baseline() -> GenerationResult | None:
        try:
            return autoregressive_generate(loaded.model, ids, cfg.generation, eos_token_ids=loaded.eos_token_ids,
                                           tokenizer=loaded.tokenizer, request=request)
        except NoDistribution as e:
            logger.warning("baseline (generate): %s", e)
            return None

    if not cfg.baseline.enabled:
        return main(), None
    if shared % 2:
        result = main()
        return result, None if isinstance(result, Exception) else baseline()
    base = baseline()
    return main(), base


def encode_prompt(prompt: Prompt, loaded: LoadedModel, cfg: JobConfig,
                  limit: int | None) -> tuple[list[int] | None, str | None]:
    """(prompt ids, None), or (ids or None, why this prompt cannot be decoded: for a prompt file's line,
    after its `file:line: `, as lp.jobs.data's errors)."""
    if prompt.error is not None:
        return None, prompt.error
    where = f"{Path(cfg.data.path).name}:{prompt.line}: " if prompt.line is not None and cfg.data.path else ""
    if not prompt.prompt:
        return None, f"{where}prompt is empty"
    try:
        ids = prompt_ids(prompt.prompt, loaded.tokenizer, cfg.data)
    except Exception as e:  # noqa: BLE001  (a tokenizer that rejects this text)
        return None, f"{where}cannot tokenize the prompt: {one_line(e)}"
    if not ids:
        return ids, f"{where}prompt encodes to no tokens"
    outside = outside_vocabulary(ids, input_vocab(loaded.model))
    if outside is not None:       # a tokenizer with more ids than the model's embedding
        return ids, f"{where}{outside}: the tokenizer holds more ids than the model"
    budget = None if limit is None else limit - cfg.generation.max_new_tokens
    if budget is not None and len(ids) > budget:
        return ids, (f"{where}prompt has {len(ids)} tokens, more than the model's context of {limit} positions "
                     f"minus generation.max_new_tokens={cfg.generation.max_new_tokens} allows ({max(budget, 0)})")
    return ids, None


def prompt_ids(text: str, tokenizer, data: DataSection) -> list[int]:
    """What the model is given for a prompt: its ids, or in the chat mode the ids of the instruction as
    the user message of the chat template (with the generation prompt) followed by the response prefix."""
    if not data.chat_template:
        return list(tokenizer.encode(text))
    chat = tokenizer.apply_chat_template([{"role": "user", "content": chat_message(text, data.instruction)}],
                                         add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(chat + data.response_prefix, add_special_tokens=False))  # the template has BOS


def _count(bar: "Progress", handout: Handout) -> int | None:
    """Prompts with a record in the whole job after this one: kept ones plus every group's (None: one group)."""
    finished = handout.finish_one()
    return None if finished is None else bar.kept + finished


class Progress:
    """A tqdm bar over the job's prompts on global rank 0: the records of every LP group (read off the
    handout's count), with the live figures of rank 0's own group (this run's prompts): tokens/s over
    wall time, S, requests and rows per forward, latency p50 and p95."""

    def __init__(self, total: int, kept: int, enabled: bool):
        self.kept = kept
        self.done, self.tokens, self.forwards, self.rounds = kept, 0, 0, 0
        self.shares, self.rows, self.latency = 0.0, 0.0, []
        self.start = time.perf_counter()
        self.bar = self._redirect = None
        if enabled:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=total, initial=kept, unit="prompt", desc="decoding", file=sys.stderr,
                            dynamic_ncols=True)
            self._redirect = logging_redirect_tqdm()  # log lines print above the bar
            self._redirect.__enter__()

    def advance(self, result: GenerationResult | None = None, done: int | None = None) -> None:
        """One more record (`result`: rank 0's own decode), or `done` records in the whole job."""
        self.done = self.done + 1 if done is None else max(done, self.done)
        if result is not None:
            self.tokens += result.new_tokens
            self.forwards += result.forwards
            bisect.insort(self.latency, result.decode_seconds)      # sorted: no sort per record
            batch = result.batch_per_round or [1] * result.forwards
            self.rounds += len(batch)
            self.shares += sum(1 / b for b in batch)
            self.rows += sum(result.fed_rows_per_round or result.rows_per_round)
        if self.bar is not None:
            if self.forwards:
                wall = time.perf_counter() - self.start
                self.bar.set_postfix_str(
                    f"{tokens_per_second(self.tokens, wall) or 0:.1f} tok/s, S={self.tokens / self.forwards:.2f}, "
                    f"batch {self.rounds / self.shares:.1f}, rows/fwd {self.rows / self.shares:.1f}, "
                    f"p50 {sorted_percentile(self.latency, 50):.1f} s, p95 {sorted_percentile(self.latency, 95):.1f} s",
                    refresh=False)
            self.bar.update(self.done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self._redirect.__exit__(None, None, None)
            self.bar = None

