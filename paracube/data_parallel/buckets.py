"""Gradient buckets: parameters grouped into flat buffers that are reduced as one.

Gradients live *inside* the bucket buffers (``param.grad`` is a view of its slice), so
autograd accumulates straight into the buffer and the reduction needs no copy in or out —
the ``gradient_as_bucket_view`` layout of Li et al. 2020 (PyTorch DDP, VLDB), which torch's
DDP leaves off by default.

Parameters are bucketed in *reverse* registration order, which approximates the order in
which backward produces their gradients (the last layer's first), so the first bucket to
fill is the first one launched, while backward still runs through earlier layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch
from torch import nn

from paracube.data_parallel.shards import alloc_storage, free_storage, is_allocated


@dataclass
class GradBucket:
    """One flat gradient buffer and the parameters whose gradients are views of it.

    ``index`` is also the launch order: buckets are reduced strictly in index order on
    every rank, so the collectives match across ranks even if hooks fire in another order.
    """

    index: int
    params: list[nn.Parameter]
    offsets: list[int]  # start of each param's gradient in ``buffer``
    buffer: torch.Tensor  # (padded numel,): sum of numels rounded up to a multiple of ``pad_to``
    key: Hashable = None  # the group key its parameters share (e.g. "decayed or not")
    numel: int = 0  # elements that belong to parameters; the rest is padding for ZeRO shards
    pending: int = field(init=False)  # gradients still to come in this backward
    flat_param: nn.Parameter | None = field(init=False, default=None)
    views: list[torch.Tensor] = field(init=False)  # views[i]: params[i]'s gradient slice
    stale: list[bool] = field(init=False)  # slice not written since the last zero_grad
    # ZeRO-2: this rank's reduced gradient slice, persistent across the accumulation window.
    grad_shard: torch.Tensor | None = field(init=False, default=None)
    shard_fresh: bool = field(init=False, default=True)  # next reduced slice overwrites it

    def __post_init__(self) -> None:
        self.pending = len(self.params)
        self.numel = self.numel or sum(p.numel() for p in self.params)
        self.views = [self.buffer[o : o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]
        self.stale = [True] * len(self.params)

    @property
    def nbytes(self) -> int:
        """Bytes of the gradient buffer as allocated now (0 while a ZeRO-2 buffer is freed)."""
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
        """Release the buffer's memory (ZeRO-2, once its slice has been reduced)."""
        for p in self.params:
            p.grad = None
        free_storage(self.buffer)

    def bind_grads(self) -> None:
        """Point every ``param.grad`` at its slice of the buffer."""
        if not self.bindable:
            return
        for p, view in zip(self.params, self.views):
            p.grad = view

    def release_grads(self) -> None:
        """Start a new accumulation window without touching the buffer (no memset): each
        ``param.grad`` becomes None, autograd hands over its fresh gradient, and
        :meth:`absorb` *copies* it into the slice — one pass instead of zero + add."""
        for p in self.params:
            p.grad = None
        self.stale = [True] * len(self.params)

    def absorb(self, i: int) -> None:
        """Make sure ``params[i]``'s gradient lives in its slice (and ``.grad`` is the view)."""
        p, view = self.params[i], self.views[i]
        self.allocate()
        if p.grad.data_ptr() != view.data_ptr():
            if self.stale[i]:
                view.copy_(p.grad)
            else:
                view.add_(p.grad)
            p.grad = view if self.bindable else None
        self.stale[i] = False

    def zero_stale(self) -> None:
        """Zero the slices of parameters that got no gradient in this window."""
        for i, view in enumerate(self.views):
            if self.stale[i]:
                view.zero_()
                self.stale[i] = False

    def reset(self) -> None:
        """After a synchronised backward: a new accumulation window begins, in which every
        slice is overwritten by (not added to) the first gradient it receives."""
        self.pending = len(self.params)
        self.stale = [True] * len(self.params)

    @torch.no_grad()
    def make_contiguous(self) -> nn.Parameter:
        """Move the parameters' storage into one flat tensor too, laid out like the
        gradient buffer, and return it as a parameter whose ``.grad`` is the buffer.

        Each ``param.data`` becomes a view of the flat tensor, so an optimizer stepping
        the flat parameter (one fused kernel for the whole bucket instead of one launch
        per tensor) updates the model's parameters in place — the contiguous parameter
        and gradient buffers of Megatron-Core's distributed data parallel.
        """
        flat = torch.zeros(self.buffer.numel(), dtype=self.params[0].dtype, device=self.buffer.device)
        for i, p in enumerate(self.params):
            view = flat[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
        self.flat_param = nn.Parameter(flat)
        if self.bindable:
            self.flat_param.grad = self.buffer
        return self.flat_param


def build_buckets(
    params: list[nn.Parameter],
    cap_bytes: int,
    first_cap_bytes: int | None = None,
    key: Callable[[nn.Parameter], Hashable] | None = None,
    *,
    pad_to: int = 1,
    dtype: torch.dtype | None = None,
) -> list[GradBucket]:
    """Split ``params`` (reverse order) into buckets of at most ``cap_bytes`` each.

    A parameter larger than the cap gets a bucket of its own. Parameters of different
    dtype, device or ``key(param)`` (e.g. optimizer group) never share a bucket.
    ``first_cap_bytes`` may make the first bucket smaller, so the first all-reduce starts
    early in backward. ``pad_to`` rounds each buffer up to a multiple (the data-parallel
    size, so ZeRO can cut it into equal shards); ``dtype`` is the gradient dtype when it
    differs from the parameters' (fp32 gradient reduction under bf16).
    """
    key = key or (lambda p: None)
    buckets: list[GradBucket] = []
    # One open bucket per (dtype, device, key): interleaved kinds (a layer's weight, then
    # its bias) fill their own buckets instead of closing each other's.
    open_: dict[tuple, list[nn.Parameter]] = {}
    sizes: dict[tuple, int] = {}

    def close(kind: tuple) -> None:
        members = open_.pop(kind, [])
        sizes.pop(kind, None)
        if not members:
            return
        offsets, total = [], 0
        for p in members:
            offsets.append(total)
            total += p.numel()
        padded = -(-total // pad_to) * pad_to
        buffer = torch.zeros(padded, dtype=dtype or members[0].dtype, device=members[0].device)
        buckets.append(GradBucket(len(buckets), members, offsets, buffer, kind[2], total))

    for p in reversed(params):
        kind = (p.dtype, p.device, key(p))
        cap = first_cap_bytes if (not buckets and first_cap_bytes) else cap_bytes
        p_bytes = p.numel() * p.element_size()
        if open_.get(kind) and sizes[kind] + p_bytes > cap:
            close(kind)
        open_.setdefault(kind, []).append(p)
        sizes[kind] = sizes.get(kind, 0) + p_bytes
    for kind in list(open_):  # the rest, in the order they were opened
        close(kind)
    return buckets
