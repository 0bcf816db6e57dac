"""Process group setup and the LP collectives (DESIGN.md section 5).

`Comm` is the only thing the decode loop knows about other workers. An LP group
of one worker (plain `python -m lp.run`, torchrun with one worker, or each group
of `lp_size: 1`) does no communication at all in its step loop: its collectives
would hand its own rows back to it, and on a 2-core CPU a gloo group of one
spent about 0.29 ms a round on them (0.17 ms for the broadcast, 0.12 ms for the
gather), as much as the rest of a round's host work. A group of two or more
runs exactly two tensor collectives per round:

- `share_rows`: rank 0 broadcasts the round's token tree as one fixed-size
  int64 tensor of (token, parent) arrays. It travels over a CPU (gloo) group, so ranks
  other than 0 read it without a device-to-host sync.
- `all_gather`: one `all_gather_into_tensor` of every rank's fixed-size int64
  payload on the main group (NCCL on GPUs). Reading the result on the host is
  the round's one device-to-host sync. torch 2.13 renamed the call
  `all_gather_single` (the old name warns); we use whichever this torch has.

Rank k uses cuda:LOCAL_RANK (one GPU per rank). For tests only, `LP_SHARED_DEVICE=1` puts every
rank on cuda:0 with gloo (NCCL refuses two ranks on one device), so LP with several ranks can be
checked on one GPU; without it a rank whose GPU is not there is refused.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

from lp.parallel.watch import Pulse, beat_period, beating

T = TypeVar("T")

SHARED_DEVICE_ENV = "LP_SHARED_DEVICE"
# How long a rank waits for the others to join the job's process groups. Ranks reach init_distributed seconds
# apart (imports on a loaded node); a short distributed.timeout_s, meant to find a dead peer fast, bounded this
# wait too and failed the job at startup (gloo's "connectFullMesh failed ... wait timeout after 1000ms").
# torchrun stops the others when a worker dies before joining, so a long wait here hangs nothing.
STARTUP_TIMEOUT_S = 600.0


def mesh(world: int, lp_size: int | None) -> list[list[int]]:
    """The global ranks of each LP group of a dp x lp mesh: [[0..lp-1], [lp..2lp-1], ...]
    (`lp_size` None: one group of the whole world)."""
    lp = world if lp_size is None else lp_size
    if lp < 1 or world % lp:
        raise ValueError(f"distributed.lp_size: {lp_size!r} must be >= 1 and divide the world size {world}")
    return [list(range(start, start + lp)) for start in range(0, world, lp)]


@dataclass
class Comm:
    rank: int = 0               # rank within this LP group (0: the group's leader)
    world: int = 1              # LP group size
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    group: object = None        # main group (payload all-gather)
    cpu_group: object = None    # gloo group (candidates, prompts)
    collectives: int = 0        # step-loop collectives issued
    bytes_moved: int = 0        # bytes received by this rank in step-loop collectives
    src: int = 0                # global rank of this group's leader (broadcast source)
    dp_rank: int = 0            # index of this LP group
    dp_size: int = 1            # number of LP groups
    job_rank: int = 0           # global rank
    job_world: int = 1          # global world size
    job_group: object = None    # gloo group of every rank (go/stop, end of job)
    store: object = None        # the c10d store (startup waits, prompt hand-out), under torchrun

    @property
    def alone(self) -> bool:
        """This LP group is one worker (with or without a process group): nothing to exchange."""
        return self.world == 1

    @property
    def lead(self) -> bool:
        """This rank leads its LP group (claims prompts, writes its results)."""
        return self.rank == 0

    def share_rows(self, rows: Sequence[Sequence[int]] | None, capacity: int, k: int = 2) -> Sequence[Sequence[int]]:
        """The group leader's `k` int rows (at most `capacity` values each; e.g. the token trees' tokens
        and parents of a round's requests) on every rank: one broadcast of a fixed-size int64 tensor
        [k counts, row 0 padded to capacity, row 1 ...]. The other ranks pass None; `k` is fixed by
        the caller's protocol (2 per request of the round)."""
        if self.alone:
            return rows
        buf = torch.full((k + k * capacity,), -1, dtype=torch.long)
        if self.rank == 0:
            for i, row in enumerate(rows):
                buf[i] = len(row)
                buf[k + i * capacity:k + i * capacity + len(row)] = torch.tensor(row, dtype=torch.long)
        dist.broadcast(buf, self.src, group=self.cpu_group)
        self._count(buf)
        if self.rank == 0:
            return rows
        values = buf.tolist()        # a CPU tensor (gloo group): host memory, no device sync
        return [values[k + i * capacity:k + i * capacity + values[i]] for i in range(k)]

    def all_gather(self, payload: torch.Tensor) -> torch.Tensor:
        """[world, L] stack of every rank's [L] payload."""
        if self.alone:
            return payload[None]
        out = torch.empty(self.world * payload.numel(), dtype=payload.dtype, device=payload.device)
        _all_gather_single()(out, payload, group=self.group)
        self._count(out)
        return out.view(self.world, -1)

    def share_ids(self, ids: list[int] | None) -> list[int] | None:
        """The group leader's token ids (or None, meaning 'no more work') on every rank of the group;
        outside the step loop."""
        if self.alone:
            return ids
        size = torch.tensor([-1 if ids is None else len(ids)], dtype=torch.long)
        dist.broadcast(size, self.src, group=self.cpu_group)
        if size.item() < 0:
            return None
        buf = torch.tensor(ids, dtype=torch.long) if self.rank == 0 else torch.empty(size.item(), dtype=torch.long)
        dist.broadcast(buf, self.src, group=self.cpu_group)
        return buf.tolist()

    def job_go(self, status: int) -> int:
        """Global rank 0's verdict on every rank of the job, before any work: 0 (go) or the exit status
        it stops with."""
        if self.job_group is None:
            return status
        flag = torch.tensor([status], dtype=torch.long)
        dist.broadcast(flag, 0, group=self.job_group)
        return int(flag.item())

    def world_barrier(self) -> None:
        """Every rank of the job gets here (bounded by distributed.timeout_s)."""
        if self.job_group is not None and self.job_world > 1:
            dist.barrier(group=self.job_group)

    def rank_0_alone(self, key: str, work: Callable[[], T], timeout_s: float) -> T | None:
        """`work()` on global rank 0 alone (its result; None on the other ranks) while the job's other ranks
        wait for it on the store, not in a collective, so that work longer than the collectives' timeout
        is no failure. Rank 0 beats a counter on the store every min(1, timeout_s / 10) s while it works,
        then sets `key` to "done", or "failed" when the work raises (and raises). The others return at
        "done" and raise at "failed", or when the counter stands still for `timeout_s` (rank 0 gone; or,
        before its first beat, not at this step within `timeout_s` of their own arrival, as a collective
        would time out); they read the store between short sleeps, so a signal (torchrun's SIGTERM) is
        handled at once."""
        if self.store is None or self.job_world < 2:
            return work() if self.job_rank == 0 else None
        beat = key + "/beat"
        if self.job_rank == 0:
            outcome = "failed"
            try:
                with beating(self.store, beat, beat_period(timeout_s)):
                    result = work()
                outcome = "done"
                return result
            finally:
                try:
                    self.store.set(key, outcome)
                except Exception:       # noqa: BLE001  (the store is gone: the work's own error comes first)
                    if outcome == "done":
                        raise
        pulse = Pulse(self.store, beat)
        while not self.store.check([key]):
            if pulse.still_for() > timeout_s:
                raise RuntimeError(f"global rank 0 gave no sign of life for {timeout_s:g} s (distributed.timeout_s) "
                                   f"while this rank waited for its {key.rsplit('/', 1)[-1]} step: it is gone, or "
                                   f"did not reach that step in that time")
            time.sleep(min(0.1, timeout_s / 20))
        if self.store.get(key) != b"done":
            raise RuntimeError(f"global rank 0 failed in its {key.rsplit('/', 1)[-1]} step: its error line says why")
        return None

    def _count(self, t: torch.Tensor) -> None:
        self.collectives += 1
        self.bytes_moved += t.numel() * t.element_size()


