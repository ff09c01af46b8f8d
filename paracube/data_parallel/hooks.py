"""The per-bucket reduction hook: where gradient compression plugs in.

A hook gets a complete :class:`GradBucket` and must start reducing its buffer across the
data-parallel group, returning a handle whose ``wait()`` leaves the reduced gradient in
``bucket.buffer``. The plain hook all-reduces the buffer as is. Compressors (fp16/bf16
casting, Top-K with error feedback, PowerSGD) implement the same protocol and keep their
own state (error-feedback residuals, low-rank factors) keyed by ``bucket.index``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.buckets import GradBucket
from paracube.data_parallel.shards import alloc_storage


class Waitable(Protocol):
    def wait(self): ...


class GradReduceHook(Protocol):
    def __call__(self, bucket: GradBucket, group, ledger: CommLedger | None) -> Waitable: ...


class AllReduceHook:
    """Uncompressed: one asynchronous all-reduce (sum) of the whole bucket buffer."""

    def __call__(self, bucket: GradBucket, group, ledger: CommLedger | None) -> Waitable:
        return ops.all_reduce(bucket.buffer, group, ledger, tag="grad", async_op=True)


class ReduceScatterHook:
    """ZeRO-2: reduce-scatter the bucket so that this rank receives only its slice, add
    the slice to the rank's persistent gradient slice, and free the bucket's buffer — the
    full gradient exists only while its bucket is being filled and reduced."""

    def __init__(self, dp) -> None:
        self.dp = dp  # the DataParallel that owns the buckets (group size and rank)

    def __call__(self, bucket: GradBucket, group, ledger: CommLedger | None) -> Waitable:
        alloc_storage(bucket.grad_shard)  # released after the previous step
        # The first reduction of an accumulation window writes the slice in place.
        out = bucket.grad_shard if bucket.shard_fresh else torch.empty_like(bucket.grad_shard)
        pending = ops.reduce_scatter_into(out, bucket.buffer, group, ledger, tag="grad", async_op=True)
        return _AfterReduceScatter(pending, bucket, out)


class _AfterReduceScatter:
    def __init__(self, pending, bucket: GradBucket, out) -> None:
        self.pending, self.bucket, self.out = pending, bucket, out

    def wait(self):
        self.pending.wait()
        if self.out is not self.bucket.grad_shard:
            self.bucket.grad_shard.add_(self.out)
        self.bucket.shard_fresh = False
        self.bucket.free()
        return self.bucket.grad_shard
