"""Child processes that must end with everything they started: an evaluated program (lp.jobs.evaluate),
a torchrun launcher and its workers (the sweep and gpu_check scripts).

A child is never reaped here before its group is signalled: its exit is seen with os.waitid's WNOWAIT,
so its zombie keeps its number (and its group's) from reuse until the caller's final wait(). A process
found under it is signalled only while its start time is the one seen when it was found. Process
tables are read off Linux's /proc; elsewhere only the child itself and its group are known.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple


class Stat(NamedTuple):
    """A process's line of /proc/<pid>/stat, the fields used here."""
    pid: int
    state: str          # "Z": a zombie (it has exited)
    ppid: int
    pgrp: int
    start: int          # clock ticks after boot: a reused number has another


def stat(pid: int) -> Stat | None:
    """`pid`'s stat, or None when there is no such process (or no /proc)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()    # after the command's name
        return Stat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
    return None


def table() -> list[Stat]:
    """Every process's stat (empty without /proc)."""
    return [s for s in (stat(int(entry.name)) for entry in Path("/proc").glob("[0-9]*")) if s is not None]


def started(pids) -> dict[int, int]:
    """{pid: start time} of those of `pids` that run (zombies aside); without /proc, every one of `pids`
    with start 0."""
    if not Path("/proc").is_dir():
        return {pid: 0 for pid in pids}
    return {s.pid: s.start for s in map(stat, pids) if s is not None and s.state != "Z"}


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has exited)."""
    return pid in started([pid])


def descendants(root: int) -> list[int]:
    """Every process below `root` (empty without /proc)."""
    children: dict[int, list[int]] = {}
    for s in table():
        children.setdefault(s.ppid, []).append(s.pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def group_members(pgid: int) -> list[int]:
    """The running processes (zombies aside) of process group `pgid`, but its leader (without /proc: [-1]
    while the group has any member at all, zombies included)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
            return [-1]
        except (ProcessLookupError, PermissionError):
            return []
    return [s.pid for s in table() if s.pgrp == pgid and s.state != "Z" and s.pid != pgid]


def carrying(entry: str) -> list[int]:
    """The processes whose environment holds `entry` ("NAME=value"). Another user's cannot be read unless
    this is root, and a process started with an environment of its own is not found."""
    needle = entry.encode()
    found = []
    for path in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (path / "environ").read_bytes().split(b"\0"):
                found.append(int(path.name))
    return found


def exited(proc: subprocess.Popen) -> bool:
    """Whether `proc` has exited, without reaping it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def exits_within(proc: subprocess.Popen, seconds: float, poll_s: float = 0.005) -> bool:
    """Whether `proc` exits within `seconds` (not reaped)."""
    deadline = time.monotonic() + seconds
    while not exited(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def kill_group_and_self(pid: int, sig: int = signal.SIGKILL) -> None:
    """`sig` to `pid`'s process group (a session's leader leads one) and to `pid` itself; what is gone
    already, or not ours, is passed over."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop `proc` (started in a session of its own) and every process under it, then reap it: SIGTERM to
    its process group alone (torchrun passes it on to its workers, which it starts in sessions of their
    own, so each worker's handler runs once; lp.run keeps its records and exits), then after `grace_s`
    SIGKILL to its group and to each process found under it (each may lead a group of its own)."""
    found = started(descendants(proc.pid))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    if not _all_gone(proc, found, grace_s):
        found |= started(descendants(proc.pid))
        kill_group_and_self(proc.pid)
        for pid, start in found.items():
            if started([pid]).get(pid) == start:
                kill_group_and_self(pid)
        _all_gone(proc, found, 5.0)
    proc.wait()


def _all_gone(proc: subprocess.Popen, found: dict[int, int], seconds: float) -> bool:
    """Whether `proc`, the rest of its process group and every process of `found` ({pid: start time}) have
    exited within `seconds` (none of them reaped here)."""
    deadline = time.monotonic() + seconds
    while True:
        running = started(found)
        if exited(proc) and not group_members(proc.pid) and not any(running.get(p) == t for p, t in found.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
