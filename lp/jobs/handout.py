"""Dynamic prompt hand-out across LP groups (distributed.lp_size < the world size).

Every group's leader claims the next prompt index from one atomic counter on the
job's c10d store (`store.add(key, 1)`), so a group that drew short prompts simply
claims more, and no index is ever handed out twice. A claimed index past the last
prompt means the job has no more work for that group; its leader then counts
itself done, global rank 0 waits until every group is and then marks the job
complete, and every other rank waits for that mark before it ends with status 0
(a dead group is noticed by lp.parallel.watch, which interrupts these waits). Without a store (one group) the indices are
0..n-1 in order, with no communication, exactly the order a single group's counter
would give.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

from lp.parallel.dist import several_nodes


def store_prefix() -> str:
    """Keys of this attempt on the job's store (the hand-out's counter, the watchdog's beats, the startup
    waits). On one node torchrun keeps its store across the restarts of --max-restarts and every rank
    has the node's restart count: the count names the attempt. On several nodes each node counts its own
    restarts (one whose workers did not fail restarts them with its count unchanged), so the count would
    give each node other keys; there every attempt has a store of its own instead
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: launch/multi_node.sh, lp.parallel.dist.attempt_store)."""
    if several_nodes():
        return "lp/nodes/"
    return f"lp/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


class Handout:
    def __init__(self, store, total: int, groups: int):
        self.store, self.total, self.groups = store, total, groups
        self.next_key = store_prefix() + "next"
        self.done_key = store_prefix() + "done"
        self.complete_key = store_prefix() + "complete"
        self.finished_key = store_prefix() + "finished"

    def __iter__(self) -> Iterator[int]:
        """The prompt indices this group claims, in claim order."""
        if self.store is None:
            yield from range(self.total)
            return
        while (index := self.store.add(self.next_key, 1) - 1) < self.total:
            yield index

    def finish_one(self) -> int | None:
        """A leader has written one more record: the job's count of this run's records (None: one group)."""
        return None if self.store is None else self.store.add(self.finished_key, 1)

    def finished(self) -> int:
        """This run's records in the whole job so far (every group's)."""
        return 0 if self.store is None else self.store.add(self.finished_key, 0)

    def done(self) -> None:
        """This group's leader has no more work (its records are written and its file closed)."""
        if self.store is not None:
            self.store.add(self.done_key, 1)

    def wait_all(self, poll_s: float = 0.05, poll=None) -> None:
        """Until every group is done (global rank 0, before it reads the results), calling `poll()` while it
        waits (the progress bar follows the other groups' records); then says the job's decoding is complete."""
        if self.store is None:
            return
        while self.store.add(self.done_key, 0) < self.groups:
            if poll is not None:
                poll()
            time.sleep(poll_s)
        if poll is not None:
            poll()
        self.store.set(self.complete_key, "1")

    def wait_complete(self, poll_s: float = 0.05) -> None:
        """Every other rank, once its own work is done: until global rank 0 has seen every group done,
        so that a rank ends with status 0 only when the whole job's decoding did (a failure elsewhere
        interrupts this wait: lp.parallel.watch)."""
        if self.store is None:
            return
        while not self.store.check([self.complete_key]):
            time.sleep(poll_s)
