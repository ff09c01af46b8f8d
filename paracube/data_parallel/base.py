"""The data-parallel contract, and the machinery ZeRO 0–3 share.

Every data-parallel wrapper (``DataParallel`` for ZeRO 0/1/2, ``ShardedDataParallel``
for ZeRO-3) is a :class:`FlatDataParallel` over a list of
:class:`~paracube.data_parallel.flat.FlatUnit` s with an injected
:class:`~paracube.data_parallel.reducers.Reducer`, and offers the same contract:

- ``module`` — the wrapped local module; ``forward`` runs it;
- :meth:`no_sync` — backwards inside accumulate locally, without communicating;
- :meth:`zero_grad` — a new accumulation window;
- :meth:`start_grad_sync` / :meth:`finish_grad_sync` (or :meth:`sync_gradients`, both)
  — reduce what the backward hooks have not reduced yet (after a pipeline step run under
  ``no_sync``, gradients written by a zero-bubble W pass, a one-rank group), and wait;
  a no-op when the last backward already synchronised;
- :meth:`shards` — what this rank's optimizer steps, one ``FlatShard`` per unit, with
  the per-parameter offsets a checkpoint needs;
- :meth:`release_gradient_memory`, :meth:`memory_bytes`, :meth:`gathered_parameters`.

How one synchronised backward goes (Li et al. 2020, "PyTorch Distributed", §3.2): each
gradient is absorbed into its unit's buffer by a post-accumulate hook; when a unit is
complete it and every complete unit after it in the launch order are handed to the
reducer (asynchronous, while backward goes on); a callback queued at the end of backward
launches the units still incomplete (parameters without a gradient count as 0), waits
for every reduction and starts a new window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.reducers import Reducer, Waitable
from paracube.data_parallel.shards import FlatShard, free_storage, storage_bytes

PreReduce = Callable[[list[nn.Parameter], list[torch.Tensor]], None]

# Parameters of sharding wrappers (ZeRO ≥ 1): a plain torch optimizer over them would step
# nothing (ZeRO-2/3: the gradients are in this rank's slices, .grad stays None) or keep
# every optimizer state on every rank (ZeRO-1). Checked by one step pre-hook for all
# optimizers, registered with the first such wrapper.
_sharded_params: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter → wrapper name
_verdicts: WeakIdKeyDictionary = WeakIdKeyDictionary()  # optimizer → refusal or ""
_hook_registered = False


def guard_optimizers(module: nn.Module, wrapper: str) -> None:
    """Refuse, at its first step, any torch optimizer stepping ``module``'s parameters
    directly: they belong to ``wrapper``'s shards, stepped by ``MainParamOptimizer``."""
    global _hook_registered
    for p in module.parameters():
        _sharded_params[p] = wrapper
    if not _hook_registered:
        register_optimizer_step_pre_hook(_refuse_sharded)
        _hook_registered = True


