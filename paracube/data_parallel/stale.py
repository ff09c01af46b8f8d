"""Bounded staleness (``--dp-mode stale:S``): step t applies the gradient of step t − S.

Each complete unit's gradient is copied out of the bucket and its all-reduce launched
asynchronously on a group of its own (a twin of the data-parallel group, so that the
reductions in flight do not queue ahead of each step's own collectives), and left in
flight for S steps: the next S forwards and backwards overlap it entirely. When step t's
reduction is launched, step t − S's is waited for and written into the bucket, where the
optimizer reads it — the delayed-gradient SGD analysed by Langford et al. 2009 ("Slow
learners are fast") and the 1-step-stale weight update of PipeDream-2BW (Narayanan et al.
2021). During the first S steps nothing has arrived yet: :attr:`StaleReduce.delivered` is
False and the engine does not step (a Python-API caller checks it too: stepping on the
zeroed buffer would apply weight decay alone). ``stale:0`` is synchronous data parallelism.

Memory: S + 1 copies of each bucket in flight (``state_bytes``).
"""

from __future__ import annotations

from collections import deque

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.reducers import Done
from paracube.data_parallel.shards import Waitable


class StaleReduce:
    """All-reduce (sum) each unit's gradient now; hand back the one of S steps ago."""

    sharded = False

    def __init__(self, staleness: int, group) -> None:
        if staleness < 0:
            raise ValueError(f"StaleReduce(staleness={staleness}): S must be ≥ 0")
        self.staleness, self.group = staleness, group
        self.in_flight: dict[int, deque[tuple[ops.PendingCollective, torch.Tensor]]] = {}
        self.delivered = False  # the last reduction handed back a gradient (S steps old)

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        # ``group`` is the wrapper's data-parallel group; the twin ``self.group`` has the
        # same ranks and carries only these reductions.
        queue = self.in_flight.setdefault(unit.index, deque())
        sent = unit.buffer.clone()  # (numel,): the bucket is refilled by the next backward
        queue.append((ops.all_reduce(sent, self.group, ledger, tag="grad", async_op=True), sent))
        self.delivered = len(queue) > self.staleness
        if not self.delivered:
            unit.buffer.zero_()
            return Done(unit.buffer)
        return _Oldest(queue.popleft(), unit.buffer)

    def drain(self) -> None:
        """Wait for every reduction still in flight (before the process group goes)."""
        for queue in self.in_flight.values():
            for pending, _ in queue:
                pending.wait()
            queue.clear()

    def state_bytes(self) -> int:
        """Bytes of the gradient copies in flight."""
        return sum(t.numel() * t.element_size() for q in self.in_flight.values() for _, t in q)


class _Oldest:
    def __init__(self, oldest: tuple[ops.PendingCollective, torch.Tensor], buffer: torch.Tensor):
        self.oldest, self.buffer = oldest, buffer

    def wait(self) -> torch.Tensor:
        pending, summed = self.oldest
        pending.wait()
        self.buffer.copy_(summed)
        return self.buffer
