"""The training engine: mesh + model + data parallelism + optimizer, one step at a time.

Parallelisms are applied in a fixed order (design.md): tensor parallel, then the
pipeline split, then data parallel / ZeRO. This issue's engine has the data-parallel
axis; the others are validated and refused with a clear line until they land.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn

from paracube.config import TrainConfig
from paracube.data.corpus import VOCAB_SIZE, TokenCorpus, build_corpus
from paracube.data.sampler import ShardedBatchSampler
from paracube.data_parallel import DataParallel
from paracube.errors import CollectiveTimeout, ConfigError
from paracube.mesh.mesh import ProcessMesh
from paracube.metrics import PhaseTimer, StepMetrics
from paracube.models.gpt import GPT
from paracube.comm import ops
from paracube.tensor_parallel import (
    TPContext,
    parallelize_gpt,
    sequence_parallel_params,
    sync_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)


def check_supported(cfg: TrainConfig) -> None:
    """Refuse model/data mismatches — before any collective."""
    if cfg.model.vocab_size < VOCAB_SIZE:
        raise ConfigError(
            f"model vocab_size {cfg.model.vocab_size} < {VOCAB_SIZE}: the byte-level data needs a vocabulary of at least 256"
        )


def is_decayed(p: nn.Parameter) -> bool:
    """Weight decay on matrices only, not on biases and norm scales (GPT-3 / nanoGPT practice)."""
    return p.dim() >= 2


def make_adamw(decay: list, no_decay: list, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (β = 0.9, 0.95 as GPT-3) as fused kernels — one pass per tensor, on CPU too."""
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer over a plain module's own parameters (the serial reference, peers)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return make_adamw([p for p in params if is_decayed(p)], [p for p in params if not is_decayed(p)], cfg)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


