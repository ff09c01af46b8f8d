"""This rank's slice of a flat buffer — what the optimizer steps and a checkpoint stores.

Every data-parallel flavour ends a backward with, per flat buffer (a gradient bucket or
a ZeRO-3 unit, :class:`paracube.data_parallel.flat.FlatUnit`), a reduced gradient for
some slice ``[lo, hi)`` of it:

- ZeRO-0: the whole buffer (every rank steps every parameter);
- ZeRO-1: rank r's 1/dp slice of the all-reduced buffer (Rajbhandari et al. 2020, P_os);
- ZeRO-2: the same slice, but reduce-scattered, so only the slice exists (P_os+g);
- ZeRO-3: the slice, and the parameters themselves exist only as slices (P_os+g+p).

:class:`FlatShard` describes that slice uniformly, so one optimizer wrapper
(:mod:`paracube.data_parallel.optimizer`) serves all four: which elements belong to which
optimizer group (weight decay or not), which parameter each element belongs to and at
which offset inside that parameter (:class:`Segment` — the true per-parameter layout a
checkpoint of flat slices needs; a flat buffer is not a ``Shard(0)`` of any parameter),
and how to rebuild the full parameters after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import nn


class Waitable(Protocol):
    """A started communication: ``wait()`` finishes it."""

    def wait(self) -> object: ...


class Segment(NamedTuple):
    """Shard-local elements ``[start, stop)`` hold ``param.view(-1)[param_offset :
    param_offset + stop - start]``."""

    param: nn.Parameter
    start: int
    stop: int
    param_offset: int


@dataclass
class FlatShard:
    """Rank-local slice ``[lo, hi)`` of one flat buffer.

    ``values`` is the (hi−lo,) compute-dtype view the updated parameters must land in;
    ``grad()`` returns the reduced (hi−lo,) gradient slice once the backward is synced.
    ``ranges`` are shard-local ``(group key, a, b)`` runs of elements by optimizer group,
    padding excluded; ``segments`` say which parameter each run of elements belongs to.
    ``sharded``: the slice is 1/dp of the buffer, so a global norm must also be summed
    over the data-parallel group. ``gather`` (ZeRO-1/2) starts rebuilding the full buffer
    from every rank's slice after the step.
    """

    values: torch.Tensor
    grad: Callable[[], torch.Tensor]
    ranges: list[tuple[Hashable, int, int]]
    segments: list[Segment]
    sharded: bool
    gather: Callable[[], Waitable] | None = None
    name: str = field(default="")


def slice_layout(
    params: list[nn.Parameter],
    offsets: list[int],
    lo: int,
    hi: int,
    key: Callable[[nn.Parameter], Hashable],
) -> tuple[list[tuple[Hashable, int, int]], list[Segment]]:
    """``ranges`` and ``segments`` (see :class:`FlatShard`) of the slice ``[lo, hi)`` of a
    flat buffer holding ``params`` at ``offsets``."""
    segments = []
    for p, o in zip(params, offsets):
        a, b = max(o, lo), min(o + p.numel(), hi)
        if a < b:
            segments.append(Segment(p, a - lo, b - lo, a - o))
    ranges: list[tuple[Hashable, int, int]] = []
    for seg in segments:  # merge neighbours of the same group into one run
        k = key(seg.param)
        if ranges and ranges[-1][0] == k and ranges[-1][2] == seg.start:
            ranges[-1] = (k, ranges[-1][1], seg.stop)
        else:
            ranges.append((k, seg.start, seg.stop))
    return ranges, segments


def shard_bounds(numel: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank's equal slice of a buffer of ``numel`` (a multiple of world)."""
    size = numel // world
    return rank * size, (rank + 1) * size


def storage_bytes(t: torch.Tensor | None) -> int:
    """Bytes allocated for ``t``'s storage now (0 while freed, or for None)."""
    return 0 if t is None else t.untyped_storage().nbytes()


def is_allocated(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() > 0


def alloc_storage(t: torch.Tensor) -> bool:
    """Give a freed tensor its memory back (contents undefined); views of it see the new
    memory, since they share the storage object. Returns whether it had to allocate."""
    if is_allocated(t):
        return False
    t.untyped_storage().resize_(t.numel() * t.element_size())
    return True


def free_storage(t: torch.Tensor) -> None:
    """Release a tensor's memory while the tensor (and its views) stay valid objects."""
    t.untyped_storage().resize_(0)