def _refuse_sharded(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    verdict = _verdicts.get(optimizer)
    if verdict is None:
        wrappers = {
            _sharded_params[p]
            for g in optimizer.param_groups
            for p in g["params"]
            if p in _sharded_params
        }
        verdict = ""
        if wrappers:
            verdict = (
                f"{type(optimizer).__name__} steps the parameters of a {' and a '.join(sorted(wrappers))} "
                "directly, but their gradients and optimizer states belong to this rank's shards "
                "(it would train nothing, or keep every state on every rank): step "
                "MainParamOptimizer(model.shards(), make_optimizer) instead"
            )
        _verdicts[optimizer] = verdict
    if verdict:
        raise RuntimeError(verdict)


class FlatDataParallel(nn.Module):
    """Shared base: hooks, the ordered launch of reductions, the window's state.

    Subclasses build ``self.units`` (in launch order) and call :meth:`_attach`."""

    binds_grads = True  # after absorbing, param.grad is the buffer's view (False: None)
    accumulates_locally = True  # no_sync can accumulate full gradients (ZeRO-0/1)

    def __init__(
        self,
        module: nn.Module,
        group,
        ledger: CommLedger | None,
        *,
        reducer: Reducer,
        average: bool,
        pre_reduce: PreReduce | None,
    ):
        super().__init__()
        self.module, self.group, self.ledger = module, group, ledger
        self.world = ops.group_size(group)
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.reducer, self.average, self.pre_reduce = reducer, average, pre_reduce
        self.units: list[FlatUnit] = []
        self._where: dict[nn.Parameter, tuple[FlatUnit, int]] = {}
        self._sync = True  # False inside no_sync()
        self._synced = False  # the current window's gradients are all reduced
        self._callback_queued = False
        self._next_launch = 0
        self._inflight: list[Waitable] = []
        self.peak_grad_buffer_bytes = 0  # the most full gradient buffers held at once

    def _attach(self, units: Sequence[FlatUnit], hooks: bool) -> None:
        """Take ``units`` as the launch order; with ``hooks``, absorb and launch during
        backward (without, :meth:`sync_gradients` does everything after it)."""
        self.units = list(units)
        self._where = {p: (u, i) for u in units for i, p in enumerate(u.params)}
        if self.reducer.sharded:
            for u in units:
                u.make_grad_shard()
        if hooks:
            for p in self._where:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    # -- the contract ---------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; its gradients are reduced as backward produces them."""
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, without communicating."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new accumulation window: the next reduced slice overwrites the old."""
        for u in self.units:
            u.shard_fresh = True
        self._synced = False

    def start_grad_sync(self) -> None:
        """Absorb gradients written outside the hooks, then launch every reduction of this
        window not launched yet (asynchronous)."""
        for u in self.units:
            for i in range(len(u.params)):
                if u.has_stray_grad(i):
                    u.absorb(i, bind=self.binds_grads)
                    self._synced = False
        if not self._synced:
            self._launch_ready(force=True)

    def finish_grad_sync(self) -> None:
        """Wait for every launched reduction; the window's gradients are reduced."""
        if not self._synced:
            self._finish_backward()

    def sync_gradients(self) -> None:
        """:meth:`start_grad_sync` then :meth:`finish_grad_sync`; a no-op when synced."""
        self.start_grad_sync()
        self.finish_grad_sync()

    def shards(self) -> list[FlatShard]:
        """What this rank's optimizer steps: one :class:`FlatShard` per unit."""
        raise NotImplementedError

    def release_gradient_memory(self) -> None:
        """After the optimizer step, free what held gradients until the next backward
        allocates it again (full buffers whose slice has been consumed, gradient slices)."""
        for u in self.units:
            if u.allocated:
                u.free()
            if u.grad_shard is not None:
                free_storage(u.grad_shard)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this wrapper holds now: ``weights`` (this rank's parameters) and
        ``gradients`` (buffers and gradient slices); under a sharded reduction (ZeRO-2/3)
        also ``grad_buffers_peak``, the most full gradient buffers a backward held at once
        (the buffers are freed as their reductions are retired, so ``gradients`` after
        the step counts the slices only)."""
        grads = sum(u.nbytes + storage_bytes(u.grad_shard) for u in self.units)
        in_flight = getattr(self.reducer, "state_bytes", None)  # stale:S's copies in flight
        grads += in_flight() if in_flight is not None else 0
        held = {"weights": self._weight_bytes(), "gradients": grads}
        if self.reducer.sharded:
            held["grad_buffers_peak"] = self.peak_grad_buffer_bytes
        return held

    @contextlib.contextmanager
    def gathered_parameters(self) -> Iterator[None]:
        """Inside, every parameter holds its full value (ZeRO-3 gathers, then frees)."""
        yield

    def _weight_bytes(self) -> int:
        raise NotImplementedError

    # -- backward ---------------------------------------------------------------------------

    @torch.no_grad()
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if param.grad is None:  # an undefined gradient (a zero-bubble I pass defers dW)
            return
        unit, i = self._where[param]
        # The gradient now lives in the unit, also under no_sync.
        unit.absorb(i, bind=self.binds_grads)
        self._synced = False
        if not self._sync:
            return
        self._queue_callback()
        unit.pending -= 1
        if unit.pending == 0:
            self._unit_complete(unit)
        self._launch_ready()

    def _unit_complete(self, unit: FlatUnit) -> None:
        """Every parameter of ``unit`` has its gradient in this backward."""

    def _queue_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _launch_ready(self, force: bool = False) -> None:
        """Launch complete units in launch order (or all remaining ones if ``force``)."""
        while self._next_launch < len(self.units):
            unit = self.units[self._next_launch]
            if unit.pending > 0 and not force:
                return
            unit.prepare_reduce()
            if self.pre_reduce is not None:
                self.pre_reduce(unit.params, unit.views)
            if self.average and self.world > 1:
                unit.buffer.div_(self.world)
            self._inflight.append(self.reducer(unit, self.group, self.ledger))
            self._next_launch += 1
            if self.reducer.sharded:
                self._note_grad_buffers()
                self._retire_reductions(keep=self.SHARDED_IN_FLIGHT)

    # A sharded reduction frees its unit's full gradient buffer when it is waited for; left
    # until the end of backward, every unit's buffer would be alive at once — the whole
    # model's gradients, which ZeRO-2/3 exist to avoid. So one reduction stays in flight
    # beside the next unit's backward and the one before it is retired as that one is
    # launched: at most the unit being filled and the one being reduced hold full
    # gradients (with the root unit of ZeRO-3, filled from the head's backward to the
    # embedding's). FSDP overlaps them the same way: one unit's reduce-scatter beside the
    # next unit's backward (Zhao et al. 2023, "PyTorch FSDP").
    SHARDED_IN_FLIGHT = 1

    def _retire_reductions(self, keep: int) -> None:
        """Wait for the oldest launched reductions until ``keep`` remain in flight."""
        while len(self._inflight) > keep:
            self._inflight.pop(0).wait()

    def _note_grad_buffers(self) -> None:
        """Record the full gradient buffers allocated now into their peak."""
        held = sum(u.nbytes for u in self.units)
        self.peak_grad_buffer_bytes = max(self.peak_grad_buffer_bytes, held)

    @torch.no_grad()
    def _finish_backward(self) -> None:
        self._launch_ready(force=True)
        if self.reducer.sharded:
            self._note_grad_buffers()
        for handle in self._inflight:
            handle.wait()
        self._inflight.clear()
        self._next_launch = 0
        self._callback_queued = False
        self._synced = True
        for u in self.units:
            u.reset()
        self._after_backward()

    def _after_backward(self) -> None:
        """Hook for subclasses (ZeRO-3 frees what the backward gathered)."""
