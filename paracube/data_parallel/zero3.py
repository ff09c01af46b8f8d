"""ZeRO-3: parameters, gradients and optimizer states all sharded over the data-parallel
group (Rajbhandari et al. 2020, P_os+g+p; the same design as FSDP, Zhao et al. 2023).

The model is cut into *units* — each transformer block one unit, everything else (the
embedding, final norm and head, which the first and last layers both need) the *root*
unit. Each unit's parameters live in one flat buffer, padded to a multiple of dp; a rank
keeps only its 1/dp slice. Around every use the full buffer is rebuilt:

- forward: a unit is all-gathered just before its forward (the next unit's gather is
  started at the same time — prefetch), and freed right after;
- backward: a hook on the unit's output fires when the gradient reaches it — the unit
  is gathered again (prefetching the unit before it) and freed once all its parameters
  have their gradients; those gradients are copied into a flat buffer and
  reduce-scattered, asynchronously and in a fixed unit order, into the rank's gradient
  slice (accumulated across micro-batches);
- the root unit stays gathered from the start of forward to the end of backward.

Parameter storage is released with ``untyped_storage().resize_(0)``: each parameter stays
the same tensor object (a view of its unit's flat buffer) whose memory comes and goes, so
autograd's saved references to it remain valid across the free/gather cycle.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.shards import FlatShard, alloc_storage, free_storage, is_allocated, shard_bounds, slice_layout


class ShardedUnit:
    """One unit's flat parameter buffer, this rank's slice of it, and its gradients."""

    def __init__(self, index: int, name: str, params: list[nn.Parameter], owner: "ShardedDataParallel"):
        self.index, self.name, self.owner = index, name, owner
        key = owner.group_key
        # Decayed parameters first, so each optimizer group is one run in most slices.
        self.params = sorted(params, key=lambda p: not key(p)) if key else list(params)
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        world = owner.world
        self.numel, padded = total, -(-total // world) * world
        device, dtype = self.params[0].device, self.params[0].dtype
        self.full = torch.zeros(padded, dtype=dtype, device=device)
        with torch.no_grad():
            for p, o in zip(self.params, self.offsets):
                view = self.full[o : o + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view  # the parameter is now a window onto the flat buffer
        ops.broadcast(self.full, 0, owner.group, owner.ledger, tag="init")  # every replica starts as rank 0
        self.lo, self.hi = shard_bounds(padded, world, owner.rank)
        self.shard = self.full[self.lo : self.hi].clone()  # persistent: this rank's parameters
        grad_dtype = owner.grad_dtype or dtype
        self.grad_full = torch.zeros(padded, dtype=grad_dtype, device=device)  # only during backward
        self.grad_views = [self.grad_full[o : o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets)]
        self.grad_shard = torch.zeros(self.hi - self.lo, dtype=grad_dtype, device=device)
        self.shard_fresh = True
        self.stale = [True] * len(self.params)
        self.arrived = 0
        self.pending_gather: ops.PendingCollective | None = None
        self.in_backward = False
        free_storage(self.grad_full)
        self.free()

    # -- parameters ---------------------------------------------------------------------

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
            self.full, self.shard, self.owner.group, self.owner.ledger, tag="param", async_op=True
        )
        self.owner.note_param_memory()
        if not async_op:
            self.wait_gather()

    def wait_gather(self) -> None:
        if self.pending_gather is not None:
            self.pending_gather.wait()
            self.pending_gather = None

    def free(self) -> None:
        self.wait_gather()
        free_storage(self.full)

    # -- gradients ----------------------------------------------------------------------

    def absorb(self, i: int) -> None:
        """Move ``params[i].grad`` into the flat gradient buffer."""
        p = self.params[i]
        self._grad_buffer()
        if self.stale[i]:
            self.grad_views[i].copy_(p.grad)
        else:
            self.grad_views[i].add_(p.grad)
        self.stale[i] = False
        p.grad = None

    def _grad_buffer(self) -> None:
        """The flat gradient buffer, allocated for this backward (padding zeroed)."""
        if alloc_storage(self.grad_full):
            self.grad_full[self.numel :].zero_()

    def launch_reduce(self):
        """Zero what got no gradient, sum pre-reduce groups, reduce-scatter (async)."""
        self._grad_buffer()
        for i, view in enumerate(self.grad_views):
            if self.stale[i]:
                view.zero_()
        if self.owner.pre_reduce is not None:
            self.owner.pre_reduce(self.params, self.grad_views)
        alloc_storage(self.grad_shard)  # released after the previous step
        out = self.grad_shard if self.shard_fresh else torch.empty_like(self.grad_shard)
        pending = ops.reduce_scatter_into(out, self.grad_full, self.owner.group, self.owner.ledger,
                                          tag="grad", async_op=True)
        return pending, out

    def finish_reduce(self, out: torch.Tensor) -> None:
        if out is not self.grad_shard:
            self.grad_shard.add_(out)
        self.shard_fresh = False
        free_storage(self.grad_full)
        self.stale = [True] * len(self.params)
        self.arrived = 0

    def shard_view(self) -> FlatShard:
        hi = min(self.hi, self.numel)
        ranges, segments = slice_layout(self.params, self.offsets, self.lo, max(hi, self.lo), self.owner.group_key)
        return FlatShard(self.shard, lambda: self.grad_shard, ranges, segments,
                         sharded=self.owner.world > 1, gather=None, name=self.name)


class ShardedDataParallel(nn.Module):
    """ZeRO-3 data parallelism for a module cut into ``units`` (a list of submodules).

    Args:
        module: the model (already tensor-parallel if wanted); its parameters are
            broadcast from the group's rank 0 and then sharded.
        units: submodules gathered one at a time, in forward order (e.g. the blocks).
            Each must return a tensor. Parameters outside them form the root unit.
        group, ledger: the data-parallel group and where collectives are counted.
        group_key: optimizer group of a parameter (e.g. decayed or not).
        grad_dtype: dtype of gradient reduction and of the gradient slices.
        pre_reduce: as in :class:`DataParallel`: ``pre_reduce(params, grad_views)`` runs
            before each unit's reduce-scatter.
    """

    def __init__(self, module: nn.Module, units: list[nn.Module], group=None, ledger: CommLedger | None = None,
                 *, group_key=None, grad_dtype: torch.dtype | None = None, pre_reduce=None):
        super().__init__()
        self.module, self.group, self.ledger = module, group, ledger
        self.world = ops.group_size(group)
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.group_key, self.grad_dtype, self.pre_reduce = group_key or (lambda p: None), grad_dtype, pre_reduce
        self.peak_param_bytes = 0
        inner_ids = set()
        self.units: list[ShardedUnit] = []
        for i, m in enumerate(units):
            params = [p for p in m.parameters() if p.requires_grad and id(p) not in inner_ids]
            inner_ids |= {id(p) for p in params}
            self.units.append(ShardedUnit(i, f"unit{i}", params, self))
        root = [p for p in module.parameters() if p.requires_grad and id(p) not in inner_ids]
        self.root = ShardedUnit(len(self.units), "root", root, self) if root else None
        self.all_units = self.units + ([self.root] if self.root else [])
        # Reduce-scatters are launched in this fixed order on every rank: last block first.
        self.launch_order = list(reversed(self.units)) + ([self.root] if self.root else [])
        self._unit_of = {p: (u, i) for u in self.all_units for i, p in enumerate(u.params)}
        for p in self._unit_of:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        for i, m in enumerate(units):
            m.register_forward_pre_hook(self._make_pre_forward(i))
            m.register_forward_hook(self._make_post_forward(i))
        self._complete: set[int] = set()
        self._next_launch = 0
        self._inflight: list[tuple[ShardedUnit, ops.PendingCollective, torch.Tensor]] = []
        self._callback_queued = False

    # -- public API ---------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if self.root is not None:
            self.root.gather()
        out = self.module(*args, **kwargs)
        if not torch.is_grad_enabled():  # evaluation: nothing stays gathered
            self.root.free() if self.root is not None else None
        return out

    @contextlib.contextmanager
    def no_sync(self):
        raise RuntimeError("ZeRO-3 reduce-scatters every backward (it keeps no full gradients to accumulate into)")
        yield  # pragma: no cover

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new accumulation window: the next reduced slice overwrites the old."""
        for u in self.all_units:
            u.shard_fresh = True

    needs_sync_call = False  # every backward reduces (and frees) through the hooks

    def sync_gradients(self) -> None:
        """Gradients are reduced inside every backward; nothing is left to do."""

    def shards(self) -> list[FlatShard]:
        return [u.shard_view() for u in self.all_units]

    def release_gradient_memory(self) -> None:
        """After the optimizer step: free the gradient slices until the next backward."""
        for u in self.all_units:
            free_storage(u.grad_shard)

    def gathered_param_bytes(self) -> int:
        return sum(u.full.untyped_storage().nbytes() for u in self.all_units)

    def note_param_memory(self) -> None:
        shards = sum(u.shard.numel() * u.shard.element_size() for u in self.all_units)
        self.peak_param_bytes = max(self.peak_param_bytes, shards + self.gathered_param_bytes())

    # -- hooks --------------------------------------------------------------------------

    def _make_pre_forward(self, i: int):
        def hook(module, args):
            unit = self.units[i]
            if unit.in_backward:  # recomputation inside backward: already gathered
                return
            unit.gather()
            if i + 1 < len(self.units):  # prefetch the next unit behind this one's compute
                self.units[i + 1].gather(async_op=True)
        return hook

    def _make_post_forward(self, i: int):
        def hook(module, args, output):
            unit = self.units[i]
            if unit.in_backward:
                return output
            unit.free()
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._make_pre_backward(i))
            return output
        return hook

    def _make_pre_backward(self, i: int):
        def hook(grad):
            self._queue_callback()
            unit = self.units[i]
            unit.in_backward = True
            unit.gather()
            if i > 0:  # prefetch the unit whose backward comes next
                self.units[i - 1].gather(async_op=True)
            return grad
        return hook

    def _queue_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    @torch.no_grad()
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if param.grad is None:
            return
        self._queue_callback()
        unit, i = self._unit_of[param]
        unit.absorb(i)
        unit.arrived += 1
        if unit.arrived == len(unit.params):
            if unit is not self.root:
                unit.free()  # its backward is over: every parameter has its gradient
            self._complete.add(unit.index)
            self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next_launch < len(self.launch_order):
            unit = self.launch_order[self._next_launch]
            if unit.index not in self._complete and not force:
                return
            pending, out = unit.launch_reduce()
            self._inflight.append((unit, pending, out))
            self._next_launch += 1

    @torch.no_grad()
    def _finish_backward(self) -> None:
        self._launch_ready(force=True)
        for unit, pending, out in self._inflight:
            pending.wait()
            unit.finish_reduce(out)
        self._inflight.clear()
        for u in self.all_units:
            u.free()
            u.in_backward = False
        self._complete.clear()
        self._next_launch = 0
        self._callback_queued = False

