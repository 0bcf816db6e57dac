"""Job-wide liveness for a dp x lp mesh: a dead or stopped worker in any LP group ends every
group within distributed.timeout_s.

Inside one LP group a dead peer is noticed by the group's own collectives (closed
sockets at once, a stopped peer at the collective timeout). Across groups nothing
connects the workers but the c10d store, so with more than one group every rank
runs a `Watchdog` thread on its own store client that, every `period_s`:

- bumps its heartbeat counter `beat/<rank>`;
- stops the job when `failed` is set (a rank whose job failed sets it: `fail`);
- stops the job when another rank's counter has not moved for `timeout_s` (by this
  rank's own clock, so no clock sync is needed) unless that rank said `finished/<rank>`.

Stopping raises `PeerFailed` (a BaseException: no `except Exception` turns it into a
record) in the main thread; should the main thread sit in a blocking C call that long,
the process exits with status 1 after `grace_s`. Results on disk are only ever whole,
fsynced lines or a torn last line that a resume cuts off.
"""
from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
import time
import _thread
from contextlib import contextmanager

import torch.distributed as dist

logger = logging.getLogger("lp.parallel.watch")


def beat_period(timeout_s: float) -> float:
    """How often a rank beats its counter on the store: ten beats per timeout, at most 1 s apart."""
    return min(1.0, timeout_s / 10)


class Pulse:
    """Another rank's heartbeat counter `key` on the store, judged by this rank's own clock (so no
    clock sync is needed): `still_for()` is how long the counter has not moved, counted from this
    Pulse's making until the counter's first read."""

    def __init__(self, store, key: str):
        self.store, self.key = store, key
        self.last, self.seen = None, time.monotonic()

    def still_for(self) -> float:
        beats, now = self.store.add(self.key, 0), time.monotonic()
        if beats != self.last:
            self.last, self.seen = beats, now
        return now - self.seen


@contextmanager
def beating(store, key: str, period_s: float):
    """Add 1 to `key` on `store` every `period_s` from a thread while the block runs; the store
    client is the thread's until the block ends (Comm.rank_0_alone)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            store.add(key, 1)
            if stop.wait(period_s):
                return

    thread = threading.Thread(target=beat, name="lp-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class PeerFailed(BaseException):
    """Another worker of the job died, stopped or failed."""


def _raise(signum, frame):
    raise PeerFailed(Watchdog.failure or "another worker failed")


class Watchdog:
    failure: str | None = None      # why the job stops (class-wide: one watchdog per process)

    def __init__(self, rank: int, world: int, timeout_s: float, prefix: str, period_s: float | None = None,
                 grace_s: float = 10.0):
        self.rank, self.world, self.timeout_s, self.prefix = rank, world, timeout_s, prefix
        self.period_s = period_s or beat_period(timeout_s)
        self.grace_s = grace_s
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lp-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        signal.signal(signal.SIGUSR1, _raise)       # main thread: where PeerFailed is raised
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        self.store.add(f"{self.prefix}beat/{self.rank}", 1)

    def _run(self) -> None:
        pulses = {r: Pulse(self.store, f"{self.prefix}beat/{r}") for r in range(self.world) if r != self.rank}
        try:
            while not self._stop.wait(self.period_s):
                self._beat()
                if self.store.check([f"{self.prefix}failed"]):
                    return self._trigger(self.store.get(f"{self.prefix}failed").decode())
                for r, pulse in pulses.items():
                    if self.store.check([f"{self.prefix}finished/{r}"]):    # for good: no beats to come
                        continue
                    still = pulse.still_for()
                    if still > self.timeout_s:
                        return self._trigger(f"rank {r} timed out: no heartbeat for {still:.0f} s "
                                             f"(distributed.timeout_s={self.timeout_s:g})")
        except Exception as e:  # noqa: BLE001  (the store is gone: global rank 0, its host, died)
            if not self._stop.is_set():
                self._trigger(f"lost the job's store (global rank 0 gone?): {type(e).__name__}: {e}")

    def _trigger(self, why: str) -> None:
        Watchdog.failure = why
        _thread.interrupt_main(signal.SIGUSR1)
        if self._stop.wait(self.grace_s):
            return
        sys.stderr.write(f"error: rank {self.rank}: worker failed: {why}\n")
        sys.stderr.flush()
        os._exit(1)

    def fail(self, why: str) -> None:
        """This rank's job failed: tell every other rank (best effort; the store may be gone)."""
        self.stop()
        try:
            if not self.store.check([f"{self.prefix}failed"]):
                self.store.set(f"{self.prefix}failed", f"rank {self.rank}: {why}")
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.period_s + 5)

    def finish(self, wait_for_others: bool = False) -> None:
        """This rank ends cleanly. Global rank 0 (the store's host) first waits, at most timeout_s,
        until every other rank has said so, so that no one loses the store mid-call."""
        self.stop()
        try:
            self.store.set(f"{self.prefix}finished/{self.rank}", "1")
            if wait_for_others:
                keys = [f"{self.prefix}finished/{r}" for r in range(self.world)]
                deadline = time.monotonic() + self.timeout_s
                while not self.store.check(keys) and time.monotonic() < deadline:
                    time.sleep(0.05)
        except Exception:  # noqa: BLE001  (global rank 0 stopped the job at startup and is gone)
            pass
