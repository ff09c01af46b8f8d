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

import torch
from torch import nn


@dataclass
class GradBucket:
    """One flat gradient buffer and the parameters whose gradients are views of it.

    ``index`` is also the launch order: buckets are reduced strictly in index order on
    every rank, so the collectives match across ranks even if hooks fire in another order.
    """

    index: int
    params: list[nn.Parameter]
    offsets: list[int]  # start of each param's gradient in ``buffer``
    buffer: torch.Tensor  # (sum of numels,), dtype/device of its params
    pending: int = field(init=False)

    def __post_init__(self) -> None:
        self.pending = len(self.params)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def grad_view(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)

    def bind_grads(self) -> None:
        """Point every ``param.grad`` at its slice of the buffer."""
        for i, p in enumerate(self.params):
            p.grad = self.grad_view(i)

    def reset(self) -> None:
        self.pending = len(self.params)


def build_buckets(
    params: list[nn.Parameter], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[GradBucket]:
    """Split ``params`` (reverse order) into buckets of at most ``cap_bytes`` each.

    A parameter larger than the cap gets a bucket of its own. Parameters of different
    dtype or device never share a bucket. ``first_cap_bytes`` may make the first bucket
    smaller, so the first all-reduce starts early in backward.
    """
    buckets: list[GradBucket] = []
    current: list[nn.Parameter] = []
    size = 0

    def close() -> None:
        nonlocal current, size
        if not current:
            return
        offsets, total = [], 0
        for p in current:
            offsets.append(total)
            total += p.numel()
        buffer = torch.zeros(total, dtype=current[0].dtype, device=current[0].device)
        buckets.append(GradBucket(len(buckets), current, offsets, buffer))
        current, size = [], 0

    for p in reversed(params):
        cap = first_cap_bytes if (not buckets and first_cap_bytes) else cap_bytes
        p_bytes = p.numel() * p.element_size()
        if current and (size + p_bytes > cap or p.dtype != current[0].dtype or p.device != current[0].device):
            close()
        current.append(p)
        size += p_bytes
    close()
    return buckets
