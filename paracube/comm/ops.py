"""Collectives routed through the :class:`CommLedger`: every call is counted.

Each returns early when the group has one rank (nothing to exchange, nothing counted).
Asynchronous calls return a :class:`PendingCollective`; waiting on it is timed and
charged to the ledger as exposed communication.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from paracube import inject
from paracube.comm.ledger import CommLedger

# torch 2.13 names the flat collectives ``*_single`` and deprecates the ``*_tensor`` names
# (a FutureWarning per call); an older torch — a GPU image's — has only those, with the
# same arguments.
all_gather_flat = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


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
            inject.pause()
            start = time.perf_counter()
            self._work.wait()
            inject.resume()
            if self._ledger is not None:
                self._ledger.add_time(self._kind, self._tag, time.perf_counter() - start)
            self._work = None
        return self.result


def _launch(
    kind: str,
    tag: str,
    counted_bytes: int,
    ledger: CommLedger | None,
    start,
    result: torch.Tensor,
    async_op: bool,
) -> PendingCollective:
    """Count, start (``start()`` returns the async work), and wait unless ``async_op``: the
    one path every collective below takes, so calls, bytes and exposed seconds are
    recorded alike. With ``async_op`` the launch itself is charged as caller-visible time."""
    if ledger is not None:
        ledger.record(kind, tag, counted_bytes)
    t0 = time.perf_counter()
    if tag != "timing":  # the diagnosis' own gather is not the job's communication
        inject.delay_comm()
    slowed = inject.pause()  # a slowed rank's work so far comes first: compute, not comm
    pending = PendingCollective(start(), ledger, kind, tag, result)
    inject.resume()
    if not async_op:
        pending.wait()
    elif ledger is not None:
        ledger.add_time(kind, tag, time.perf_counter() - t0 - slowed)
    return pending


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
    return _launch(
        "all_reduce",
        tag,
        nbytes(tensor),
        ledger,
        lambda: dist.all_reduce(tensor, op=op, group=group, async_op=True),
        tensor,
        async_op,
    )


def all_reduce_coalesced(
    tensors: list[torch.Tensor], group, ledger: CommLedger | None = None, *, tag: str = ""
) -> None:
    """Sum several tensors over ``group`` with one all-reduce of their concatenation, and
    write the sums back in place (e.g. the small gradients of sequence-parallel norms)."""
    if not tensors or group_size(group) == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    all_reduce(flat, group, ledger, tag=tag)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def broadcast(
    tensor: torch.Tensor,
    src_group_rank: int,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
) -> None:
    """In-place broadcast from the group-local rank ``src_group_rank``."""
    if group_size(group) == 1:
        return
    start = time.perf_counter()
    dist.broadcast(tensor, group=group, group_src=src_group_rank)
    if ledger is not None:
        ledger.record("broadcast", tag, nbytes(tensor), time.perf_counter() - start)


def all_gather(
    tensor: torch.Tensor, group, ledger: CommLedger | None = None, *, tag: str = ""
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0: (n, ...) → (world·n, ...).

    Counted as the *gathered* size, the volume convention under which an all-gather plus
    a reduce-scatter move the same bytes as one all-reduce (docs/formulas.md)."""
    world = group_size(group)
    if world == 1:
        return tensor
    tensor = tensor.contiguous()
    out = torch.empty(
        (world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device
    )
    return all_gather_into(out, tensor, group, ledger, tag=tag).result


def reduce_scatter(
    tensor: torch.Tensor,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    async_op: bool = False,
):
    """Sum across ranks and keep this rank's 1/world slice of dim 0: (world·n, ...) → (n, ...).

    Counted as the size of the full input (see :func:`all_gather`). With ``async_op``
    returns a :class:`PendingCollective` whose ``wait()`` gives the slice."""
    world = group_size(group)
    if world == 1:
        return PendingCollective(None, None, "reduce_scatter", tag, tensor) if async_op else tensor
    tensor = tensor.contiguous()
    out = torch.empty(
        (tensor.shape[0] // world, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device
    )
    pending = reduce_scatter_into(out, tensor, group, ledger, tag=tag, async_op=async_op)
    return pending if async_op else pending.result


def all_gather_into(
    out: torch.Tensor,
    shard: torch.Tensor,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    async_op: bool = False,
) -> PendingCollective:
    """Gather every rank's equal-sized ``shard`` into ``out`` (world·n, ...), in rank order,
    without allocating: the ZeRO parameter gather. ``shard`` must not alias ``out``."""
    if group_size(group) == 1:
        out.copy_(shard)
        return PendingCollective(None, None, "all_gather", tag, out)
    return _launch(
        "all_gather",
        tag,
        nbytes(out),
        ledger,
        lambda: all_gather_flat(out, shard, group=group, async_op=True),
        out,
        async_op,
    )


def reduce_scatter_into(
    out: torch.Tensor,
    tensor: torch.Tensor,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    async_op: bool = False,
) -> PendingCollective:
    """Sum ``tensor`` (world·n, ...) across ranks and write this rank's n-slice into
    ``out``: the ZeRO-2/3 gradient reduction, and sequence parallelism's."""
    if group_size(group) == 1:
        out.copy_(tensor)
        return PendingCollective(None, None, "reduce_scatter", tag, out)
    return _launch(
        "reduce_scatter",
        tag,
        nbytes(tensor),
        ledger,
        lambda: reduce_scatter_flat(out, tensor, group=group, async_op=True),
        out,
        async_op,
    )


def isend(
    tensor: torch.Tensor,
    peer: int,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    message: int = 0,
) -> PendingCollective:
    """Start sending ``tensor`` to the group-local rank ``peer``; ``message`` is the
    transport tag that tells transfers between the same two ranks apart."""
    return _launch(
        "send",
        tag,
        nbytes(tensor),
        ledger,
        lambda: dist.isend(tensor, group=group, group_dst=peer, tag=message),
        tensor,
        async_op=True,
    )


def irecv(
    tensor: torch.Tensor,
    peer: int,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    message: int = 0,
) -> PendingCollective:
    """Start receiving into ``tensor`` from the group-local rank ``peer``; ``wait()``
    returns it, and the wait is the exposed time charged to the ledger."""
    return _launch(
        "recv",
        tag,
        nbytes(tensor),
        ledger,
        lambda: dist.irecv(tensor, group=group, group_src=peer, tag=message),
        tensor,
        async_op=True,
    )


def send(
    tensor: torch.Tensor,
    peer: int,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    message: int = 0,
) -> None:
    isend(tensor, peer, group, ledger, tag=tag, message=message).wait()


def recv(
    tensor: torch.Tensor,
    peer: int,
    group,
    ledger: CommLedger | None = None,
    *,
    tag: str = "",
    message: int = 0,
) -> torch.Tensor:
    return irecv(tensor, peer, group, ledger, tag=tag, message=message).wait()
