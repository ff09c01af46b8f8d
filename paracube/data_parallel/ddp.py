"""Data parallelism for any ``nn.Module``: bucketed gradient all-reduce overlapped with backward.

How one synchronised backward goes (Li et al. 2020, "PyTorch Distributed", §3.2):

1. autograd accumulates each gradient straight into its slice of a flat bucket buffer;
2. a post-accumulate hook counts the bucket's ready gradients; when a bucket is
   complete, it and every complete bucket after it (in index order) are handed to the
   reduction hook, which launches an asynchronous all-reduce — while backward goes on
   computing earlier layers' gradients;
3. a callback queued at the end of backward launches any bucket still incomplete
   (parameters that got no gradient this step) and waits for all reductions.

Inside :meth:`DataParallel.no_sync` nothing is communicated: gradients just accumulate in
the buffers, and the next synchronised backward reduces the sum (gradient accumulation
with one communication per accumulation window).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.buckets import GradBucket, build_buckets
from paracube.data_parallel.hooks import AllReduceHook, GradReduceHook, Waitable

MIB = 1 << 20


class DataParallel(nn.Module):
    """Wrap ``module`` for data parallelism over ``group``.

    Args:
        module: any module; its parameters are broadcast from the group's rank 0.
        group: the data-parallel process group (``mesh.group("dp")``); ``None`` = world.
        ledger: where the all-reduces are counted (``mesh.ledger``).
        bucket_mb: bucket capacity in MiB.
        first_bucket_mb: capacity of the first bucket (smaller → communication starts
            sooner in backward); defaults to ``bucket_mb``.
        average: divide gradients by the group size (torch DDP's convention). Pass
            ``False`` when the loss is already normalised by the *global* sample count,
            so the reduction is a plain sum.
        reduce_hook: the per-bucket reduction (see :mod:`paracube.data_parallel.hooks`).
        group_key: parameters with different keys never share a bucket — pass the
            optimizer group (e.g. "weight-decayed or not") to step buckets as flat tensors.
        contiguous_params: also store each bucket's parameters in one flat tensor and
            expose it through :meth:`flat_parameters` (see ``GradBucket.make_contiguous``).
    """

    def __init__(
        self,
        module: nn.Module,
        group=None,
        ledger: CommLedger | None = None,
        *,
        bucket_mb: float = 25.0,
        first_bucket_mb: float | None = None,
        average: bool = True,
        reduce_hook: GradReduceHook | None = None,
        group_key=None,
        contiguous_params: bool = False,
    ):
        super().__init__()
        self.module = module
        self.group = group
        self.ledger = ledger
        self.world = ops.group_size(group)
        self.average = average
        self.reduce_hook = reduce_hook or AllReduceHook()
        params = [p for p in module.parameters() if p.requires_grad]
        self._params, self._group_key = params, group_key or (lambda p: None)
        first = None if first_bucket_mb is None else int(first_bucket_mb * MIB)
        # A group of one rank has nothing to reduce: no buckets, no hooks, plain gradients.
        self.buckets: list[GradBucket] = (
            build_buckets(params, int(bucket_mb * MIB), first, group_key) if self.world > 1 else []
        )
        self._where = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._sync = True
        self._callback_queued = False
        self._next_launch = 0
        self._inflight: list[Waitable] = []
        self._broadcast_state()
        for b in self.buckets:
            if contiguous_params:
                b.make_contiguous()
            b.bind_grads()
        if self.world > 1:
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    # -- public API ---------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communicating."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new accumulation window.

        By default no memory is touched: gradients are released and the next backward
        copies them into the bucket buffers. ``set_to_none=False`` zeroes the buffers and
        keeps ``param.grad`` bound to them instead.
        """
        if self.world == 1:
            self.module.zero_grad(set_to_none=set_to_none)
        for b in self.buckets:
            if set_to_none:
                b.release_grads()
            else:
                b.buffer.zero_()
                b.bind_grads()
            if b.flat_param is not None:
                b.flat_param.grad = b.buffer

    def sync_gradients(self) -> None:
        """Reduce every bucket now, for gradients accumulated outside a synchronised
        backward (e.g. a pipeline step run under :meth:`no_sync`, or weight gradients a
        zero-bubble W pass wrote directly)."""
        if self.world == 1:
            return
        for b in self.buckets:
            for i, p in enumerate(b.params):
                if p.grad is not None:
                    b.absorb(i)
        self._finish_backward()

    def flat_parameters(self) -> list[tuple[object, nn.Parameter]]:
        """``(group key, flat parameter)`` per bucket; needs ``contiguous_params=True``.

        Give these to the optimizer instead of the module's parameters: their ``.grad``
        is the reduced bucket buffer, and stepping them updates the module in place. (A
        one-rank group has no buckets: then these are the module's own parameters.)
        """
        if self.world == 1:
            return [(self._group_key(p), p) for p in self._params]
        if any(b.flat_param is None for b in self.buckets):
            raise RuntimeError("flat_parameters() needs DataParallel(..., contiguous_params=True)")
        return [(b.key, b.flat_param) for b in self.buckets]

    @property
    def grad_bytes(self) -> int:
        """Bytes all-reduced by one synchronised backward: the trainable parameters' bytes."""
        return sum(b.nbytes for b in self.buckets)

    # -- internals ------------------------------------------------------------------------

    @torch.no_grad()
    def _broadcast_state(self) -> None:
        """Start every replica from data-parallel rank 0's parameters and buffers."""
        if self.world == 1:
            return
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        by_dtype: dict[tuple, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault((t.dtype, t.device), []).append(t)
        for group_tensors in by_dtype.values():  # one broadcast per dtype, not per tensor
            flat = torch.cat([t.reshape(-1) for t in group_tensors])
            ops.broadcast(flat, 0, self.group, self.ledger, tag="init")
            offset = 0
            for t in group_tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        bucket, i = self._where[param]
        bucket.absorb(i)  # the gradient now lives in the bucket, also under no_sync
        if not self._sync:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket.pending -= 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        """Launch complete buckets in index order (or all remaining ones if ``force``)."""
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.pending > 0:
                if not force:
                    return
                bucket.zero_stale()  # parameters without a gradient this window count as 0
            if self.average:
                bucket.buffer.div_(self.world)
            self._inflight.append(self.reduce_hook(bucket, self.group, self.ledger))
            self._next_launch += 1

    def _finish_backward(self) -> None:
        self._launch_ready(force=True)
        for handle in self._inflight:
            handle.wait()
        self._inflight.clear()
        self._next_launch = 0
        self._callback_queued = False
        for b in self.buckets:
            b.reset()
