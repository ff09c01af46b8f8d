"""How a complete unit's gradient buffer is reduced: the injected reducer.

A reducer gets a :class:`~paracube.data_parallel.flat.FlatUnit` whose buffer holds this
rank's gradients and starts reducing them across the data-parallel group, returning a
handle whose ``wait()`` leaves the reduced gradient where :meth:`Reducer.reduced` says:
the whole buffer (all-reduce: ZeRO-0/1) or the unit's persistent slice (reduce-scatter:
ZeRO-2/3). Every data-parallel wrapper takes one, so a compressor (fp16/bf16 casting,
Top-K with error feedback, PowerSGD) written as a reducer composes with every ZeRO stage;
it keeps its own state (residuals, low-rank factors) keyed by ``unit.index``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.shards import Waitable, alloc_storage


class Reducer(Protocol):
    sharded: bool  # True: only this rank's slice of the result is kept (unit.grad_shard)

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable: ...


class Done:
    """A reduction that finished when it was launched (no communication, or compressors
    that need two rounds and run them at once)."""

    def __init__(self, result: torch.Tensor) -> None:
        self.result = result

    def wait(self) -> torch.Tensor:
        return self.result


def reduced_gradient(unit: FlatUnit, reducer: Reducer) -> torch.Tensor:
    """This rank's (hi−lo,) reduced gradient slice of ``unit`` after the reduction."""
    return unit.sharded_grad if reducer.sharded else unit.buffer[unit.lo : unit.hi]


class AllReduce:
    """Uncompressed: one asynchronous all-reduce (sum) of the whole buffer, in place."""

    sharded = False

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        return ops.all_reduce(unit.buffer, group, ledger, tag="grad", async_op=True)


class ReduceScatter:
    """ZeRO-2/3: reduce-scatter the buffer so that this rank receives only its slice, add
    it to the unit's persistent slice, and free the buffer — the full gradient exists only
    while its unit is being filled and reduced."""

    sharded = True

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        shard = unit.sharded_grad
        alloc_storage(shard)  # released after the previous step
        # The first reduction of an accumulation window writes the slice in place.
        out = shard if unit.shard_fresh else torch.empty_like(shard)
        pending = ops.reduce_scatter_into(
            out, unit.buffer, group, ledger, tag="grad", async_op=True
        )
        return _AfterReduceScatter(pending, unit, out)


class _AfterReduceScatter:
    def __init__(self, pending: ops.PendingCollective, unit: FlatUnit, out: torch.Tensor) -> None:
        self.pending, self.unit, self.out = pending, unit, out

    def wait(self) -> torch.Tensor:
        self.pending.wait()
        shard = self.unit.sharded_grad
        if self.out is not shard:
            shard.add_(self.out)
        self.unit.shard_fresh = False
        self.unit.free()
        return shard
