"""Data parallelism for any ``nn.Module``: bucketed gradient reduction overlapped with
backward, gradient accumulation, and ZeRO stages 1 and 2.

Gradients live in flat buckets (:mod:`paracube.data_parallel.buckets`) that are reduced
one by one as backward completes them (:class:`~paracube.data_parallel.base.FlatDataParallel`).
Inside :meth:`~FlatDataParallel.no_sync` nothing is communicated: gradients accumulate in
the buckets and the next synchronised backward reduces the sum (one communication per
accumulation window).

ZeRO stages 1 and 2 (Rajbhandari et al. 2020) are a change of what the buckets keep:
buffers are padded to a multiple of the group size and each rank owns one equal slice of
every bucket (:meth:`DataParallel.shards`). Stage 1 all-reduces and steps only its slice;
stage 2 *reduce-scatters* each bucket into a persistent slice and frees the bucket's
buffer until the next backward needs it. After the optimizer step the slices are
all-gathered back into the (full, replicated) parameters.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.base import FlatDataParallel, PreReduce, guard_optimizers
from paracube.data_parallel.buckets import build_buckets
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.reducers import AllReduce, Reducer, ReduceScatter, reduced_gradient
from paracube.data_parallel.shards import FlatShard, storage_bytes

MIB = 1 << 20


class DataParallel(FlatDataParallel):
    """Wrap ``module`` for data parallelism over ``group``.

    Args:
        module: any module; its parameters and buffers are broadcast from the group's rank 0.
        group: the data-parallel process group (``mesh.group("dp")``); ``None`` = world.
        ledger: where the collectives are counted (``mesh.ledger``).
        bucket_mb: bucket capacity in MiB.
        first_bucket_mb: capacity of the first bucket (smaller → communication starts
            sooner in backward); defaults to ``bucket_mb``.
        average: divide gradients by the group size (torch DDP's convention). Pass
            ``False`` when the loss is already normalised by the *global* sample count,
            so the reduction is a plain sum.
        reducer: how a complete bucket is reduced (:mod:`paracube.data_parallel.reducers`);
            default all-reduce (ZeRO-0/1) or reduce-scatter (ZeRO-2). Compressors go here.
        group_key: parameters with different keys never share a bucket — pass the
            optimizer group (e.g. "weight-decayed or not") to step buckets as flat tensors.
        contiguous_params: also store each bucket's parameters in one flat tensor and
            expose it through :meth:`flat_parameters` (see ``FlatUnit.make_contiguous``).
        zero_stage: 0 (replicated optimizer), 1 (optimizer states sharded: each rank steps
            its slice of every bucket) or 2 (gradients reduce-scattered into slices too).
            Stages ≥ 1 imply ``contiguous_params``.
        grad_dtype: dtype of the gradient buffers and their reduction (e.g. fp32 under a
            bf16 model); default: the parameters' dtype.
        pre_reduce: ``pre_reduce(params, grad_views)`` runs just before a bucket is
            reduced — where gradients that other groups must sum first (sequence-parallel
            norms over tp, a tied embedding/head over the first and last stage) are summed.

    >>> model = DataParallel(nn.Linear(4, 1), None)   # inside a torch.distributed job
    >>> model(torch.randn(2, 4)).sum().backward()       # the gradient is all-reduced
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
        reducer: Reducer | None = None,
        group_key=None,
        contiguous_params: bool = False,
        zero_stage: int = 0,
        grad_dtype: torch.dtype | None = None,
        pre_reduce: PreReduce | None = None,
    ):
        if zero_stage not in (0, 1, 2):
            raise ValueError(
                f"DataParallel handles ZeRO stages 0, 1, 2, got {zero_stage} (stage 3: ShardedDataParallel)"
            )
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb!r}")
        if reducer is not None and reducer.sharded != (zero_stage == 2):
            want = (
                "a sharded reducer (reduce-scatter into the slice)"
                if zero_stage == 2
                else ("a reducer that leaves the whole reduced buffer (all-reduce)")
            )
            raise ValueError(
                f"DataParallel(zero_stage={zero_stage}, reducer={type(reducer).__name__}): ZeRO "
                f"stage {zero_stage} needs {want}; e.g. CastReduce('bf16', sharded={zero_stage == 2})"
            )
        super().__init__(
            module,
            group,
            ledger,
            reducer=reducer or (ReduceScatter() if zero_stage == 2 else AllReduce()),
            average=average,
            pre_reduce=pre_reduce,
        )
        self.zero_stage = zero_stage
        # ZeRO-2 keeps no full gradients between micro-batches.
        self.accumulates_locally = zero_stage < 2
        if zero_stage >= 1:
            guard_optimizers(module, f"DataParallel(zero_stage={zero_stage})")
        self._group_key = group_key or (lambda p: None)
        # Every rank keeps buckets, also a group of one: they are what the optimizer steps
        # (flat, fused), where fp32 gradients of a bf16 model accumulate, and where
        # pre-reduce sums (sequence parallel, tied weights) happen.
        sliced = zero_stage > 0
        buckets = build_buckets(
            [p for p in module.parameters() if p.requires_grad],
            int(bucket_mb * MIB),
            None if first_bucket_mb is None else int(first_bucket_mb * MIB),
            group_key,
            world=self.world if sliced else 1,
            rank=self.rank if sliced else 0,
            dtype=grad_dtype,
        )
        self._broadcast_state()
        self.flat_params = self._bind(buckets, contiguous=contiguous_params or zero_stage > 0)
        # With nobody to reduce with there is no communication to overlap: no per-gradient
        # hooks; sync_gradients() after the last backward does the work.
        self._attach(buckets, hooks=self.world > 1)
        if zero_stage == 2:
            for b in buckets:
                b.free()  # allocated again when its first gradient arrives

    @staticmethod
    def _bind(buckets: list[FlatUnit], contiguous: bool) -> list[nn.Parameter | None]:
        """Point every parameter's ``.grad`` into its bucket buffer; with ``contiguous``
        also store each bucket's parameters in one flat parameter (returned, else None)."""
        flat_params: list[nn.Parameter | None] = []
        for b in buckets:
            flat = None
            if contiguous:
                flat = nn.Parameter(b.make_contiguous())
                if b.bindable:
                    flat.grad = b.buffer
            flat_params.append(flat)
            b.bind_grads()
        return flat_params

    @property
    def buckets(self) -> list[FlatUnit]:
        """The gradient buckets, in launch order (the last layers' first)."""
        return self.units

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new accumulation window.

        By default no memory is touched: gradients are released and the next backward
        copies them into the bucket buffers. ``set_to_none=False`` zeroes the buffers and
        keeps ``param.grad`` bound to them instead.
        """
        super().zero_grad()
        for b, flat in zip(self.units, self.flat_params):
            if set_to_none or not b.allocated:
                b.release_grads()
            else:
                b.buffer.zero_()
                b.bind_grads()
            if flat is not None and b.bindable and b.allocated:
                flat.grad = b.buffer

    def flat_parameters(self) -> list[tuple[object, nn.Parameter]]:
        """``(group key, flat parameter)`` per bucket; needs ``contiguous_params=True``.

        Give these to the optimizer instead of the module's parameters: their ``.grad``
        is the reduced bucket buffer, and stepping them updates the module in place.
        """
        if any(flat is None for flat in self.flat_params):
            raise RuntimeError("flat_parameters() needs DataParallel(..., contiguous_params=True)")
        return [(b.key, flat) for b, flat in zip(self.units, self.flat_params) if flat is not None]

    def shards(self) -> list[FlatShard]:
        """What this rank's optimizer steps, one :class:`FlatShard` per bucket: the whole
        bucket (ZeRO-0) or this rank's 1/dp slice of it (ZeRO-1/2)."""
        sharded = self.zero_stage > 0 and self.world > 1
        shards = []
        for b, flat in zip(self.units, self.flat_params):
            if flat is None:
                raise RuntimeError(
                    "shards() needs DataParallel(..., contiguous_params=True) or a ZeRO stage"
                )
            values = flat.data[b.lo : b.hi]
            gather = (
                (
                    lambda b=b, v=values: ops.all_gather_into(
                        b.flat, v.clone(), self.group, self.ledger, tag="param", async_op=True
                    )
                )
                if sharded
                else None
            )
            shards.append(
                b.shard(
                    values,
                    functools.partial(reduced_gradient, b, self.reducer),
                    self._group_key,
                    sharded=sharded,
                    gather=gather,
                )
            )
        return shards

    @property
    def grad_bytes(self) -> int:
        """Bytes reduced by one synchronised backward: the trainable parameters' bytes."""
        return sum(b.buffer.numel() * b.buffer.element_size() for b in self.units)

    def _weight_bytes(self) -> int:
        if all(flat is not None for flat in self.flat_params):
            return sum(storage_bytes(b.flat) for b in self.units)
        return sum(p.numel() * p.element_size() for b in self.units for p in b.params)

    @torch.no_grad()
    def _broadcast_state(self) -> None:
        """Start every replica from data-parallel rank 0's parameters and buffers."""
        if self.world == 1:
            return
        tensors = [
            t for t in list(self.module.parameters()) + list(self.module.buffers()) if t.numel()
        ]
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
