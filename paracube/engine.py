"""The training engine: mesh + model + data parallelism + optimizer, one step at a time.

Parallelisms are applied in a fixed order (design.md): tensor parallel, then the
pipeline split, then data parallel / ZeRO. Activation recomputation is switched on in
the blocks before the split; mixed precision casts the model to its compute dtype, while
the optimizer steps fp32 main parameters (sharded under ZeRO ≥ 1).
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
from paracube.data_parallel import DataParallel, MainParamOptimizer, ShardedDataParallel
from paracube.errors import CollectiveTimeout, ConfigError
from paracube.memory.activations import ActivationCounter
from paracube.mesh.mesh import ProcessMesh
from paracube.metrics import PhaseTimer, StepMetrics
from paracube.models.gpt import GPT, apply_recompute
from paracube.comm import ops
from paracube.precision import DTYPES, LossScaler
from paracube.tensor_parallel import TPContext, parallelize_gpt, vocab_parallel_cross_entropy


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
    if not groups:  # a rank whose shards hold only padding still needs an optimizer
        groups = [{"params": [nn.Parameter(torch.zeros(0))], "weight_decay": 0.0}]
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
        self.dtype = DTYPES[cfg.precision]
        model = GPT(cfg.model)  # initialised in fp32 from the seed, then cast: all precisions start alike
        parallelize_gpt(model, TPContext(self.tp_group, mesh.ledger, cfg.parallel.sequence_parallel))
        apply_recompute(model, cfg.recompute, cfg.recompute_blocks)
        if cfg.precision != "fp32":  # fp32 = the default dtype (float64 in the exactness tests)
            model.to(self.dtype)
        self.pipeline, self.tied = None, None
        if mesh.size("pp") > 1:
            module = self._build_pipeline(model)
        else:
            module = model.to(mesh.device)
        # fp32 gradient accumulation and reduction under bf16/fp16 unless asked otherwise.
        grad_dtype = torch.float32 if cfg.precision != "fp32" and cfg.grad_reduce == "fp32" else None
        if cfg.zero == 3:
            self.model = ShardedDataParallel(
                module, list(model.blocks), mesh.group("dp"), mesh.ledger, group_key=is_decayed,
                grad_dtype=grad_dtype, pre_reduce=self._pre_reduce,
            )
        else:
            self.model = DataParallel(
                module, mesh.group("dp"), mesh.ledger, bucket_mb=cfg.parallel.bucket_mb, average=False,
                group_key=is_decayed, contiguous_params=True, zero_stage=cfg.zero, grad_dtype=grad_dtype,
                pre_reduce=self._pre_reduce,
            )
        # The optimizer steps this rank's flat slices (whole buckets under ZeRO-0), through
        # fp32 main parameters; weight decay by group key.
        param_dtype = next(module.parameters()).dtype
        self.optimizer = MainParamOptimizer(
            self.model.shards(), lambda groups: make_adamw(groups.get(True, []), groups.get(False, []), cfg),
            master_dtype=torch.promote_types(torch.float32, param_dtype),
        )
        self.scaler = LossScaler(cfg.loss_scale) if cfg.precision == "fp16" else None
        self.activations = ActivationCounter()
        self._activations_counted: tuple[int, int] | None = None  # (step, peak bytes) last counted
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
            loss_fn=lambda out, y: self._loss(out, y) * (self._loss_scale / tokens_global),
            group=self.pp_group, ledger=mesh.ledger,
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

    @property
    def _loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def model_state_bytes(self, gradients: int | None = None) -> dict[str, int]:
        """Counted bytes of this rank's model states, as allocated now: parameters (flat
        buffers; under ZeRO-3 this rank's slices), gradients (``gradients`` if counted
        earlier in the step, else :meth:`gradient_bytes` now), and the optimizer (Adam's
        moments and the fp32 master weights, on this rank's slices under ZeRO ≥ 1)."""
        if isinstance(self.model, ShardedDataParallel):
            weights = sum(_storage(u.shard) for u in self.model.all_units)
        else:
            weights = sum(_storage(b.flat_param) for b in self.model.buckets)
        opt = self.optimizer.state_bytes()
        return {"weights": weights, "gradients": self.gradient_bytes() if gradients is None else gradients,
                "optimizer": opt["optimizer_states"] + opt["master_weights"]}

    def gradient_bytes(self) -> int:
        """Bytes holding gradients now: bucket buffers, or the slices under ZeRO-2/3, plus
        any fp32 copies the optimizer converted them into."""
        if isinstance(self.model, ShardedDataParallel):
            grads = sum(_storage(u.grad_shard) for u in self.model.all_units)
        else:
            grads = sum(b.nbytes + (_storage(b.grad_shard) if b.grad_shard is not None else 0)
                        for b in self.model.buckets)
        return grads + sum(_storage(g) for g in self.optimizer._main_grad if g is not None)

    def memory_metrics(self, gradients: int | None = None) -> dict[str, int]:
        """Per-step memory record: model states, saved activations (peak over the step),
        ZeRO-3's peak of gathered parameters, and the CUDA allocator's peak on GPU."""
        record = self.model_state_bytes(gradients)
        if self._activations_counted is not None:
            record["activations_counted_step"], record["activations_peak"] = self._activations_counted
        if isinstance(self.model, ShardedDataParallel):
            record["params_peak"] = self.model.peak_param_bytes
        if self.mesh.device.type == "cuda":
            record["cuda_max_allocated"] = torch.cuda.max_memory_allocated(self.mesh.device)
        return record

    @contextlib.contextmanager
    def gathered_parameters(self):
        """Inside, every parameter holds its full value (ZeRO-3 gathers and then frees)."""
        if not isinstance(self.model, ShardedDataParallel):
            yield
            return
        for u in self.model.all_units:
            u.gather()
        try:
            yield
        finally:
            for u in self.model.all_units:
                u.free()

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
        # Saved activations are counted every ``count_activations_every`` steps (each saved
        # tensor passes through a Python hook: ~1-2 % of a small model's step); the figure
        # does not change between steps of one configuration.
        count = self.step % cfg.count_activations_every == 0
        self.activations.reset_peak()
        scale = self._loss_scale
        with self.activations if count else contextlib.nullcontext():
            if self.pipeline is None:
                loss_sum, pipeline = self._micro_steps(timer, tokens_global), None
            else:
                loss_sum, pipeline = self._pipeline_step(timer)
        if count:
            self._activations_counted = (self.step, self.activations.peak)
        if scale != 1.0:
            loss_sum = loss_sum / scale
        # The global loss is summed across ranks while the optimizer runs.
        loss_reduce = ops.all_reduce(loss_sum, self.mesh.group("dp"), ledger, tag="loss", async_op=True)
        with timer.phase("optimizer"):
            lr = lr_at(self.step, cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.prepare_grads()
            overflow = False
            if self.scaler is not None:
                self.optimizer.scale_grads_(1.0 / scale)
                inf = self.optimizer.found_inf()
                ops.all_reduce(inf, None, ledger, tag="overflow", op=torch.distributed.ReduceOp.MAX)
                overflow = bool(inf.item() > 0)
                self.scaler.update(overflow)
            # Model states are counted where they all coexist: gradients now (reduced,
            # before the step frees any), weights and optimizer states after the step.
            grad_bytes = self.gradient_bytes()
            if overflow:  # fp16 overflow somewhere: skip this step on every rank
                grad_norm = float("inf")
            else:
                grad_norm = self._clip_gradients()
                self.optimizer.step()
            if cfg.zero >= 1:  # gradients are consumed: hold none between steps
                self.model.release_gradient_memory()
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
            memory=self.memory_metrics(gradients=grad_bytes),
            skipped=True if overflow else None,
            loss_scale=scale if self.scaler is not None else None,
        )
        self.step += 1
        return metrics

    def _micro_steps(self, timer: PhaseTimer, tokens_global: int) -> torch.Tensor:
        """Gradient accumulation over micro-batches; the last backward reduces gradients."""
        loss_sum = torch.zeros((), device=self.mesh.device)
        scale = self._loss_scale
        for k in range(self.cfg.grad_accum):
            with timer.phase("data"):
                x, y = self._micro_batch(self.sampler, self.step, k)  # (b, T) each
            # ZeRO-0/1 accumulate full gradients and reduce once per step; ZeRO-2/3 keep only
            # slices, so they reduce-scatter every micro-batch (as DeepSpeed does).
            accumulate_locally = k < self.cfg.grad_accum - 1 and self.cfg.zero < 2
            with self.model.no_sync() if accumulate_locally else contextlib.nullcontext():
                with timer.phase("forward"):
                    loss = self._loss(self.model(x), y) * (scale / tokens_global)
                with timer.phase("backward"):
                    loss.backward()
            loss_sum += loss.detach()
        if self.model.needs_sync_call:  # one data-parallel rank: no hooks ran
            with timer.phase("backward"):
                self.model.sync_gradients()
        # Gradient waits ran inside backward's final callback: report them as exposed comm.
        timer.move(self.mesh.ledger.total(tag="grad").seconds, src="backward", dst="comm_exposed")
        return loss_sum

    def _pipeline_step(self, timer: PhaseTimer) -> tuple[torch.Tensor, dict]:
        """The schedule's actions over all micro-batches, then one gradient reduction."""
        from paracube.pipeline.schedules import get_schedule

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
            "bubble_formula": round(get_schedule(par.schedule).bubble_fraction(par.pp, cfg.grad_accum, par.chunks), 4),
            "action_seconds": {k: round(record.mean(k), 6) for k in record.busy if record.counts[k]},
            "p2p_latency": round(record.latency, 6) if record.latency != float("inf") else 0.0,
        }
        return loss_sum, pipeline

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed next-token loss; vocabulary-parallel when the head is sharded."""
        return vocab_parallel_cross_entropy(logits, targets, self.tp_group, self.mesh.ledger, reduction="sum",
                                            vocab_size=self.cfg.model.vocab_size)

    @torch.no_grad()
    def _pre_reduce(self, params: list, grads: list) -> None:
        """Sums that must precede the data-parallel reduction of a bucket or unit: the
        partial gradients of sequence-parallel norms over tp (each rank saw T/tp tokens),
        and a tied embedding/head weight's two halves over the first and last stage."""
        sp = [g for p, g in zip(params, grads) if getattr(p, "sequence_parallel", False)]
        ops.all_reduce_coalesced(sp, self.tp_group, self.mesh.ledger, tag="sp_grad")
        if self.tied is not None:
            for p, g in zip(params, grads):
                if p is self.tied:
                    ops.all_reduce(g, self.tied_group, self.mesh.ledger, tag="tied_grad")

    @torch.no_grad()
    def _clip_gradients(self) -> float:
        """Clip by the global gradient norm, computed from the slices this rank steps:
        squares summed over the data-parallel group when they are ZeRO shards; across
        tensor-parallel ranks replicated parameters counted once (Megatron's rule); across
        pipeline stages each stage adds its own layers (a tied embedding/head weight once,
        on the first stage)."""
        first_tp, last_stage = self.mesh.rank("tp") == 0, self.mesh.rank("pp") == self.mesh.size("pp") - 1
        pp = self.mesh.size("pp")

        def counts(p) -> bool:
            return (first_tp or getattr(p, "tp_dim", None) is not None) and not (p is self.tied and last_stage and pp > 1)

        square = self.optimizer.grad_norm_squared(counts)
        if self.optimizer.sharded:
            ops.all_reduce(square, self.mesh.group("dp"), self.mesh.ledger, tag="grad_norm")
        ops.all_reduce(square, self.tp_group, self.mesh.ledger, tag="grad_norm")
        ops.all_reduce(square, self.pp_group, self.mesh.ledger, tag="grad_norm")
        norm = float(square.sqrt())
        if self.cfg.grad_clip is not None and norm > self.cfg.grad_clip:
            self.optimizer.scale_grads_(self.cfg.grad_clip / (norm + 1e-6))
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
                total += sum(self._loss(self.model(x), y) for x, y in batches)
        self.module.train()
        if self.pipeline is not None:  # the pipeline's loss is normalised by the global tokens
            total *= cfg.global_batch * cfg.model.seq_len / self._loss_scale
        ops.all_reduce(total, self.mesh.group("dp"), self.mesh.ledger, tag="eval")
        return total.item() / (cfg.eval_batches * cfg.global_batch * cfg.model.seq_len)


def _storage(t: torch.Tensor) -> int:
    """Bytes allocated for ``t``'s storage now (0 while freed)."""
    return t.untyped_storage().nbytes()
