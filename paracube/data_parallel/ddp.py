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

ZeRO stages 1 and 2 (Rajbhandari et al. 2020) live here too, as a change of what the
buckets keep: buffers are padded to a multiple of the group size and each rank owns one
equal slice of every bucket (:meth:`DataParallel.shards`). Stage 1 all-reduces as above
and steps only its slice; stage 2 *reduce-scatters* each bucket into a persistent slice
and frees the bucket's buffer until the next backward needs it. After the optimizer step
the slices are all-gathered back into the (full, replicated) parameters.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.buckets import GradBucket, build_buckets
from paracube.data_parallel.hooks import AllReduceHook, GradReduceHook, ReduceScatterHook, Waitable
from paracube.data_parallel.shards import FlatShard, free_storage, shard_bounds, slice_layout

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
        zero_stage: 0 (replicated optimizer), 1 (optimizer states sharded: each rank steps
            its slice of every bucket) or 2 (gradients reduce-scattered into slices too).
            Stages ≥ 1 imply ``contiguous_params``.
        grad_dtype: dtype of the gradient buffers and their reduction (e.g. fp32 under a
            bf16 model); default: the parameters' dtype.
        pre_reduce: ``pre_reduce(params, grad_views)`` runs just before a bucket is reduced — where
            gradients that other groups must sum first (sequence-parallel norms over tp,
            a tied embedding/head over the first and last pipeline stage) are summed.
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
        zero_stage: int = 0,
        grad_dtype: torch.dtype | None = None,
        pre_reduce=None,
    ):
        super().__init__()
        if zero_stage not in (0, 1, 2):
            raise ValueError(f"DataParallel handles ZeRO stages 0, 1, 2, got {zero_stage} (stage 3: ShardedDataParallel)")
        self.module = module
        self.group = group
        self.ledger = ledger
        self.world = ops.group_size(group)
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.average = average
        self.zero_stage = zero_stage
        self.pre_reduce = pre_reduce
        self.reduce_hook = reduce_hook or (ReduceScatterHook(self) if zero_stage == 2 else AllReduceHook())
        params = [p for p in module.parameters() if p.requires_grad]
        self._params, self._group_key = params, group_key or (lambda p: None)
        first = None if first_bucket_mb is None else int(first_bucket_mb * MIB)
        # Every rank keeps buckets, also a group of one: they are what the optimizer steps
        # (flat, fused), where fp32 gradients of a bf16 model accumulate, and where
        # pre-reduce sums (sequence parallel, tied weights) happen. Only the reduction is
        # skipped when there is nobody to reduce with.
        self.buckets: list[GradBucket] = build_buckets(
            params, int(bucket_mb * MIB), first, group_key,
            pad_to=self.world if zero_stage else 1, dtype=grad_dtype,
        )
        self._where = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._sync = True
        self._callback_queued = False
        self._next_launch = 0
        self._inflight: list[Waitable] = []
        self._broadcast_state()
        for b in self.buckets:
            if contiguous_params or zero_stage:
                b.make_contiguous()
            b.bind_grads()
            if zero_stage == 2:
                lo, hi = shard_bounds(b.buffer.numel(), self.world, self.rank)
                b.grad_shard = torch.zeros(hi - lo, dtype=b.buffer.dtype, device=b.buffer.device)
                b.free()  # allocated again when its first gradient arrives
        # With nobody to reduce with there is no communication to overlap: no per-gradient
        # hooks; call sync_gradients() after the last backward instead.
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params] if self.world > 1 else []

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
        for b in self.buckets:
            b.shard_fresh = True
            if set_to_none or not b.allocated:
                b.release_grads()
            else:
                b.buffer.zero_()
                b.bind_grads()
            if b.flat_param is not None and b.bindable and b.allocated:
                b.flat_param.grad = b.buffer

    @property
    def needs_sync_call(self) -> bool:
        """True when backward does not synchronise by itself (a group of one rank): the
        caller must call :meth:`sync_gradients` after the last backward of a step."""
        return self.world == 1

    def sync_gradients(self) -> None:
        """Reduce every bucket now, for gradients accumulated outside a synchronised
        backward (e.g. a pipeline step run under :meth:`no_sync`, weight gradients a
        zero-bubble W pass wrote directly, or any step of a one-rank group)."""
        for b in self.buckets:
            for i, p in enumerate(b.params):
                if p.grad is not None and (not b.bindable or not b.allocated
                                           or p.grad.data_ptr() != b.views[i].data_ptr()):
                    b.absorb(i)
        self._finish_backward()

    def flat_parameters(self) -> list[tuple[object, nn.Parameter]]:
        """``(group key, flat parameter)`` per bucket; needs ``contiguous_params=True``.

        Give these to the optimizer instead of the module's parameters: their ``.grad``
        is the reduced bucket buffer, and stepping them updates the module in place.
        """
        if any(b.flat_param is None for b in self.buckets):
            raise RuntimeError("flat_parameters() needs DataParallel(..., contiguous_params=True)")
        return [(b.key, b.flat_param) for b in self.buckets]

    def release_gradient_memory(self) -> None:
        """After the optimizer step, free what held gradients until the next backward
        allocates it again: ZeRO-1's full buffers (only this rank's slice was needed, and
        it has been consumed), ZeRO-2's gradient slices (each bucket itself is freed as soon
        as it is reduce-scattered)."""
        for b in self.buckets:
            if b.allocated:
                b.free()
            if b.grad_shard is not None:
                free_storage(b.grad_shard)

    def shards(self) -> list[FlatShard]:
        """What this rank's optimizer steps, one :class:`FlatShard` per bucket: the whole
        bucket (ZeRO-0) or this rank's 1/dp slice of it (ZeRO-1/2)."""
        shards = []
        for b in self.buckets:
            n = b.buffer.numel()
            lo, hi = shard_bounds(n, self.world, self.rank) if self.zero_stage else (0, n)
            ranges, segments = slice_layout(b.params, b.offsets, lo, min(hi, b.numel), self._group_key)
            if self.zero_stage == 2:
                grad = (lambda b=b: b.grad_shard)
            else:
                grad = (lambda b=b, lo=lo, hi=hi: b.buffer[lo:hi])
            gather = None
            if self.zero_stage and self.world > 1:
                gather = (lambda b=b, lo=lo, hi=hi: ops.all_gather_into(
                    b.flat_param.data, b.flat_param.data[lo:hi].clone(), self.group, self.ledger,
                    tag="param", async_op=True))
            shards.append(FlatShard(b.flat_param.data[lo:hi], grad, ranges, segments,
                                    sharded=self.zero_stage > 0 and self.world > 1, gather=gather,
                                    name=f"bucket{b.index}"))
        return shards

    @property
    def grad_bytes(self) -> int:
        """Bytes reduced by one synchronised backward: the trainable parameters' bytes."""
        return sum(b.buffer.numel() * b.buffer.element_size() for b in self.buckets)

    # -- internals ------------------------------------------------------------------------

    @torch.no_grad()
    def _broadcast_state(self) -> None:
        """Start every replica from data-parallel rank 0's parameters and buffers."""
        if self.world == 1:
            return
        tensors = [t for t in list(self.module.parameters()) + list(self.module.buffers()) if t.numel()]
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
        if param.grad is None:  # an undefined gradient (a zero-bubble I pass defers dW)
            return
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
                bucket.allocate()
                bucket.zero_stale()  # parameters without a gradient this window count as 0
            if self.pre_reduce is not None:
                self.pre_reduce(bucket.params, bucket.views)
            if self.world > 1:
                if self.average:
                    bucket.buffer.div_(self.world)
                self._inflight.append(self.reduce_hook(bucket, self.group, self.ledger))
            elif self.zero_stage == 2:  # one rank: the "slice" is the whole bucket
                self._inflight.append(ReduceScatterHook(self)(bucket, self.group, None))
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