def _all_gather_single():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def init_distributed(backend: str = "auto", timeout_s: float = 300.0, device: str = "auto",
                     lp_size: int | None = None) -> Comm:
    """A Comm from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*),
    or the one-worker Comm when not launched by torchrun. With `lp_size` < the world size,
    the Comm of this rank's LP group of the dp x lp mesh."""
    shared = shared_device()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and "MASTER_ADDR" not in os.environ:
        return Comm(device=rank_device(device, 0, shared))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = rank_device(device, local, shared)
    if shared:
        if backend == "nccl":
            raise ValueError(f"{SHARED_DEVICE_ENV}=1 puts every rank on {dev}, and NCCL refuses two ranks on one "
                             f"device: use distributed.backend gloo or auto")
        backend = "gloo"
    elif dev.type == "cuda" and dev.index >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK {local} uses {dev}, but {torch.cuda.device_count()} CUDA device(s) are "
                         f"visible: one GPU per rank ({SHARED_DEVICE_ENV}=1, for tests only, puts every rank on "
                         f"cuda:0 with gloo)")
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    joining = datetime.timedelta(seconds=max(timeout_s, STARTUP_TIMEOUT_S))
    store = attempt_store(joining)
    dist.init_process_group(backend=backend, timeout=joining, device_id=dev if backend == "nccl" else None,
                            store=store, rank=rank if store else -1, world_size=world if store else -1)
    job_cpu = dist.new_group(backend="gloo", timeout=joining) if backend != "gloo" else dist.group.WORLD
    groups = mesh(world, lp_size)
    store = dist.distributed_c10d._get_default_store()   # startup waits; the dp groups' hand-out and failure watch
    main, cpu = dist.group.WORLD, job_cpu   # one LP group: the whole world (the default); no hand-out
    if len(groups) > 1:
        for ranks in groups:    # every rank takes part in creating every group
            g = dist.new_group(ranks, backend=backend, timeout=joining)
            c = dist.new_group(ranks, backend="gloo", timeout=joining) if backend != "gloo" else g
            if rank in ranks:
                main, cpu = g, c
    for group in {dist.group.WORLD, job_cpu, main, cpu}:     # all joined: collectives time out at timeout_s
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), group)
    if len(groups) == 1:
        return Comm(rank, world, dev, backend, main, cpu, job_rank=rank, job_world=world, job_group=job_cpu,
                    store=store)
    lp, dp_rank = len(groups[0]), rank // len(groups[0])
    return Comm(rank % lp, lp, dev, backend, main, cpu, src=groups[dp_rank][0], dp_rank=dp_rank,
                dp_size=len(groups), job_rank=rank, job_world=world, job_group=job_cpu, store=store)