class Trainer:
    """Trains ``cfg.model`` on this rank's shard of every global batch.

    The loss of each micro-batch is summed over its tokens and divided by the tokens of
    the *global* batch, so the data-parallel reduction is a plain sum and the gradient is
    exactly the serial one, whatever the split into ranks and micro-steps.
    """

    def __init__(self, cfg: TrainConfig, mesh: ProcessMesh, corpus: TokenCorpus | None = None):
        check_supported(cfg)
        self.cfg, self.mesh = cfg, mesh
        self.corpus = corpus or build_corpus(cfg.data, cfg.model.seq_len, cfg.val_fraction)
        self.sampler = ShardedBatchSampler(self.corpus.train, cfg.model.seq_len, cfg.global_batch, cfg.seed)
        self.val_sampler = ShardedBatchSampler(
            self.corpus.val, cfg.model.seq_len, cfg.global_batch, cfg.seed + 7919
        )
        # Parallelisms in their fixed order (design.md): tensor parallel, then the pipeline
        # split, then data parallel. Every rank builds the full model from the seed; TP keeps
        # its slices of it, the pipeline split its stages' layers.
        torch.manual_seed(cfg.seed)
        self.tp_group, self.pp_group = mesh.group("tp"), mesh.group("pp")
        model = GPT(cfg.model)
        parallelize_gpt(model, TPContext(self.tp_group, mesh.ledger, cfg.parallel.sequence_parallel))
        self.pipeline, self.tied = None, None
        if mesh.size("pp") > 1:
            module = self._build_pipeline(model)
        else:
            module = model.to(mesh.device)
        self.sp_params = sequence_parallel_params(module)
        self.model = DataParallel(
            module, mesh.group("dp"), mesh.ledger, bucket_mb=cfg.parallel.bucket_mb, average=False,
            group_key=is_decayed, contiguous_params=True,
        )
        # The optimizer steps whole buckets (flat parameters), not the module's tensors.
        flat = self.model.flat_parameters()
        self.params = [p for _, p in flat]
        self.optimizer = make_adamw([p for d, p in flat if d], [p for d, p in flat if not d], cfg)
        self.step = 0

    def _build_pipeline(self, model: GPT) -> nn.Module:
        from paracube.pipeline.build import build_pipeline
        from paracube.pipeline.executor import PipelineExecutor

        cfg, mesh = self.cfg, self.mesh
        sample = self._micro_batch(self.sampler, 0, 0)[0] if cfg.parallel.balance == "time" else None
        plan = build_pipeline(model, cfg, mesh.rank("pp"), sample)
        self.pipeline_description = plan.description
        chunks = [c.to(mesh.device) for c in plan.chunks]
        sp = cfg.parallel.sequence_parallel
        seq = cfg.model.seq_len // (mesh.size("tp") if sp else 1)
        dtype = next(p for c in chunks for p in c.parameters()).dtype
        tokens_global = cfg.global_batch * cfg.model.seq_len
        self.pipeline = PipelineExecutor(
            chunks, plan.actions, p=mesh.size("pp"), rank=mesh.rank("pp"),
            act_shape=(cfg.micro_batch, seq, cfg.model.hidden), dtype=dtype, device=mesh.device,
            loss_fn=lambda out, y: self._loss(out, y) / tokens_global, group=self.pp_group, ledger=mesh.ledger,
            store=plan.store,
        )
        self.tied = self._tied_parameter(chunks)
        return nn.ModuleList(chunks)

    def _tied_parameter(self, chunks) -> nn.Parameter | None:
        """The embedding/head weight when tied and split between first and last stage."""
        if not self.cfg.model.tie_embeddings:
            return None
        self.tied_group = self.mesh.first_last_stage_group()
        return next((p for c in chunks for n, p in c.serial_named_parameters() if n in ("embed.tok.weight", "head.weight")), None)

    @property
    def module(self) -> nn.Module:
        """The local model: the whole (TP-sharded) GPT, or this rank's pipeline chunks."""
        return self.model.module

    def model_state_bytes(self) -> dict[str, int]:
        """Counted bytes of this rank's model states: parameters, gradient storage (the
        bucket buffers, or the gradients themselves), optimizer states (Adam's m and v)."""
        params = sum(p.numel() * p.element_size() for _, p in self.serial_named_parameters())
        if self.model.buckets:
            grads = sum(b.nbytes for b in self.model.buckets)
        else:
            grads = sum(p.grad.numel() * p.grad.element_size() for _, p in self.serial_named_parameters()
                        if p.grad is not None)
        states = sum(t.numel() * t.element_size() for st in self.optimizer.state.values()
                     for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
        return {"weights": params, "gradients": grads, "optimizer": states}

    def serial_named_parameters(self):
        """This rank's parameters under the serial model's names."""
        if self.pipeline is None:
            return self.module.named_parameters()
        return ((n, p) for c in self.module for n, p in c.serial_named_parameters())

    def _micro_batch(self, sampler: ShardedBatchSampler, step: int, k: int):
        x, y = sampler.micro_batch(
            step, dp_rank=self.mesh.rank("dp"), dp_size=self.mesh.size("dp"), micro_step=k, accum=self.cfg.grad_accum
        )
        return x.to(self.mesh.device, non_blocking=True), y.to(self.mesh.device, non_blocking=True)

    def train_step(self) -> StepMetrics:
        timer = PhaseTimer()
        try:
            return self._train_step(timer)
        except RuntimeError as e:  # gloo/NCCL timeouts and peer failures surface here
            coords = " ".join(f"{a}={i}" for a, i in self.mesh.layout.coords(self.mesh.global_rank).items())
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CollectiveTimeout(
                f"rank {self.mesh.global_rank} ({coords}) failed in step {self.step}, "
                f"phase {timer.current or 'between phases'}: {first}"
            ) from e

    def _train_step(self, timer: PhaseTimer) -> StepMetrics:
        cfg, ledger = self.cfg, self.mesh.ledger
        ledger.reset()
        start = time.perf_counter()
        tokens_global = cfg.global_batch * cfg.model.seq_len
        self.model.zero_grad()
        if self.pipeline is None:
            loss_sum, pipeline = self._micro_steps(timer, tokens_global), None
        else:
            loss_sum, pipeline = self._pipeline_step(timer)
        with timer.phase("comm_exposed"):
            sync_sequence_parallel_grads(self.sp_params, self.tp_group, ledger)
            if self.tied is not None and self.tied.grad is not None:  # embedding + head contributions
                ops.all_reduce(self.tied.grad, self.tied_group, ledger, tag="tied_grad")
        # The global loss is summed across ranks while the optimizer runs.
        loss_reduce = ops.all_reduce(loss_sum, self.mesh.group("dp"), ledger, tag="loss", async_op=True)
        with timer.phase("optimizer"):
            lr = lr_at(self.step, cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            grad_norm = self._clip_gradients()
            self.optimizer.step()
        with timer.phase("comm_exposed"):
            loss_value = loss_reduce.wait().item()
        step_time = time.perf_counter() - start
        metrics = StepMetrics(
            step=self.step,
            loss=loss_value,
            lr=lr,
            grad_norm=grad_norm,
            tokens=tokens_global,
            step_time=step_time,
            tokens_per_s=tokens_global / step_time,
            time={k: round(v, 6) for k, v in timer.seconds.items()},
            comm=ledger.snapshot(),
            pipeline=pipeline,
        )
        self.step += 1
        return metrics

    def _micro_steps(self, timer: PhaseTimer, tokens_global: int) -> torch.Tensor:
        """Gradient accumulation over micro-batches; the last backward reduces gradients."""
        loss_sum = torch.zeros((), device=self.mesh.device)
        for k in range(self.cfg.grad_accum):
            with timer.phase("data"):
                x, y = self._micro_batch(self.sampler, self.step, k)  # (b, T) each
            last = k == self.cfg.grad_accum - 1
            with self.model.no_sync() if not last else contextlib.nullcontext():
                with timer.phase("forward"):
                    loss = self._loss(self.model(x), y) / tokens_global
                with timer.phase("backward"):
                    loss.backward()
            loss_sum += loss.detach()
        # Gradient waits ran inside backward's final callback: report them as exposed comm.
        timer.move(self.mesh.ledger.total(tag="grad").seconds, src="backward", dst="comm_exposed")
        return loss_sum

    def _pipeline_step(self, timer: PhaseTimer) -> tuple[torch.Tensor, dict]:
        """The schedule's actions over all micro-batches, then one gradient reduction."""
        from paracube.pipeline.build import formula_bubble

        cfg, par = self.cfg, self.cfg.parallel
        with timer.phase("data"):
            batches = [self._micro_batch(self.sampler, self.step, k) for k in range(cfg.grad_accum)]
        with self.model.no_sync():
            loss_sum, record = self.pipeline.run([x for x, _ in batches], [y for _, y in batches])
        timer.seconds["forward"] += record.busy["F"]
        timer.seconds["backward"] += record.busy["B"] + record.busy["I"] + record.busy["W"]
        timer.seconds["bubble"] = record.waiting
        with timer.phase("comm_exposed"):
            self.model.sync_gradients()
        pipeline = {
            "schedule": par.schedule,
            "bubble_measured": round(record.bubble, 4),
            "bubble_formula": round(formula_bubble(par.schedule, par.pp, cfg.grad_accum, par.chunks), 4),
            "action_seconds": {k: round(record.mean(k), 6) for k in record.busy if record.counts[k]},
            "p2p_latency": round(record.latency, 6) if record.latency != float("inf") else 0.0,
        }
        return loss_sum, pipeline

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed next-token loss; vocabulary-parallel when the head is sharded."""
        return vocab_parallel_cross_entropy(logits, targets, self.tp_group, self.mesh.ledger, reduction="sum")

    @torch.no_grad()
    def _clip_gradients(self) -> float:
        """Clip by the global gradient norm. Gradients are identical across data-parallel
        ranks; across tensor-parallel ranks the shards' squares are summed and replicated
        parameters counted once (Megatron's rule); across pipeline stages each stage adds
        its own layers (a tied embedding/head weight once, on the first stage)."""
        if self.mesh.size("tp") == 1 and self.pipeline is None:
            params = [p for p in self.params if p.grad is not None]
            if self.cfg.grad_clip is None:
                return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
            return float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip, foreach=True))
        first_tp, last_stage = self.mesh.rank("tp") == 0, self.mesh.rank("pp") == self.mesh.size("pp") - 1
        grads = [
            p.grad for _, p in self.serial_named_parameters()
            if p.grad is not None and (first_tp or getattr(p, "tp_dim", None) is not None)
            and not (p is self.tied and last_stage and self.mesh.size("pp") > 1)
        ]
        square = torch.stack(torch._foreach_norm(grads)).square().sum() if grads else torch.zeros(())
        ops.all_reduce(square, self.tp_group, self.mesh.ledger, tag="grad_norm")
        ops.all_reduce(square, self.pp_group, self.mesh.ledger, tag="grad_norm")
        norm = float(square.sqrt())
        if self.cfg.grad_clip is not None and norm > self.cfg.grad_clip:
            torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], self.cfg.grad_clip / (norm + 1e-6))
        return norm

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``eval_batches`` global batches of the validation split."""
        cfg = self.cfg
        self.module.eval()
        total = torch.zeros((), device=self.mesh.device)
        for i in range(cfg.eval_batches):
            batches = [self._micro_batch(self.val_sampler, i, k) for k in range(cfg.grad_accum)]
            if self.pipeline is not None:
                total += self.pipeline.forward_only([x for x, _ in batches], [y for _, y in batches])
            else:
                total += sum(self._loss(self.module(x), y) for x, y in batches)
        self.module.train()
        if self.pipeline is not None:  # the pipeline's loss is normalised by the global tokens
            total *= cfg.global_batch * cfg.model.seq_len
        ops.all_reduce(total, self.mesh.group("dp"), self.mesh.ledger, tag="eval")
        return total.item() / (cfg.eval_batches * cfg.global_batch * cfg.model.seq_len)
