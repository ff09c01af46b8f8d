"""ZeRO-3: parameters, gradients and optimizer states all sharded over the data-parallel
group (Rajbhandari et al. 2020, P_os+g+p; the same design as FSDP, Zhao et al. 2023).

The model is cut into *units* — each transformer block one unit, everything else (the
embedding, final norm and head, which the first and last layers both need) the *root*
unit. Each unit is a :class:`ShardedUnit`: a flat unit whose parameters live in one flat
buffer, padded to a multiple of dp, of which a rank keeps only its 1/dp slice. Around
every use the full buffer is rebuilt:

- forward: a unit is all-gathered just before its forward (the next unit's gather is
  started at the same time — prefetch), and freed right after;
- backward: a hook on the unit's output fires when the gradient reaches it — the unit
  is gathered again (prefetching the unit before it) and freed once all its parameters
  have their gradients; those are reduced by the shared machinery
  (:class:`~paracube.data_parallel.base.FlatDataParallel`) with a reduce-scatter into the
  rank's gradient slice, in a fixed unit order (last block first, the root last);
- the root unit stays gathered from the start of forward to the end of backward.

Parameter storage is released with ``untyped_storage().resize_(0)``: each parameter stays
the same tensor object (a view of its unit's flat buffer) whose memory comes and goes, so
autograd's saved references to it remain valid across the free/gather cycle.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.base import FlatDataParallel, PreReduce, guard_optimizers
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.reducers import Reducer, ReduceScatter, reduced_gradient
from paracube.data_parallel.shards import (
    FlatShard,
    alloc_storage,
    free_storage,
    is_allocated,
    shard_bounds,
)


class MetaValues(Protocol):
    """Values for parameters built on the meta device (:class:`paracube.materialize.Materializer`)."""

    def claim(self, module: nn.Module) -> None:
        """Every meta parameter and buffer under ``module`` gets its value."""

    def claim_flat(
        self, params: list[nn.Parameter], padded: int, lo: int, hi: int
    ) -> tuple[list[nn.Parameter], torch.Tensor, torch.Tensor]:
        """``params`` laid end to end in one flat tensor of ``padded`` elements, of which only ``[lo, hi)`` is
        filled: the new parameters (views of the flat tensor, its memory released), the
        flat tensor, and a copy of its ``[lo, hi)``."""
        ...


class ShardedUnit(FlatUnit):
    """A flat unit whose parameters are kept as this rank's slice only (``shard``) and
    gathered into the full flat buffer (``flat``) around each use."""

    def __init__(
        self,
        index: int,
        name: str,
        params: list[nn.Parameter],
        owner: ShardedDataParallel,
        values: MetaValues | None = None,
    ):
        key = owner.group_key
        # Decayed parameters first, so each optimizer group is one run in most slices.
        params = sorted(params, key=lambda p: not key(p))
        if values is not None:  # meta parameters: only this rank's slice is ever filled
            padded = -(-sum(p.numel() for p in params) // owner.world) * owner.world
            lo, hi = shard_bounds(padded, owner.world, owner.rank)
            params, full, param_shard = values.claim_flat(params, padded, lo, hi)
        super().__init__(
            index,
            params,
            world=owner.world,
            rank=owner.rank,
            grad_dtype=owner.grad_dtype,
            name=name,
            allocate=False,  # the gradient buffer exists only during backward
        )
        self.owner = owner
        if values is None:
            full = self.make_contiguous()
            # Every replica starts as rank 0 (from the seed, each already does).
            ops.broadcast(full, 0, owner.group, owner.ledger, tag="init")
            param_shard = full[self.lo : self.hi].clone()
        self.flat = self.full = full  # (padded numel,), gathered around each use
        self.param_shard = param_shard  # (hi - lo,), persistent: this rank's parameters
        self.pending_gather: ops.PendingCollective | None = None
        self.in_backward = False
        self.release()

    @property
    def gathered(self) -> bool:
        return is_allocated(self.full)

    def gather(self, async_op: bool = False) -> None:
        """Rebuild the full parameters from every rank's slice (no-op if already there)."""
        if self.gathered:
            if not async_op:
                self.wait_gather()
            return
        alloc_storage(self.full)
        self.pending_gather = ops.all_gather_into(
            self.full,
            self.param_shard,
            self.owner.group,
            self.owner.ledger,
            tag="param",
            async_op=True,
        )
        self.owner.note_param_memory()
        if not async_op:
            self.wait_gather()

    def wait_gather(self) -> None:
        if self.pending_gather is not None:
            self.pending_gather.wait()
            self.pending_gather = None

    def release(self) -> None:
        """Free the gathered parameters (this rank's slice stays)."""
        self.wait_gather()
        free_storage(self.full)


