"""Counting what would make the host wait for a GPU, on any device.

On CUDA, `.item()`, `.tolist()`, `.cpu()`, Python `bool()` / `int()`
/ `float()` of a tensor and indexing with a 0-dim tensor read the device
(the host waits for every queued kernel); `.to(device)` and
`torch.tensor(..., device=...)` from pageable memory are blocking uploads.
`HostWaits` counts those calls under a TorchFunctionMode, by call site (the
first frame outside torch), so a CPU run shows what a GPU run would wait on.
"""
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__"}
# not `.numpy()`: it refuses a CUDA tensor (`.cpu()` first, counted), so it only ever views host memory


def _zero_dim_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point() for i in items)


class HostWaits(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads: Counter = Counter()     # call site -> device reads
        self.uploads: Counter = Counter()   # call site -> `.to(device)` / tensor(device=) / copy_

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name in ("__getitem__", "__setitem__") and _zero_dim_index(args[1])):
            self.reads[_site()] += 1
        elif ((name == "to" and (any(isinstance(a, (torch.device, str)) for a in args[1:]) or "device" in kwargs))
              or (name in ("tensor", "as_tensor") and "device" in kwargs) or name == "copy_"):
            self.uploads[_site()] += 1
        return func(*args, **kwargs)


def _site() -> str:
    frame = sys._getframe(2)
    while frame is not None and "/torch/" in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    for marker in ("site-packages/", "/lp/", "/tests/"):
        if marker in path:
            path = (marker.strip("/") + "/" if marker != "site-packages/" else "") + path.split(marker, 1)[1]
            break
    return f"{path}:{frame.f_lineno}"


def ours(counter: Counter) -> int:
    """Calls made from lp's own code."""
    return sum(v for site, v in counter.items() if site.startswith("lp/"))
