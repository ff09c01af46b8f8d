"""The per-bucket reduction hook: where gradient compression plugs in.

A hook gets a complete :class:`GradBucket` and must start reducing its buffer across the
data-parallel group, returning a handle whose ``wait()`` leaves the reduced gradient in
``bucket.buffer``. The plain hook all-reduces the buffer as is. Compressors (fp16/bf16
casting, Top-K with error feedback, PowerSGD) implement the same protocol and keep their
own state (error-feedback residuals, low-rank factors) keyed by ``bucket.index``.
"""

from __future__ import annotations

from typing import Protocol

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.buckets import GradBucket


class Waitable(Protocol):
    def wait(self): ...


class GradReduceHook(Protocol):
    def __call__(self, bucket: GradBucket, group, ledger: CommLedger | None) -> Waitable: ...


class AllReduceHook:
    """Uncompressed: one asynchronous all-reduce (sum) of the whole bucket buffer."""

    def __call__(self, bucket: GradBucket, group, ledger: CommLedger | None) -> Waitable:
        return ops.all_reduce(bucket.buffer, group, ledger, tag="grad", async_op=True)
