"""The one unit every data-parallel flavour is made of: a flat gradient buffer, its
parameters' views into it, and this rank's slice of it.

Gradients live *inside* the buffer (``param.grad`` is a view of its slice where the
dtypes agree), so autograd accumulates straight into it and a reduction needs no copy in
or out — the ``gradient_as_bucket_view`` layout of Li et al. 2020 (PyTorch DDP, VLDB).
The buffer is padded to a multiple of the group size so that every rank owns one equal
slice ``[lo, hi)`` — what ZeRO steps (Rajbhandari et al. 2020). Its parameters can be
moved into one flat tensor laid out the same way (:meth:`FlatUnit.make_contiguous`), so a
fused optimizer steps a whole unit at once and ZeRO-3 can gather and free it.

ZeRO-0/1/2 buckets (:mod:`paracube.data_parallel.ddp`) and ZeRO-3 units
(:mod:`paracube.data_parallel.zero3`) are FlatUnits; how a unit's buffer is reduced is
the wrapper's injected reducer (:mod:`paracube.data_parallel.reducers`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from paracube.data_parallel.shards import (
    FlatShard,
    Waitable,
    alloc_storage,
    free_storage,
    is_allocated,
    shard_bounds,
    slice_layout,
)


class FlatUnit:
    """Parameters ``params`` and their flat gradient buffer ``buffer`` (padded numel,).

    ``index`` is the unit's place in the launch order: units are reduced strictly in
    index order on every rank, so collectives match across ranks even when gradients
    arrive in another order. ``world``/``rank`` cut the buffer into slices (1/0: the
    slice is the whole buffer). ``grad_dtype`` is the buffer's dtype when it differs from
    the parameters' (fp32 gradient reduction under bf16).
    """

    def __init__(
        self,
        index: int,
        params: list[nn.Parameter],
        *,
        world: int = 1,
        rank: int = 0,
        grad_dtype: torch.dtype | None = None,
        key: Hashable = None,
        name: str = "",
        allocate: bool = True,
    ):
        self.index, self.params, self.key = index, list(params), key
        self.name = name or f"unit{index}"
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total  # elements that belong to parameters; the rest is padding
        padded = -(-total // world) * world
        self.lo, self.hi = shard_bounds(padded, world, rank)
        first = self.params[0]
        self.buffer = torch.empty(padded, dtype=grad_dtype or first.dtype, device=first.device)
        self.views = [
            self.buffer[o : o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)
        ]
        if allocate:
            self.buffer.zero_()
        else:  # ZeRO-3: the buffer exists only during backward (allocate() gives it memory)
            free_storage(self.buffer)
        self.stale = [True] * len(self.params)  # slice not written since the window began
        self.pending = len(self.params)  # gradients still to come in this backward
        self.flat: torch.Tensor | None = None  # the parameters' flat storage (make_contiguous)
        # A sharded reduction's result: this rank's reduced slice, persistent across the
        # accumulation window (ZeRO-2/3); ``shard_fresh``: the next reduction overwrites it.
        self.grad_shard: torch.Tensor | None = None
        self.shard_fresh = True

    # -- the gradient buffer ------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of the gradient buffer as allocated now (0 while freed)."""
        return self.buffer.untyped_storage().nbytes()

    @property
    def bindable(self) -> bool:
        """``param.grad`` can be a view of the buffer only when the dtypes agree (a bf16
        model reducing gradients in fp32 copies them in instead)."""
        return self.buffer.dtype == self.params[0].dtype

    @property
    def allocated(self) -> bool:
        return is_allocated(self.buffer)

    def allocate(self) -> None:
        """Give a freed buffer its memory back (padding zeroed, every slice stale)."""
        if alloc_storage(self.buffer):
            self.buffer[self.numel :].zero_()
            self.stale = [True] * len(self.params)

    def free(self) -> None:
        """Release the buffer's memory (once a sharded reduction holds the result)."""
        for p in self.params:
            p.grad = None
        free_storage(self.buffer)

    def bind_grads(self) -> None:
        """Point every ``param.grad`` at its slice of the buffer."""
        if self.bindable:
            for p, view in zip(self.params, self.views):
                p.grad = view

    def release_grads(self) -> None:
        """Start a new accumulation window without touching the buffer (no memset): each
        ``param.grad`` becomes None, autograd hands over a fresh gradient, and
        :meth:`absorb` *copies* it into the slice — one pass instead of zero + add."""
        for p in self.params:
            p.grad = None
        self.stale = [True] * len(self.params)

    def absorb(self, i: int, bind: bool = True) -> None:
        """Make sure ``params[i]``'s gradient lives in its slice; afterwards ``.grad`` is
        the view (``bind`` and dtypes agree) or None (the buffer holds it)."""
        p, view, grad = self.params[i], self.views[i], self.params[i].grad
        assert grad is not None, "absorb() needs a gradient"
        self.allocate()
        if grad.data_ptr() != view.data_ptr():
            if self.stale[i]:
                view.copy_(grad)
            else:
                view.add_(grad)
            p.grad = view if bind and self.bindable else None
        self.stale[i] = False

    def has_stray_grad(self, i: int) -> bool:
        """A gradient written outside the hooks (one-rank groups, zero-bubble W passes)."""
        g = self.params[i].grad
        return g is not None and (
            not self.bindable or not self.allocated or g.data_ptr() != self.views[i].data_ptr()
        )

    def prepare_reduce(self) -> None:
        """Before the reduction: the buffer allocated, slices that got no gradient in this
        window zeroed (a parameter unused this step contributes 0)."""
        self.allocate()
        for i, view in enumerate(self.views):
            if self.stale[i]:
                view.zero_()
                self.stale[i] = False

    def reset(self) -> None:
        """After a synchronised backward: a new window, in which every slice is
        overwritten by (not added to) the first gradient it receives."""
        self.pending = len(self.params)
        self.stale = [True] * len(self.params)

    def make_grad_shard(self) -> None:
        """Keep a persistent slice for a sharded (reduce-scatter) reduction."""
        self.grad_shard = torch.zeros(
            self.hi - self.lo, dtype=self.buffer.dtype, device=self.buffer.device
        )

    @property
    def sharded_grad(self) -> torch.Tensor:
        """The persistent reduced slice (after :meth:`make_grad_shard`)."""
        assert self.grad_shard is not None, "this unit has no gradient slice (no sharded reducer)"
        return self.grad_shard

    # -- the parameters -----------------------------------------------------------------

    @torch.no_grad()
    def make_contiguous(self) -> torch.Tensor:
        """Move the parameters' storage into one flat tensor laid out like the buffer and
        return it: each ``param.data`` becomes a view of it, so stepping the flat tensor
        (one fused kernel per unit instead of one launch per tensor) updates the module in
        place — the contiguous parameter buffers of Megatron-Core's distributed optimizer."""
        # Empty, not zeros: a page becomes resident only as a parameter is copied in and
        # the parameter's own memory is released, so the unit is not held twice.
        flat = torch.empty(
            self.buffer.numel(), dtype=self.params[0].dtype, device=self.buffer.device
        )
        flat[self.numel :].zero_()  # the padding
        for p, o in zip(self.params, self.offsets):
            view = flat[o : o + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
        self.flat = flat
        return flat

    def shard(
        self,
        values: torch.Tensor,
        grad: Callable[[], torch.Tensor],
        key: Callable[[nn.Parameter], Hashable],
        *,
        sharded: bool,
        gather: Callable[[], Waitable] | None = None,
    ) -> FlatShard:
        """This rank's slice described for the optimizer and for checkpoints."""
        hi = max(self.lo, min(self.hi, self.numel))
        ranges, segments = slice_layout(self.params, self.offsets, self.lo, hi, key)
        return FlatShard(
            values, grad, ranges, segments, sharded=sharded, gather=gather, name=self.name
        )