def several_nodes() -> bool:
    """Whether torchrun runs this job on several nodes (agents): each counts its own restarts there."""
    return os.environ.get("GROUP_WORLD_SIZE", "1") != "1"


def attempt_store(timeout: datetime.timedelta):
    """Under torchrun on one node, the job's store with keys of this attempt's own (None elsewhere).
    torchrun keeps one store server, and its keys, across the restarts of `--max-restarts`; the default
    process group of a restart read the killed workers' addresses there when they came first, and gloo's
    connect timed out (4 restarts of 5 failed so). On several nodes the restart count is each node's
    own (a node whose workers did not fail restarts them with its count unchanged), so no prefix can be
    agreed on from it: there launch/multi_node.sh and slurm.sbatch set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    which gives every attempt a store server of its own, and restarts without it are refused (ValueError)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        return None
    if several_nodes():
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) > 0 and \
                os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1":
            raise ValueError("torchrun --max-restarts on several nodes needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                             "in every node's environment (launch/multi_node.sh sets it): with the one store torchrun "
                             "keeps across restarts, a restart would read the killed attempt's keys")
        return None
    from torch.distributed.rendezvous import rendezvous

    store, _, _ = next(rendezvous("env://", timeout=timeout))
    return dist.PrefixStore(f"lp/attempt_{restart}/", store)


def shutdown(comm: Comm | None = None) -> None:
    """Destroy the process groups, and drop `comm`'s references to them and to the store (it does no
    more collectives). A group object that outlives this, e.g. in a module-level Comm, is freed at
    interpreter exit, where gloo's teardown can abort the process with "terminate called without an
    active exception" (exit -6) after a clean run: 4 of 40 two-rank runs of a script that kept its
    Comm did, none of 60 with the references dropped."""
    if comm is not None:
        comm.group = comm.cpu_group = comm.job_group = comm.store = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shared_device() -> bool:
    """Whether every rank shares one device: LP_SHARED_DEVICE=1 (tests of LP with several ranks on
    one GPU); unset or 0: one GPU per rank. Any other value is refused."""
    value = os.environ.get(SHARED_DEVICE_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{SHARED_DEVICE_ENV}={value!r}: 1 puts every rank on one device with gloo (for tests "
                         f"only); leave it unset (or 0) for one GPU per rank")
    return value == "1"


def rank_device(device: str, local_rank: int, shared: bool = False) -> torch.device:
    """The device of the rank with `local_rank` for the configured `device` (auto, cuda, cpu,
    ...): cuda:LOCAL_RANK, or cuda:0 for every rank when `shared`."""
    index = 0 if shared else local_rank
    if device == "auto":
        return torch.device(f"cuda:{index}") if torch.cuda.is_available() else torch.device("cpu")
    if device == "cuda":
        return torch.device(f"cuda:{index}")
    return torch.device(device)
