"""Counting a round's own device work: the aten ops lp dispatches outside the model forward.

On a GPU each non-view aten op is at least one kernel launch, so a round's ops outside the forward
(mask, verification, payload, publication, upload) are what a launch-bound round pays on top of
the forward. `RoundOps` counts them under a TorchDispatchMode on any device: views and other
aliasing ops (which launch nothing) are left out, and so is everything inside the model forward
(lp.decode.batch.forward_logits, patched for the count's duration)."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

from torch.utils._python_dispatch import TorchDispatchMode


def _launches(func) -> bool:
    """Whether an aten op does work: mutating ops and ops returning fresh tensors (not views)."""
    schema = func._schema
    return schema.is_mutable or not any(r.alias_info is not None for r in schema.returns)


class RoundOps(TorchDispatchMode):
    """Counts launching aten ops by name (`ops`) and per `lp.engine.Rounds.run` call (`rounds`)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.rounds: list[int] = []
        self._paused = 0
        self._in_round = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._in_round and not self._paused and _launches(func):
            self.ops[func.overloadpacket.__name__] += 1
            self.rounds[-1] += 1
        return func(*args, **(kwargs or {}))

    @contextmanager
    def counting(self):
        """Count every round run inside, the model forward left out."""
        import lp.decode.batch as batch
        import lp.engine as engine
        forward, run = batch.forward_logits, engine.Rounds.run

        def paused_forward(*args, **kwargs):
            self._paused += 1
            try:
                return forward(*args, **kwargs)
            finally:
                self._paused -= 1

        def counted_run(rounds, *args, **kwargs):
            self.rounds.append(0)
            self._in_round = True
            try:
                return run(rounds, *args, **kwargs)
            finally:
                self._in_round = False
        batch.forward_logits, engine.Rounds.run = paused_forward, counted_run
        try:
            with self:
                yield self
        finally:
            batch.forward_logits, engine.Rounds.run = forward, run
