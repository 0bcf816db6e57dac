"""Run a job: `python -m lp.run --config FILE.yaml [--set section.key=value ...] [--quiet] [--force | --fresh]
[--check]`.

The command line only: parse the flags, load and check the config (exit 2 on
any problem), set up the process group, run the job (lp/jobs/runner.py) and
turn every failure into one `error:` line with its exit status (1 for a job
that cannot run or whose every prompt is an error record, 2 for a config or resume refusal, 130 when interrupted by
Ctrl-C, 143 when stopped by SIGTERM: `docker stop`, Slurm's `scancel`, a
torchrun agent stopping its workers; both keep what was written, as a resume
expects). `--check` stops before the model: the config for WORLD_SIZE workers, the prompts, the
output directory and whether the model can be found, nothing loaded or written (launch/single_node.sh runs it before torchrun, whose own traceback
would otherwise follow a worker's error line). Under torchrun a failing worker also leaves its error line
in its reply file (TORCHELASTIC_ERROR_FILE), so that torchrun's failure summary names it as the root
cause instead of pointing at torchrun's docs.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import NoReturn

import click
import torch

from lp.decode.kv_cache import CompileFailed, out_of_memory
from lp.jobs.config import ConfigError, environment_problems, load_config
from lp.jobs.data import DataError
from lp.jobs.results import JobDirError, ResumeRefused
from lp.jobs.runner import JobError, StartRefused, check_job, run_job
from lp.jobs.summary import report
from lp.models import ModelLoadError
from lp.jobs.handout import store_prefix
from lp.messages import one_line
from lp.parallel.dist import Comm, init_distributed, shutdown
from lp.parallel.watch import PeerFailed, Watchdog


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so the job unwinds as on Ctrl-C (records flushed,
    the output directory's lock released, the process group shut down). A BaseException, so that no
    `except Exception` turns it into a prompt's error record."""


def _on_sigterm(signum, frame) -> NoReturn:
    raise Terminated()


def _rank_prefix(comm: Comm) -> str:
    return f"rank {comm.job_rank}: " if comm.job_world > 1 else ""


def _fail(message: str, code: int, echo: bool = True) -> NoReturn:
    """End the worker with `error: message` (printed unless `echo` is off: ranks that leave the line to
    rank 0) and exit status `code`."""
    line = f"error: {message}"
    if echo:
        click.echo(line, err=True)
    _reply_to_torchrun(line)
    raise SystemExit(code)


