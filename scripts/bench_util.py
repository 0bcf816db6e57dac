"""What the benchmark scripts share: transformers `generate` with its target forwards and their rows
counted, so S and rows per round compare across systems; the check of an output file's path; stopping
a child process with everything under it (torchrun's workers included)."""
from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import click
import torch


def writable_file(ctx, param, value):
    """click callback of a file option the script writes at its end: the path is checked before the
    benchmark runs (a long run must not end in a traceback and no figures)."""
    if value is None:
        return value
    path = Path(value)
    parent = path.parent
    if path.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or \
            (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{value}: cannot write a file there (its directory must exist and be writable)")
    return value


def seconds(ctx, param, value):
    """click callback of a duration option: a finite number of seconds > 0 (NaN passes a FloatRange)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value}: must be a finite number of seconds > 0")
    return value


class ForwardCounter:
    """Counts calls of the model's forward and the rows (query tokens) each one fed."""

    def __init__(self, model):
        self.model, self.count, self.rows, self.handle = model, 0, 0, None

    def _hook(self, module, args, kwargs, output):
        self.count += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += ids.shape[-1] if ids is not None else 0

    def __enter__(self):
        self.count = self.rows = 0
        self.handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class Generated(NamedTuple):
    ids: list[int]       # new tokens
    seconds: float
    forwards: int        # target forwards, prefill included
    rows: int            # rows fed over all forwards, prompt included


def generate(model, ids, max_new_tokens, eos, sampling: dict | None = None, **extra) -> Generated:
    """`model.generate`: greedy unless `sampling` holds do_sample=True and its settings;
    `extra` goes to generate as is (e.g. prompt_lookup_num_tokens)."""
    x = torch.tensor([ids], device=model.device)
    with ForwardCounter(model) as counter:
        start = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=eos[0], **(sampling or dict(do_sample=False)),
                             **extra)
        seconds = time.perf_counter() - start
    return Generated(out[0, len(ids):].tolist(), seconds, counter.count, counter.rows)


class Simulated(NamedTuple):
    tokens: int
    forwards: int        # prefill counted
    decode_rows: int     # rows of the decoding rounds (prefill round left out)
    decode_rounds: int


def walk_draft(token_ids, parents, target) -> int:
    """Draft nodes accepted along `target` (the tokens greedy decoding emits next):
    the root's child must be target[0], its child target[1], and so on."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    node, accepted = -1, 0
    while accepted < len(target):
        nxt = [c for c in kids.get(node, ()) if token_ids[c] == target[accepted]]
        if not nxt:
            return accepted
        node, accepted = nxt[0], accepted + 1
    return accepted


def suffix_decoding_peer(requests, budget: int, factor: float, min_prob: float = 0.0,
                         global_cache: bool = True) -> Simulated:
    """SuffixDecoding (arctic-inference's SuffixDecodingCache, the proposer behind vLLM's
    suffix decoding) simulated on greedy outputs: `requests` is a list of (prompt ids, greedy
    ids) in job order. Each forward emits the longest draft path that matches the greedy ids
    plus one token, feeds 1 + draft-size rows, and the cache learns the emitted tokens; with
    `global_cache` earlier requests' outputs are drafted from too. Raises ImportError when
    arctic-inference is not installed."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1 if global_cache else 0)
    tokens = forwards = rows = rounds = 0
    for k, (prompt, output) in enumerate(requests):
        cache.start_request(k, list(prompt))
        context, i = list(prompt), 0
        while i < len(output):
            draft = cache.speculate(k, context[-64:], max_spec_tokens=budget, max_spec_factor=factor,
                                    min_token_prob=min_prob, use_tree_spec=True)
            emitted = min(walk_draft(draft.token_ids, draft.parents, output[i:]) + 1, len(output) - i)
            if i:                                  # the first forward is the prefill round
                rows += 1 + len(draft.token_ids)
                rounds += 1
            forwards += 1
            cache.add_active_response(k, output[i:i + emitted])
            context += output[i:i + emitted]
            i += emitted
        cache.stop_request(k)
        tokens += len(output)
    return Simulated(tokens, forwards, rows, rounds)


def exit_on_term_and_hangup() -> None:
    """SIGTERM and SIGHUP end this script as Ctrl-C does, by an exception (exit status 128 + the signal),
    so that the cleanup around a child it runs in a session of its own (stop_tree) stops the child too;
    a signal that was ignored (nohup) stays ignored, and the first one's cleanup is not cut short by
    another (they are ignored from then on)."""
    def leave(sig, frame):
        for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        raise SystemExit(128 + sig)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, leave)


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop `proc` (started in a session of its own) and every process under it, then reap it: SIGTERM to
    its process group alone (torchrun passes it on to its workers, which it starts in sessions of their
    own, so each worker's handler runs once; lp.run keeps its records and exits), then after `grace_s`
    SIGKILL to its group and to each process found under it. `proc` is reaped last: until then its
    number is its own, and so is its group's."""
    found = _started(descendants(proc.pid))      # {pid: its start time}: a reused number is not it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    if not _wait_gone(proc, found, grace_s):
        found |= _started(descendants(proc.pid))
        for kill, pid in [(os.killpg, proc.pid), (os.kill, proc.pid)] + [
                (k, p) for p, start in found.items() if _started([p]).get(p) == start for k in (os.killpg, os.kill)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):     # a worker leads a group
                kill(pid, signal.SIGKILL)
        _wait_gone(proc, found, 5.0)
    proc.wait()


def _started(pids) -> dict[int, int]:
    """{pid: start time (clock ticks after boot)} of those of `pids` that run (zombies aside); Linux /proc,
    elsewhere every one of `pids` with start 0."""
    if not Path("/proc").is_dir():
        return {pid: 0 for pid in pids}
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()    # state, ppid, ...
            if fields[0] != "Z":
                out[pid] = int(fields[19])
    return out


def exited(proc: subprocess.Popen) -> bool:
    """Whether `proc` has exited, without reaping it (its zombie keeps its number from reuse)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_gone(proc: subprocess.Popen, found: dict[int, int], seconds: float) -> bool:
    """Whether `proc`, the rest of its process group and every process of `found` ({pid: start time}) have
    exited within `seconds` (none of them reaped here)."""
    deadline = time.monotonic() + seconds
    while True:
        running = _started(found)
        if exited(proc) and not _group_members(proc.pid) and not any(running.get(p) == t for p, t in found.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _group_members(pgid: int) -> list[int]:
    """The running processes (zombies aside) of process group `pgid`, but its leader (Linux /proc; without
    it: any member at all, zombies included)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
            return [-1]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()     # state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z" and int(stat.parent.name) != pgid:
                members.append(int(stat.parent.name))
    return members


def descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has exited)."""
    return pid in _started([pid])
