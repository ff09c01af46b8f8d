"""The trainer: one optimizer step at a time, for every layout.

The stack is built by :func:`paracube.parallelize.parallelize` (TP → recompute → precision
→ pipeline split → DP/ZeRO → runner); a step is: zero the gradient window, run the step's
micro-batches (:mod:`paracube.runners`), sum the loss over the data-parallel group while
the optimizer steps (:class:`paracube.optim.OptimizerStep`), and record what it cost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from paracube import ranktimes
from paracube.comm import ops
from paracube.config import TrainConfig
from paracube.data.batches import RankBatches
from paracube.data.corpus import TokenCorpus, build_corpus
from paracube.data.loader import PrefetchLoader
from paracube.data.sampler import ShardedBatchSampler
from paracube.data.split import AutoBalance
from paracube.data_parallel.local import ParameterAveraging
from paracube.data_parallel.ps import Worker
from paracube.data_parallel.ps import connect as connect_parameter_server
from paracube.failures import name_failures
from paracube.heartbeat import Heartbeat
from paracube.memory.activations import ActivationCounter
from paracube.mesh.mesh import ProcessMesh
from paracube.metrics import PhaseTimer, StepMetrics
from paracube.objective import Objective
from paracube.optim import (
    OptimizerStep,
    StepOutcome,
    build_optimizer,
    lr_at,
    make_adamw,
    shard_optimizer,
)
from paracube.parallelize import parallelize
from paracube.pipeline.executor import PipelineExecutor
from paracube.precision import LossScaler
from paracube.validate import validate
from paracube.values import dp_mode

__all__ = ["Trainer", "build_optimizer", "lr_at", "make_adamw"]


class Trainer:
    """Trains ``cfg.model`` on this rank's shard of every global batch.

    >>> trainer = Trainer(cfg, ProcessMesh(cfg.parallel))   # inside a torch.distributed job
    >>> metrics = trainer.train_step()                       # one optimizer step
    >>> metrics.loss, metrics.memory["weights"]
    """

    def __init__(self, cfg: TrainConfig, mesh: ProcessMesh, corpus: TokenCorpus | None = None):
        validate(cfg, mesh.layout.world_size, data=False)  # the corpus is checked as it is read
        self.cfg, self.mesh = cfg, mesh
        self.corpus = corpus or build_corpus(cfg.data, cfg.model.seq_len, cfg.val_fraction)
        seq, batch = cfg.model.seq_len, cfg.global_batch
        split = cfg.data_split()
        self.batches = PrefetchLoader(
            ShardedBatchSampler(self.corpus.train, seq, batch, cfg.seed),
            mesh,
            cfg.grad_accum,
            cfg.data_workers,
            cfg.prefetch,
            split,
        )
        replica_of = [mesh.layout.coords(r)["dp"] for r in range(mesh.layout.world_size)]
        self.balancer = AutoBalance(split, replica_of) if cfg.dp_balance == "auto" else None
        self.val_batches = RankBatches(
            ShardedBatchSampler(self.corpus.val, seq, batch, cfg.seed + 7919), mesh, cfg.grad_accum
        )
        scaler = LossScaler(cfg.loss_scale or "dynamic") if cfg.precision == "fp16" else None
        self.objective = Objective(cfg, mesh, scaler)
        self.parallel = parallelize(cfg, mesh, self.objective, self.batches)
        self.grad_sync = self.parallel.grad_sync
        self.optimizer = shard_optimizer(self.grad_sync, cfg)
        self.optimizer_step = OptimizerStep(
            self.optimizer, self.grad_sync, self.objective, mesh, cfg
        )
        mode, every = dp_mode(cfg.dp_mode)
        self.averaging = (
            ParameterAveraging(mode, every, self.optimizer, mesh.group("dp"), mesh.ledger)
            if mode in ("local-sgd", "diloco") and every
            else None
        )
        self.ps_worker = self._connect_parameter_server(every) if mode == "ps" else None
        self.activations = ActivationCounter()
        self._activations_counted: tuple[int, int] | None = None  # (step, peak bytes) last counted
        self.step = 0
        self.last_spans: list[tuple[str, float, float]] = []  # the last step's phases
        # Set by train_rank: lets a failing rank name the peer that stopped answering.
        self.heartbeat: Heartbeat | None = None

    def _connect_parameter_server(self, bound: int | None) -> Worker:
        """--dp-mode ps[:S]: this rank's worker (and on data-parallel rank 0 the server):
        ``steps × dp`` pushes of batch/dp sequences each, the lr schedule by samples, a
        worker at most ``bound`` pushes ahead of the slowest (None: unbounded)."""
        cfg, dp = self.cfg, self.mesh.size("dp")
        return connect_parameter_server(
            self.optimizer,
            self.mesh.twin_group("dp"),
            self.mesh.ledger,
            total=cfg.steps * dp,
            lr_at=lambda update: lr_at(update // dp, cfg),
            clip=cfg.grad_clip,
            staleness_bound=bound,
        )

    @property
    def finished(self) -> bool:
        """The job's steps are done (under --dp-mode ps: the server has applied them all)."""
        if self.ps_worker is not None:
            return self.ps_worker.stopped
        return self.step >= self.cfg.steps

    def staleness_distribution(self) -> dict[int, int] | None:
        """--dp-mode ps, on the server's rank: how many pushes were applied how late."""
        server = self.ps_worker.server if self.ps_worker is not None else None
        return dict(sorted(server.staleness.items())) if server is not None else None

    # -- views of the stack ---------------------------------------------------------------

    @property
    def module(self) -> nn.Module:
        """The local model: the whole (TP-sharded) GPT, or this rank's pipeline chunks."""
        return self.grad_sync.module

    @property
    def pipeline(self) -> PipelineExecutor | None:
        """This rank's pipeline executor (None without pipeline parallelism)."""
        return self.parallel.pipeline

    @property
    def scaler(self) -> LossScaler | None:
        """The fp16 loss scaler (None under fp32/bf16)."""
        return self.objective.scaler

    @property
    def tp_group(self) -> dist.ProcessGroup | None:
        """This rank's tensor-parallel group."""
        return self.mesh.group("tp")

    def serial_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the serial model's names."""
        return self.parallel.serial_named_parameters()

    def gathered_parameters(self) -> contextlib.AbstractContextManager:
        """Inside, every parameter holds its full value (ZeRO-3 gathers and then frees)."""
        return self.grad_sync.gathered_parameters()

    # -- memory -----------------------------------------------------------------------------

    def model_state_bytes(self, gradients: int | None = None) -> dict[str, int]:
        """Counted bytes of this rank's model states as allocated now, reported by the
        data-parallel wrapper (weights, gradient buffers and slices) and the optimizer
        (Adam's moments, fp32 masters, fp32 gradient copies). ``gradients``: the figure
        counted earlier in the step, where all gradients still existed."""
        held, opt = self.grad_sync.memory_bytes(), self.optimizer.memory_bytes()
        grads = held["gradients"] + opt["gradients"] if gradients is None else gradients
        host = {k: v for k, v in opt.items() if k.endswith("_host")}  # --offload optimizer
        return {
            "weights": held["weights"],
            "gradients": grads,
            "optimizer": opt["optimizer"],
            **host,
        }

    def memory_metrics(self, gradients: int | None = None) -> dict[str, int]:
        """Per-step memory record: model states, saved activations (peak over the step),
        ZeRO-3's peak of gathered parameters, ZeRO-2/3's peak of full gradient buffers, and
        the CUDA allocator's peak on GPU."""
        record = self.model_state_bytes(gradients)
        if self._activations_counted is not None:
            record["activations_counted_step"], record["activations_peak"] = (
                self._activations_counted
            )
        if self.ps_worker is not None and self.ps_worker.server is not None:
            record["ps_server"] = self.ps_worker.server.memory_bytes()  # a thread of this rank
        held = self.grad_sync.memory_bytes()
        for key in ("params_peak", "grad_buffers_peak"):  # ZeRO-3's gathers; ZeRO-2/3's buffers
            if key in held:
                record[key] = held[key]
        if self.mesh.device.type == "cuda":
            record["cuda_max_allocated"] = torch.cuda.max_memory_allocated(self.mesh.device)
        return record

    # -- training ---------------------------------------------------------------------------

    def train_step(self) -> StepMetrics:
        """One optimizer step over this rank's micro-batches; a collective that fails
        inside it is re-raised naming the rank, its coordinates, the step and the phase."""
        timer = PhaseTimer(torch.cuda.synchronize if self.mesh.device.type == "cuda" else None)
        if self.heartbeat is not None:
            self.heartbeat.at(self.step, timer)
        with self.naming_failures(timer):
            return self._train_step(timer)

    def naming_failures(self, phase) -> contextlib.AbstractContextManager:
        """Inside, a failed collective is re-raised as one line naming this rank, the step,
        ``phase`` and the peer that stopped answering (:mod:`paracube.failures`)."""
        mesh = self.mesh
        return name_failures(mesh.global_rank, mesh.layout.where, self.step, phase, self.heartbeat)

    def _train_step(self, timer: PhaseTimer) -> StepMetrics:
        cfg, ledger = self.cfg, self.mesh.ledger
        ledger.reset()
        start = time.perf_counter()
        self.grad_sync.zero_grad()
        scale = self.objective.loss_scale
        # Saved activations are counted every ``count_activations_every`` steps (each saved
        # tensor passes through a Python hook: ~1-2 % of a small model's step); the figure
        # does not change between steps of one configuration. A resumed run counts its first.
        first = self._activations_counted is None
        count = first or self.step % cfg.count_activations_every == 0
        self.activations.reset_peak()
        with self.activations if count else contextlib.nullcontext():
            loss_sum, pipeline = self.parallel.runner.run(self.step, timer)
        if count:
            self._activations_counted = (self.step, self.activations.peak)
        tokens = self.objective.tokens_global
        ps = None
        if self.ps_worker is not None:  # --dp-mode ps: no collective; this worker's batch alone
            with timer.phase("comm_exposed"):
                ps = self.ps_worker.exchange()
            outcome = StepOutcome(ps.lr, ps.grad_norm, False, self.model_state_bytes()["gradients"])
            tokens //= self.mesh.size("dp")
            loss_value = loss_sum.item() / tokens
        else:
            # The global loss is summed across ranks while the optimizer runs.
            loss_reduce = ops.all_reduce(
                loss_sum, self.mesh.group("dp"), ledger, tag="loss", async_op=True
            )
            with timer.phase("optimizer"):
                outcome = self.optimizer_step(self.step)
            with timer.phase("comm_exposed"):
                if self.averaging is not None:  # --dp-mode local-sgd / diloco, every H steps
                    self.averaging.after_step(self.step)
                loss_value = self.objective.mean(loss_reduce.wait().item())
        # Every rank's timings, gathered once (a few floats per rank; paracube.ranktimes) —
        # except under a parameter server, whose workers never wait for each other.
        split = self.batches.split  # the split this step ran under
        mine = ranktimes.rank_vector(
            timer.seconds,
            time.perf_counter() - start,
            ledger,
            pipeline,
            timer.injected,
            split.shares[self.batches.dp_rank],
        )
        ranks = ranktimes.gather(mine, ledger, self.mesh.device) if ps is None else None
        self.last_spans = timer.spans
        rebalanced = None
        if self.balancer is not None and ranks is not None:  # alike on every rank
            rebalanced = self.balancer.update(self.step, ranktimes.compute_per_window(ranks))
            if rebalanced is not None:
                self.batches.set_split(rebalanced)
        step_time = time.perf_counter() - start
        metrics = StepMetrics(
            step=self.step,
            loss=loss_value,
            lr=outcome.lr,
            grad_norm=outcome.grad_norm,
            tokens=tokens,
            step_time=step_time,
            tokens_per_s=tokens / step_time,
            time={k: round(v, 6) for k, v in timer.seconds.items()},
            comm=ledger.snapshot(),
            pipeline=pipeline,
            memory=self.memory_metrics(gradients=outcome.gradient_bytes),
            skipped=True if outcome.overflow else None,
            loss_scale=scale if self.scaler is not None else None,
            ranks=ranks,
            dp_split=list(split.shares) if self.cfg.dp_balance != "even" else None,
            dp_split_changed=True if rebalanced is not None else None,
            staleness=ps.staleness if ps is not None else None,
            ps_version=ps.version if ps is not None else None,
        )
        self.step += 1
        return metrics

    def drain(self) -> None:
        """Wait for communication left in flight across steps (``--dp-mode stale:S``), so
        that the job can end."""
        drain = getattr(self.grad_sync.reducer, "drain", None)
        if drain is not None:
            drain()
        if self.ps_worker is not None:  # the server's threads end with the job's pushes
            self.ps_worker.finish()

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``eval_batches`` global batches of the validation split."""
        if self.heartbeat is not None:
            self.heartbeat.at(self.step, "evaluation")
        with self.naming_failures("evaluation"):
            return self._evaluate()

    def _evaluate(self) -> float:
        self.module.eval()
        total = torch.zeros((), device=self.mesh.device)
        for i in range(self.cfg.eval_batches):
            total += self.parallel.runner.evaluate(self.val_batches.step(i))
        self.module.train()
        ops.all_reduce(total, self.mesh.group("dp"), self.mesh.ledger, tag="eval")
        return self.objective.mean(total.item(), self.cfg.eval_batches)
