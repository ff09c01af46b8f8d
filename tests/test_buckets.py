"""Gradient bucket layout (no processes)."""

from __future__ import annotations

import torch
from torch import nn

from paracube.data_parallel.buckets import build_buckets


def test_reverse_order_cap_and_views():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 20, 30, 40)]
    buckets = build_buckets(params, cap_bytes=50 * 4)  # 50 floats
    assert [[p.numel() for p in b.params] for b in buckets] == [[40], [30, 20], [10]]
    for b in buckets:
        b.bind_grads()
        assert b.buffer.numel() == sum(p.numel() for p in b.params)
    params[1].grad.fill_(3.0)  # writing the grad writes the bucket buffer
    assert buckets[1].buffer[30:].eq(3.0).all() and buckets[1].buffer[:30].eq(0).all()


def test_oversized_parameter_and_first_bucket():
    params = [nn.Parameter(torch.zeros(n)) for n in (5, 5, 100, 5, 5)]
    buckets = build_buckets(params, cap_bytes=40 * 4, first_cap_bytes=5 * 4)
    assert [[p.numel() for p in b.params] for b in buckets] == [[5], [5], [100], [5, 5]]


def test_dtypes_never_share_a_bucket():
    params = [nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4, dtype=torch.float64))]
    buckets = build_buckets(params, cap_bytes=1 << 20)
    assert [b.buffer.dtype for b in buckets] == [torch.float64, torch.float32]
