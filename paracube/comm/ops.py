"""Collectives routed through the :class:`CommLedger`: every call is counted.

Each returns early when the group has one rank (nothing to exchange, nothing counted).
Asynchronous calls return a :class:`PendingCollective`; waiting on it is timed and
charged to the ledger as exposed communication.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from paracube.comm.ledger import CommLedger


def group_size(group) -> int:
    """Ranks in ``group``; ``None`` is the default (world) group, as in torch.distributed."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class PendingCollective:
    """Handle of an asynchronous collective; :meth:`wait` times the exposed wait."""

    def __init__(self, work, ledger: CommLedger | None, kind: str, tag: str, result: torch.Tensor):
        self._work, self._ledger, self._kind, self._tag = work, ledger, kind, tag
        self.result = result

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            start = time.perf_counter()
            self._work.wait()
            if self._ledger is not None:
                self._ledger.add_time(self._kind, self._tag, time.perf_counter() - start)
            self._work = None
        return self.result


def all_reduce(
    tensor: torch.Tensor,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    op=dist.ReduceOp.SUM,
    async_op: bool = False,
) -> PendingCollective:
    """In-place all-reduce of ``tensor`` over ``group``."""
    if group_size(group) == 1:
        return PendingCollective(None, None, "all_reduce", tag, tensor)
    if ledger is not None:
        ledger.record("all_reduce", tag, nbytes(tensor))
    start = time.perf_counter()
    work = dist.all_reduce(tensor, op=op, group=group, async_op=True)
    pending = PendingCollective(work, ledger, "all_reduce", tag, tensor)
    if not async_op:
        pending.wait()
    elif ledger is not None:  # the launch itself is caller-visible time
        ledger.add_time("all_reduce", tag, time.perf_counter() - start)
    return pending


def broadcast(tensor: torch.Tensor, src_group_rank: int, group, ledger: CommLedger | None = None, *, tag: str = "") -> None:
    """In-place broadcast from the group-local rank ``src_group_rank``."""
    if group_size(group) == 1:
        return
    start = time.perf_counter()
    dist.broadcast(tensor, group=group, group_src=src_group_rank)
    if ledger is not None:
        ledger.record("broadcast", tag, nbytes(tensor), time.perf_counter() - start)


def all_gather(tensor: torch.Tensor, group, ledger: CommLedger | None = None, *, tag: str = "") -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0: (n, ...) → (world·n, ...).

    Counted as the *gathered* size, the volume convention under which an all-gather plus
    a reduce-scatter move the same bytes as one all-reduce (formulas.md)."""
    world = group_size(group)
    if world == 1:
        return tensor
    tensor = tensor.contiguous()
    out = torch.empty((world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    start = time.perf_counter()
    dist.all_gather_single(out, tensor, group=group)
    if ledger is not None:
        ledger.record("all_gather", tag, nbytes(out), time.perf_counter() - start)
    return out


def reduce_scatter(
    tensor: torch.Tensor, group, ledger: CommLedger | None = None, *, tag: str = "", async_op: bool = False
):
    """Sum across ranks and keep this rank's 1/world slice of dim 0: (world·n, ...) → (n, ...).

    Counted as the size of the full input (see :func:`all_gather`). With ``async_op``
    returns a :class:`PendingCollective` whose ``wait()`` gives the slice."""
    world = group_size(group)
    if world == 1:
        return PendingCollective(None, None, "reduce_scatter", tag, tensor) if async_op else tensor
    tensor = tensor.contiguous()
    out = torch.empty((tensor.shape[0] // world, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    if ledger is not None:
        ledger.record("reduce_scatter", tag, nbytes(tensor))
    start = time.perf_counter()
    work = dist.reduce_scatter_single(out, tensor, group=group, async_op=True)
    pending = PendingCollective(work, ledger, "reduce_scatter", tag, out)
    if async_op:
        if ledger is not None:
            ledger.add_time("reduce_scatter", tag, time.perf_counter() - start)
        return pending
    return pending.wait()


def all_gather_into(
    out: torch.Tensor, shard: torch.Tensor, group, ledger: CommLedger | None = None, *, tag: str = "",
    async_op: bool = False,
) -> PendingCollective:
    """Gather every rank's equal-sized flat ``shard`` into ``out`` (world·n,), in rank order,
    without allocating: the ZeRO parameter gather. ``shard`` must not alias ``out``."""
    if group_size(group) == 1:
        out.copy_(shard)
        return PendingCollective(None, None, "all_gather", tag, out)
    if ledger is not None:
        ledger.record("all_gather", tag, nbytes(out))
    start = time.perf_counter()
    work = dist.all_gather_single(out, shard, group=group, async_op=True)
    pending = PendingCollective(work, ledger, "all_gather", tag, out)
    if not async_op:
        pending.wait()
    elif ledger is not None:
        ledger.add_time("all_gather", tag, time.perf_counter() - start)
    return pending


def reduce_scatter_into(
    out: torch.Tensor, tensor: torch.Tensor, group, ledger: CommLedger | None = None, *, tag: str = "",
    async_op: bool = False,
) -> PendingCollective:
    """Sum flat ``tensor`` (world·n,) across ranks and write this rank's n-slice into
    ``out``: the ZeRO-2/3 gradient reduction."""
    if group_size(group) == 1:
        out.copy_(tensor)
        return PendingCollective(None, None, "reduce_scatter", tag, out)
    if ledger is not None:
        ledger.record("reduce_scatter", tag, nbytes(tensor))
    start = time.perf_counter()
    work = dist.reduce_scatter_single(out, tensor, group=group, async_op=True)
    pending = PendingCollective(work, ledger, "reduce_scatter", tag, out)
    if not async_op:
        pending.wait()
    elif ledger is not None:
        ledger.add_time("reduce_scatter", tag, time.perf_counter() - start)
    return pending