class ShardedDataParallel(FlatDataParallel):
    """ZeRO-3 data parallelism for a module cut into ``units`` (a list of submodules).

    Args:
        module: the model (already tensor-parallel if wanted); its parameters are
            broadcast from the group's rank 0 and then sharded.
        units: submodules gathered one at a time, in forward order (e.g. the blocks).
            Each returns a tensor or a tuple/list/dict of them (as Hugging Face blocks
            do). Parameters outside them form the root unit.
        group, ledger: the data-parallel group and where collectives are counted.
        group_key: optimizer group of a parameter (e.g. decayed or not).
        average: divide gradients by the group size — the same rule and default as
            ``DataParallel`` (torch DDP's convention); ``False`` sums, for a loss already
            normalised by the global sample count.
        grad_dtype: dtype of gradient reduction and of the gradient slices.
        reducer: a sharded reducer (default reduce-scatter).
        pre_reduce: as in ``DataParallel``: ``pre_reduce(params, grad_views)`` runs
            before each unit's reduction.
        materialize: for a module built on the meta device, its values: each unit's
            flat slice is filled directly (``MetaValues.claim_flat``), so no rank ever
            holds more than its slices and one full parameter (``paracube.materialize``).

    >>> model = ShardedDataParallel(net, list(net.blocks), mesh.group("dp"))  # in a job
    """

    binds_grads = False  # gradients are copied into the unit's buffer, param.grad released
    accumulates_locally = False

    def __init__(
        self,
        module: nn.Module,
        units: list[nn.Module],
        group=None,
        ledger: CommLedger | None = None,
        *,
        group_key=None,
        average: bool = True,
        grad_dtype: torch.dtype | None = None,
        reducer: Reducer | None = None,
        pre_reduce: PreReduce | None = None,
        materialize: MetaValues | None = None,
    ):
        reducer = reducer or ReduceScatter()
        if not reducer.sharded:
            raise ValueError(
                "ZeRO-3 keeps only gradient slices: its reducer must be sharded (reduce-scatter)"
            )
        super().__init__(
            module, group, ledger, reducer=reducer, average=average, pre_reduce=pre_reduce
        )
        self.group_key, self.grad_dtype = group_key or (lambda p: None), grad_dtype
        self.peak_param_bytes = 0
        inner_ids: set[int] = set()
        self.block_units: list[ShardedUnit] = []  # forward order
        for i, m in enumerate(units):
            params = [p for p in m.parameters() if p.requires_grad and id(p) not in inner_ids]
            self.block_units.append(ShardedUnit(i, f"unit{i}", params, self, materialize))
            inner_ids |= {id(p) for p in m.parameters()}
        root = [p for p in module.parameters() if p.requires_grad and id(p) not in inner_ids]
        unit = len(self.block_units)
        self.root = ShardedUnit(unit, "root", root, self, materialize) if root else None
        if materialize is not None:
            materialize.claim(module)  # the buffers (rotary tables), parameters left frozen
        self.all_units = self.block_units + ([self.root] if self.root else [])
        # Reductions are launched in this fixed order on every rank: last block first.
        self._attach(
            list(reversed(self.block_units)) + ([self.root] if self.root else []), hooks=True
        )
        for i, m in enumerate(units):
            m.register_forward_pre_hook(self._make_pre_forward(i))
            m.register_forward_hook(self._make_post_forward(i, m))
        guard_optimizers(self.module, "ShardedDataParallel")

    # -- the contract ---------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module, each unit gathered just before its forward and released after."""
        if self.root is not None:
            self.root.gather()
        out = self.module(*args, **kwargs)
        if not torch.is_grad_enabled() and self.root is not None:
            self.root.release()  # evaluation: nothing stays gathered
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Refused: ZeRO-3 keeps no full gradients to accumulate into locally."""
        raise RuntimeError(
            "ZeRO-3 reduce-scatters every backward (it keeps no full gradients to accumulate into)"
        )
        yield  # pragma: no cover

    def shards(self) -> list[FlatShard]:
        """One :class:`FlatShard` per unit: this rank's parameter slice and its reduced
        gradient slice (with every parameter's offset, for a checkpoint)."""
        return [
            u.shard(
                u.param_shard,
                functools.partial(reduced_gradient, u, self.reducer),
                self.group_key,
                sharded=self.world > 1,
            )
            for u in self.all_units
        ]

    def memory_bytes(self) -> dict[str, int]:
        """The base's counts plus ``params_peak``: the most parameter bytes held at once
        (this rank's slices plus the units gathered at that moment)."""
        return {**super().memory_bytes(), "params_peak": self.peak_param_bytes}

    @contextlib.contextmanager
    def gathered_parameters(self) -> Iterator[None]:
        """Inside, every unit is gathered: each parameter holds its full value."""
        for u in self.all_units:
            u.gather()
        try:
            yield
        finally:
            for u in self.all_units:
                u.release()

    def gathered_param_bytes(self) -> int:
        """Bytes of full (gathered) parameter storage allocated now."""
        return sum(u.full.untyped_storage().nbytes() for u in self.all_units)

    def note_param_memory(self) -> None:
        """Record the parameter bytes held now into the peak (called around each gather)."""
        shards = sum(u.param_shard.numel() * u.param_shard.element_size() for u in self.all_units)
        self.peak_param_bytes = max(self.peak_param_bytes, shards + self.gathered_param_bytes())

    def _weight_bytes(self) -> int:
        return sum(u.param_shard.untyped_storage().nbytes() for u in self.all_units)

    # -- hooks ------------------------------------------------------------------------------

    def _make_pre_forward(self, i: int):
        def hook(module, args):
            unit = self.block_units[i]
            if unit.in_backward:  # recomputation inside backward: already gathered
                return
            unit.gather()
            if i + 1 < len(self.block_units):  # prefetch the next unit behind this one's compute
                self.block_units[i + 1].gather(async_op=True)

        return hook

    def _make_post_forward(self, i: int, unit_module: nn.Module):
        def hook(module, args, output):
            unit = self.block_units[i]
            if unit.in_backward:
                return output
            unit.release()
            if not torch.is_grad_enabled() or not unit.params:
                return output
            # Every output tensor that carries a gradient re-gathers the unit when its
            # gradient arrives (gathering twice is a no-op): a tuple (hidden states,
            # attention weights, cache) works as a tensor does.
            carriers = [
                t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            if not carriers:
                raise TypeError(
                    f"ShardedDataParallel: unit {i} ({type(unit_module).__name__}) returned "
                    f"{type(output).__name__} holding no tensor that requires grad, so its "
                    "backward could not gather its parameters again; return a tensor, or a "
                    "tuple/list/dict of tensors, from each unit"
                )
            for t in carriers:
                t.register_hook(self._make_pre_backward(i))
            return output

        return hook

    def _make_pre_backward(self, i: int):
        def hook(grad):
            self._queue_callback()
            unit = self.block_units[i]
            unit.in_backward = True
            unit.gather()
            if i > 0:  # prefetch the unit whose backward comes next
                self.block_units[i - 1].gather(async_op=True)
            return grad

        return hook

    def _unit_complete(self, unit: FlatUnit) -> None:
        if unit is not self.root and isinstance(unit, ShardedUnit):
            unit.release()  # its backward is over: every parameter has its gradient

    def _after_backward(self) -> None:
        for u in self.all_units:
            u.release()
            u.in_backward = False
