"""Grouping parameters into gradient buckets (flat units reduced as one).

Parameters are bucketed in *reverse* registration order, which approximates the order in
which backward produces their gradients (the last layer's first), so the first bucket to
fill is the first one launched, while backward still runs through earlier layers (Li et
al. 2020, PyTorch DDP, §3.2.3).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from paracube.data_parallel.flat import FlatUnit


def build_buckets(
    params: list[nn.Parameter],
    cap_bytes: int,
    first_cap_bytes: int | None = None,
    key: Callable[[nn.Parameter], Hashable] | None = None,
    *,
    world: int = 1,
    rank: int = 0,
    dtype: torch.dtype | None = None,
) -> list[FlatUnit]:
    """Split ``params`` (reverse order) into buckets of at most ``cap_bytes`` each.

    A parameter larger than the cap gets a bucket of its own. Parameters of different
    dtype, device or ``key(param)`` (e.g. optimizer group) never share a bucket.
    ``first_cap_bytes`` may make the first bucket smaller, so the first reduction starts
    early in backward. ``world``/``rank``: buffers padded to a multiple of ``world`` and
    cut into equal slices (ZeRO); ``dtype``: the gradient dtype when it differs from the
    parameters' (fp32 gradient reduction under bf16).
    """
    key = key or (lambda p: None)
    buckets: list[FlatUnit] = []
    # One open bucket per (dtype, device, key): interleaved kinds (a layer's weight, then
    # its bias) fill their own buckets instead of closing each other's.
    open_: dict[tuple, list[nn.Parameter]] = {}
    sizes: dict[tuple, int] = {}

    def close(kind: tuple) -> None:
        members = open_.pop(kind, [])
        sizes.pop(kind, None)
        if members:
            i = len(buckets)
            buckets.append(
                FlatUnit(
                    i,
                    members,
                    world=world,
                    rank=rank,
                    grad_dtype=dtype,
                    key=kind[2],
                    name=f"bucket{i}",
                )
            )

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
