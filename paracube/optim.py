"""The optimizer and what happens between the last backward and the next forward.

AdamW with warm-up and cosine decay over this rank's flat slices
(:class:`~paracube.data_parallel.MainParamOptimizer`), and :class:`OptimizerStep`: the
learning rate, fp16 unscaling and the overflow vote, clipping by the global gradient
norm (Megatron's rules across tp, pp and ZeRO shards), the step, and releasing gradient
memory under ZeRO.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from paracube.comm import ops
from paracube.config import TrainConfig
from paracube.data_parallel import FlatDataParallel, MainParamOptimizer
from paracube.mesh.mesh import ProcessMesh
from paracube.objective import Objective


def is_decayed(p: nn.Parameter) -> bool:
    """Weight decay on matrices only, not on biases and norm scales (GPT-3 / nanoGPT practice)."""
    return p.dim() >= 2


def make_adamw(decay: list, no_decay: list, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (β = 0.9, 0.95 as GPT-3) as fused kernels — one pass per tensor, on CPU too."""
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if not groups:  # a rank whose shards hold only padding still needs an optimizer
        groups = [{"params": [nn.Parameter(torch.zeros(0))], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer over a plain module's own parameters (the serial reference, peers)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return make_adamw(
        [p for p in params if is_decayed(p)], [p for p in params if not is_decayed(p)], cfg
    )


def shard_optimizer(grad_sync: FlatDataParallel, cfg: TrainConfig) -> MainParamOptimizer:
    """AdamW over this rank's flat slices (whole buckets under ZeRO-0), through fp32 main
    parameters; weight decay by group key."""
    dtype = next(grad_sync.module.parameters()).dtype
    return MainParamOptimizer(
        grad_sync.shards(),
        lambda groups: make_adamw(groups.get(True, []), groups.get(False, []), cfg),
        master_dtype=torch.promote_types(torch.float32, dtype),
        offload=cfg.offload == "optimizer",
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


class StepOutcome(NamedTuple):
    lr: float
    grad_norm: float  # inf when an fp16 overflow skipped the step
    overflow: bool  # the step was skipped: fp16 overflow, or a non-finite norm (--on-nan)
    gradient_bytes: int  # gradients held once reduced, before the step frees any


class OptimizerStep:
    """One optimizer step of this rank, for every layout."""

    def __init__(
        self,
        optimizer: MainParamOptimizer,
        grad_sync: FlatDataParallel,
        objective: Objective,
        mesh: ProcessMesh,
        cfg: TrainConfig,
    ):
        self.optimizer, self.grad_sync, self.objective, self.mesh, self.cfg = (
            optimizer,
            grad_sync,
            objective,
            mesh,
            cfg,
        )

    def __call__(self, step: int) -> StepOutcome:
        lr = lr_at(step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if not getattr(self.grad_sync.reducer, "delivered", True):
            # --dp-mode stale:S, the first S steps: no reduced gradient has arrived yet
            held = self.grad_sync.memory_bytes()["gradients"]
            if self.cfg.zero >= 1:
                self.grad_sync.release_gradient_memory()
            return StepOutcome(lr, 0.0, False, held)
        self.optimizer.prepare_grads()
        overflow = False
        scaler = self.objective.scaler
        if scaler is not None:  # fp16: unscale, and skip the step everywhere if any rank overflowed
            self.optimizer.scale_grads_(1.0 / scaler.scale)
            inf = self.optimizer.found_inf()
            ops.all_reduce(
                inf, None, self.mesh.ledger, tag="overflow", op=torch.distributed.ReduceOp.MAX
            )
            overflow = bool(inf.item() > 0)
            scaler.update(overflow)
        gradient_bytes = (
            self.grad_sync.memory_bytes()["gradients"] + self.optimizer.memory_bytes()["gradients"]
        )
        grad_norm = float("inf")
        if not overflow:
            grad_norm = self.clip()
            # A non-finite global norm (the same on every rank) is not stepped with unless
            # --on-nan continue: under stop the run ends after this step, under skip it goes on.
            if math.isfinite(grad_norm) or self.cfg.on_nan == "continue":
                self.optimizer.step()
            else:
                overflow = True
        if self.cfg.zero >= 1:  # gradients are consumed: hold none between steps
            self.grad_sync.release_gradient_memory()
        return StepOutcome(lr, grad_norm, overflow, gradient_bytes)

    @torch.no_grad()
    def clip(self) -> float:
        """Clip by the global gradient norm, computed from the slices this rank steps:
        squares summed over the data-parallel group when they are ZeRO shards; across
        tensor-parallel ranks replicated parameters counted once (Megatron's rule); across
        pipeline stages each stage adds its own layers (a tied embedding/head weight once,
        on the first stage). Returns the norm before clipping."""
        mesh, tied = self.mesh, self.objective.tied
        first_tp, pp = mesh.rank("tp") == 0, mesh.size("pp")
        last_stage = mesh.rank("pp") == pp - 1

        def counts(p) -> bool:
            return (first_tp or getattr(p, "tp_dim", None) is not None) and not (
                p is tied and last_stage and pp > 1
            )

        square = self.optimizer.grad_norm_squared(counts)
        if self.optimizer.sharded:
            ops.all_reduce(square, mesh.group("dp"), mesh.ledger, tag="grad_norm")
        ops.all_reduce(square, mesh.group("tp"), mesh.ledger, tag="grad_norm")
        ops.all_reduce(square, mesh.group("pp"), mesh.ledger, tag="grad_norm")
        norm = float(square.sqrt())
        if self.cfg.grad_clip is not None and norm > self.cfg.grad_clip:
            self.optimizer.scale_grads_(self.cfg.grad_clip / (norm + 1e-6))
        return norm
