"""Moving a round's integers to the device in one copy.

On CUDA every `.to(device)` from pageable memory and every `torch.tensor(...,
device=cuda)` is a blocking copy. A round needs many small integer arrays on
the device (ids, positions, the rows' mask descriptors, the logit rows, the
tree's node frame, the sampling draws as the int64 words of their float64
bits, read back by a dtype view): `Uploader.send` packs them into one
int64 host buffer (pinned on CUDA, reused from round to round) and issues a
single non-blocking copy into a device buffer that is also reused, then
hands back views of it by name. Nothing here reads the device. The host
buffer is written through its numpy view (numpy comes with transformers):
faster than a tensor made from the list, and no aten op on the host.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch


class Uploader:
    def __init__(self, device: torch.device | str, size: int = 1 << 14):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.uploads = 0          # copies issued (one per send)
        self._grow(size)          # made before the first round: a round allocates nothing (rarely: grows)

    def _grow(self, size: int) -> None:
        self._host = torch.empty(size, dtype=torch.long, pin_memory=self.pinned)
        self._dev = torch.empty(size, dtype=torch.long, device=self.device)
        self._fill = self._host.numpy()     # written through numpy: no tensor ops on the host

    def send(self, sections: Mapping[str, Sequence[int]]) -> dict[str, torch.Tensor]:
        """One host-to-device copy of every section; views of the device buffer by name."""
        sizes = [len(v) for v in sections.values()]
        total = sum(sizes)
        if self._host.numel() < total:       # grow both buffers (rarely: sizes are bounded per job)
            self._grow(max(total, 2 * self._host.numel()))
        self._fill[:total] = [x for values in sections.values() for x in values]   # host only
        if self.device.type == "cpu":
            dev = self._host[:total].clone()    # the CPU is the device: keep the views independent
        else:
            dev = self._dev[:total]
            dev.copy_(self._host[:total], non_blocking=True)
        self.uploads += 1
        out, start = {}, 0
        for name, size in zip(sections, sizes):
            out[name] = dev[start:start + size]
            start += size
        return out

