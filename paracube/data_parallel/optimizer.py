"""Any torch optimizer over this rank's :class:`FlatShard` s, with fp32 main parameters.

What one step does, for every ZeRO stage and precision alike:

1. the reduced gradient slice of each flat buffer becomes the ``.grad`` of the *main*
   parameters (converted to fp32 when the model computes in bf16/fp16);
2. the caller unscales (fp16), checks for overflow, computes the global norm from
   :meth:`grad_norm_squared` and clips;
3. the torch optimizer steps the main parameters — one flat tensor per optimizer group
   and buffer, so a fused kernel updates a whole bucket or unit at once;
4. the updated values are written back to the model's compute-dtype slice and, under
   ZeRO-1/2, all-gathered into the full parameters.

Main parameters are *views* of the model's flat storage when the model is fp32 (no copy:
the step updates the model in place), and fp32 copies otherwise — the "fp32 master
weights" of Micikevicius et al. 2018 (mixed precision training), sharded under ZeRO ≥ 1
as in Rajbhandari et al. 2020 (the 12 bytes/parameter of K = 12 are master weights plus
Adam's two moments).

``offload=True`` keeps the main parameters and the optimizer's states in host memory
(pinned) and steps them on the CPU, as ZeRO-Offload (Ren et al. 2021) and FSDP2's
``CPUOffloadPolicy``: each step the reduced gradient slice travels to the host (fp32),
the new values back to the GPU; the GPU holds no optimizer state and no master copy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from paracube.data_parallel.shards import FlatShard, storage_bytes


class MainParamOptimizer:
    """Steps ``shards`` with the optimizer ``make_optimizer({group key: [main params]})``."""

    def __init__(
        self,
        shards: list[FlatShard],
        make_optimizer: Callable[[dict[Hashable, list[nn.Parameter]]], torch.optim.Optimizer],
        master_dtype: torch.dtype = torch.float32,
        offload: bool = False,
    ):
        self.shards = shards
        self.master_dtype = master_dtype
        self.offload = offload
        device = shards[0].values.device if shards else torch.device("cpu")
        if offload and device.type == "cpu":
            raise ValueError(
                "MainParamOptimizer(offload=True): the model's shards are in host memory already "
                "(a CPU model): there is nothing to offload; leave offload off"
            )
        self._prepared = False  # this step's gradients are the main parameters' .grad
        self._main: list[torch.Tensor] = []  # per shard: its (hi−lo,) main values
        self._main_grad: list[torch.Tensor | None] = []  # fp32 gradient slice when converted
        self._entries: list[
            list[tuple[nn.Parameter, int, int]]
        ] = []  # per shard: (main param, a, b)
        groups: dict[Hashable, list[nn.Parameter]] = {}
        for sh in shards:
            if offload:  # pinned, so the copies to and from the GPU run asynchronously
                main = torch.empty(sh.values.numel(), dtype=master_dtype, pin_memory=True)
                main.copy_(sh.values.detach())
            elif sh.values.dtype != master_dtype:
                main = sh.values.detach().to(master_dtype).clone()
            else:
                main = sh.values
            self._main.append(main)
            self._main_grad.append(None)
            entries = []
            for key, a, b in sh.ranges:
                p = nn.Parameter(main[a:b])  # shares ``main``'s storage: stepping it updates main
                groups.setdefault(key, []).append(p)
                entries.append((p, a, b))
            self._entries.append(entries)
        self.optimizer = make_optimizer(groups)

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (the lr schedule writes ``group["lr"]``)."""
        return self.optimizer.param_groups

    @property
    def main_params(self) -> list[nn.Parameter]:
        """The parameters the optimizer steps: one per (shard, model parameter) slice."""
        return [p for entries in self._entries for p, _, _ in entries]

    def held(self) -> list[tuple[FlatShard, torch.Tensor, list[tuple[nn.Parameter, int, int]]]]:
        """Per shard: the shard, its (hi−lo,) main values, and the main parameters that
        step its runs ``[a, b)`` — what a checkpoint stores of this rank."""
        return list(zip(self.shards, self._main, self._entries))

    @torch.no_grad()
    def init_state(self) -> None:
        """Give every main parameter its optimizer state (as a checkpoint will overwrite
        it) by one step with zero gradients at learning rate 0, which moves nothing."""
        if all(self.optimizer.state.get(p) for p in self.main_params):
            return
        lrs = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = 0.0
        for p in self.main_params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        for p in self.main_params:
            p.grad = None
        for g, lr in zip(self.param_groups, lrs):
            g["lr"] = lr

    @torch.no_grad()
    def prepare_grads(self) -> list[torch.Tensor]:
        """Point every main parameter's ``.grad`` at its reduced gradient (fp32); return
        the per-shard gradient slices. :meth:`step` calls it when the caller has not
        since the last step (before clipping or unscaling, call it yourself)."""
        grads = []
        for i, sh in enumerate(self.shards):
            g = sh.grad()
            if g.dtype != self.master_dtype or g.device != self._main[i].device:
                converted = self._main_grad[i]
                if converted is None:  # beside the main values: fp32, on the host if offloaded
                    converted = self._main_grad[i] = torch.empty_like(self._main[i])
                g = converted.copy_(g)
            grads.append(g)
            for p, a, b in self._entries[i]:
                p.grad = g[a:b]
        self._grads = grads
        self._prepared = True
        return grads

    @torch.no_grad()
    def scale_grads_(self, factor: float) -> None:
        """Multiply every gradient (clipping, or unscaling an fp16 loss scale)."""
        torch._foreach_mul_([p.grad for p in self.main_params if p.grad is not None], factor)

    @torch.no_grad()
    def found_inf(self) -> torch.Tensor:
        """1.0 if any local gradient is inf/NaN, else 0.0 (to be max-reduced by the caller)."""
        grads = [p.grad for p in self.main_params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self._device())
        norms = torch.stack(torch._foreach_norm(grads))
        return (~torch.isfinite(norms).all()).float().to(self._device())

    @torch.no_grad()
    def grad_norm_squared(self, counts: Callable[[nn.Parameter], bool]) -> torch.Tensor:
        """Σ g² over the local slices of the parameters for which ``counts(param)`` holds
        (the caller sums it over the data-parallel group when the slices are shards, and
        over the tensor- and pipeline-parallel groups by Megatron's rules)."""
        views = [
            g[seg.start : seg.stop]
            for g, sh in zip(self._grads, self.shards)
            for seg in sh.segments
            if counts(seg.param)
        ]
        if not views:
            return torch.zeros((), dtype=self.master_dtype, device=self._device())
        norms = torch.stack(torch._foreach_norm(views)).to(self.master_dtype)
        return norms.square().sum().to(self._device())  # reduced over the model's groups

    @property
    def sharded(self) -> bool:
        """Whether any shard is a true slice (ZeRO ≥ 1 over more than one rank)."""
        return any(sh.sharded for sh in self.shards)

    @torch.no_grad()
    def step(self) -> None:
        """Step, write the new values back to the model's slices, rebuild full parameters.
        The gradients are this step's reduced slices: taken now unless :meth:`prepare_grads`
        already took them (so forgetting it cannot step on nothing)."""
        if not self._prepared:
            self.prepare_grads()
        self.optimizer.step()
        self._prepared = False
        self.publish()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, group=None) -> float:
        """Clip by the *global* gradient norm of the model, whatever the layout: the
        squares of this rank's slices summed over the data-parallel ``group`` when they
        are ZeRO shards (``torch.nn.utils.clip_grad_norm_`` over the main parameters would
        see one shard's norm). Returns the norm before clipping. (Under tensor or pipeline
        parallelism, replicated parameters must be counted once: the engine's
        ``OptimizerStep.clip`` applies Megatron's rules.)"""
        from paracube.comm import ops

        if not self._prepared:
            self.prepare_grads()
        square = self.grad_norm_squared(lambda p: True)
        if self.sharded:
            ops.all_reduce(square, group, None, tag="grad_norm")
        norm = float(square.sqrt())
        if norm > max_norm:
            self.scale_grads_(max_norm / (norm + 1e-6))
        return norm

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the stepped main values into the model's slices (casting to the model's
        dtype), then all-gather full parameters where the model keeps them (ZeRO-1/2)."""
        for main, sh in zip(self._main, self.shards):
            if main is not sh.values:
                sh.values.copy_(main, non_blocking=self.offload)  # pinned host → GPU
        pending = [sh.gather() for sh in self.shards if sh.gather is not None]
        for handle in pending:
            handle.wait()

    def state_bytes(self) -> dict[str, int]:
        """Bytes held by the optimizer: its states (Adam's m and v) and fp32 master copies."""
        states = sum(
            t.numel() * t.element_size()
            for st in self.optimizer.state.values()
            for t in st.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
        master = sum(
            m.numel() * m.element_size()
            for m, sh in zip(self._main, self.shards)
            if m is not sh.values
        )
        return {"optimizer_states": states, "master_weights": master}

    def memory_bytes(self) -> dict[str, int]:
        """This rank's bytes as the step's memory record counts them: ``optimizer`` (states
        and master weights) and ``gradients`` (fp32 copies of reduced gradient slices) on
        the device; offloaded, they are ``optimizer_host`` / ``gradients_host`` and the
        device holds none of them."""
        states = self.state_bytes()
        held = {
            "optimizer": states["optimizer_states"] + states["master_weights"],
            "gradients": sum(storage_bytes(g) for g in self._main_grad),
        }
        if self.offload:
            return {"optimizer": 0, "gradients": 0, **{f"{k}_host": v for k, v in held.items()}}
        return held

    def _device(self):
        """Where the model's shards are (the device its collectives run on)."""
        return self.shards[0].values.device if self.shards else torch.device("cpu")
