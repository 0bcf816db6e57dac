"""LP_SHARED_DEVICE (lp.parallel.dist): the test-only setting that puts every rank on one device
with gloo, so LP with several ranks can be checked on one GPU. On the CPU: which device each rank
gets, that NCCL and unknown values are refused, that a rank whose GPU is missing is refused without
the setting, and a real two-rank gloo world with it on."""
import json

import pytest
import torch

from lp.parallel import dist as lpdist
from multiproc import free_port, start_python


def test_device_per_rank():
    assert lpdist.rank_device("cuda", 3) == torch.device("cuda:3")        # one GPU per rank
    assert lpdist.rank_device("cuda", 3, shared=True) == torch.device("cuda:0")
    assert lpdist.rank_device("cpu", 3, shared=True) == torch.device("cpu")


@pytest.mark.parametrize("value, shared", [(None, False), ("0", False), ("1", True)])
def test_setting_values(monkeypatch, value, shared):
    if value is None:
        monkeypatch.delenv("LP_SHARED_DEVICE", raising=False)
    else:
        monkeypatch.setenv("LP_SHARED_DEVICE", value)
    assert lpdist.shared_device() is shared


def _rank_one_of_two(monkeypatch, shared: str | None):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    if shared is None:
        monkeypatch.delenv("LP_SHARED_DEVICE", raising=False)
    else:
        monkeypatch.setenv("LP_SHARED_DEVICE", shared)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_nccl_refused_with_the_setting(monkeypatch, device):
    _rank_one_of_two(monkeypatch, "1")
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one device"):
        lpdist.init_distributed("nccl", 5, device)
    assert not torch.distributed.is_initialized()


def test_other_values_refused(monkeypatch):
    _rank_one_of_two(monkeypatch, "yes")
    with pytest.raises(ValueError, match="LP_SHARED_DEVICE='yes'"):
        lpdist.init_distributed("gloo", 5, "cpu")


def test_missing_gpu_refused_without_the_setting(monkeypatch):
    _rank_one_of_two(monkeypatch, None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)   # rank 1 would need cuda:1
    with pytest.raises(ValueError, match="LOCAL_RANK 1 uses cuda:1, but 1 CUDA device"):
        lpdist.init_distributed("gloo", 5, "cuda")
    assert not torch.distributed.is_initialized()


RANK = """
import json, sys, torch
from lp.parallel.dist import init_distributed, shutdown
comm = init_distributed("auto", 60, "cpu")
gathered = comm.all_gather(torch.tensor([comm.rank], dtype=torch.long)).tolist()
print(json.dumps({"rank": comm.rank, "world": comm.world, "backend": comm.backend, "device": str(comm.device),
                  "gathered": gathered}), flush=True)
shutdown(comm)
"""


def test_two_ranks_with_the_setting():
    procs = start_python(["-c", RANK], LP_SHARED_DEVICE="1")
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [(g["rank"], g["world"], g["backend"], g["device"]) for g in got] == [(0, 2, "gloo", "cpu"),
                                                                                  (1, 2, "gloo", "cpu")]
    assert all(g["gathered"] == [[0], [1]] for g in got)