def _reply_to_torchrun(line: str) -> None:
    """Under torchrun, the error line as the worker's reply file (the format of torch's own
    ErrorHandler), which torchrun's failure summary prints as the root cause."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}, f)
    except OSError:     # the line is on stderr anyway
        pass


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Command(click.Command):
    """click's command, whose usage errors (an unknown flag, a missing --config, --force with --fresh) are
    shown by global rank 0 alone and, under torchrun, are each worker's reply file, as a config error's
    line is (click shows them itself, on every rank, and torchrun's summary pointed at its docs)."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)     # --help: shown, and 0 returned
        except click.ClickException as e:       # a usage error, mostly
            if int(os.environ.get("RANK", "0")) == 0:
                e.show()
            _reply_to_torchrun(f"error: {e.format_message()}")
            raise SystemExit(e.exit_code) from None


@click.command(cls=_Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE.yaml", help="Job config (YAML).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override one config key (value read as YAML); repeatable.")
@click.option("--quiet", is_flag=True, help="No progress bar or progress messages, only the final summary.")
@click.option("--force", is_flag=True,
              help="Resume an output directory even though its results were made with a different config.")
@click.option("--fresh", is_flag=True, help="Discard the results already in the output directory and start over.")
@click.option("--check", is_flag=True,
              help="Check the config (for WORLD_SIZE workers), the prompts, the output directory and that the "
                   "model can be found, and exit without loading the model or writing anything.")
def main(config_path: str, overrides: tuple[str, ...], quiet: bool, force: bool, fresh: bool, check: bool) -> None:
    """Run a Lookahead Decoding job described by a YAML config (resumes an interrupted one)."""
    try:
        _main(config_path, overrides, quiet, force, fresh, check)
    except KeyboardInterrupt:       # before or after the job (run_job's own: _exit_for): the same line and 130
        _fail("interrupted; --check writes nothing" if check else INTERRUPTED, 130)


INTERRUPTED = "interrupted; the results written so far are kept: run the same command again to resume"


def _main(config_path: str, overrides: tuple[str, ...], quiet: bool, force: bool, fresh: bool, check: bool) -> None:
    if force and fresh:
        raise click.UsageError("--force (resume despite a changed config) and --fresh (discard the results) "
                               "exclude each other: give one")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("lp").setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # model loading/conversion bars
    lead = int(os.environ.get("RANK", "0")) == 0
    try:
        cfg = load_config(config_path, overrides)
        problems = environment_problems(cfg, int(os.environ.get("WORLD_SIZE", "1")), torch.cuda.is_available())
        if problems:
            raise ConfigError(problems, config_path)
    except ConfigError as e:
        _fail(str(e), 2, echo=lead)
    if check:
        if lead:        # under torchrun the others stop here: rank 0 alone reads the prompts and the directory
            try:
                click.echo(f"ok: {config_path}: {check_job(cfg, force=force, fresh=fresh)}")
            except ResumeRefused as e:
                _fail(str(e), 2)
            except (DataError, JobDirError, ModelLoadError) as e:
                _fail(str(e), 1)
        return
    try:
        comm = init_distributed(cfg.distributed.backend, cfg.distributed.timeout_s, cfg.model.device,
                                cfg.distributed.lp_size)
        watchdog = (Watchdog(comm.job_rank, comm.job_world, cfg.distributed.timeout_s, store_prefix()).start()
                    if comm.dp_size > 1 else None)
    except Exception as e:  # noqa: BLE001  (rendezvous, backend or device problems)
        _fail(f"distributed setup failed: {one_line(e)}", 1)
    summary = None
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        summary = run_job(cfg, comm, force=force, fresh=fresh,
                          progress=comm.job_rank == 0 and not quiet and _stderr_is_terminal())
        if watchdog:
            watchdog.finish(wait_for_others=comm.job_rank == 0)
    except BaseException as e:
        if watchdog:     # every other LP group stops too (lp.parallel.watch)
            watchdog.fail(one_line(e))
        _exit_for(e, comm)
    finally:
        shutdown(comm)
    if summary is not None:
        click.echo(report(summary, cfg))
        if summary["prompts"] and summary["errors"] == summary["prompts"]:   # a job that produced nothing
            _fail(f"no prompt could be decoded: all {summary['prompts']} are error records (each record's "
                  f"`error` says why)", 1)


def _exit_for(e: BaseException, comm: Comm) -> NoReturn:
    """One `error:` line and the exit status of a failed job."""
    try:
        raise e
    except ResumeRefused as e:
        _fail(f"{_rank_prefix(comm)}{e}", 2)
    except StartRefused as e:
        _fail(f"{_rank_prefix(comm)}{e}", e.status)
    except KeyboardInterrupt:
        _fail(f"{_rank_prefix(comm)}{INTERRUPTED}", 130)
    except Terminated:
        _fail(f"{_rank_prefix(comm)}terminated (SIGTERM); the results written so far are kept: run the same "
              f"command again to resume", 143)
    except (DataError, ModelLoadError, JobError, CompileFailed, OSError) as e:
        _fail(f"{_rank_prefix(comm)}{e}", 1)
    except PeerFailed as e:
        _fail(f"{_rank_prefix(comm)}worker failed: {e}", 1)
    except Exception as e:  # noqa: BLE001  (a dead peer or a collective timeout ends every rank)
        if out_of_memory(e):
            _fail(f"{_rank_prefix(comm)}out of memory ({one_line(e)}); the results written so far are kept: "
                  f"lower generation.batch_size, generation.max_new_tokens or the lookahead sizes (window, guesses, "
                  f"...) and run again to resume", 1)
        if comm.job_world == 1:
            raise
        _fail(f"{_rank_prefix(comm)}worker failed: {one_line(e)}", 1)


if __name__ == "__main__":
    main()
