"""Step runners: one step's forwards and backwards over this rank's micro-batches.

A runner returns the *raw* summed loss of its micro-batches (see :mod:`paracube.objective`)
and leaves reduced gradients behind; the trainer takes the mean and steps. Two kinds:

- :class:`LocalRunner` — the whole (tensor-parallel) model on this rank: gradient
  accumulation over micro-batches, the last backward reducing gradients as it goes;
- :class:`PipelineRunner` — this rank's pipeline chunks under the schedule's actions
  (:class:`~paracube.pipeline.executor.PipelineExecutor`), then one gradient reduction.
"""

from __future__ import annotations

import contextlib

import torch

from paracube.comm.ledger import CommLedger
from paracube.data.batches import RankBatches
from paracube.data_parallel import FlatDataParallel
from paracube.metrics import PhaseTimer
from paracube.objective import Objective
from paracube.pipeline.executor import PipelineExecutor
from paracube.pipeline.schedules import Schedule

Batches = list[tuple[torch.Tensor, torch.Tensor]]


class LocalRunner:
    def __init__(
        self,
        grad_sync: FlatDataParallel,
        objective: Objective,
        batches: RankBatches,
        ledger: CommLedger,
    ):
        self.grad_sync, self.objective, self.batches, self.ledger = (
            grad_sync,
            objective,
            batches,
            ledger,
        )

    def run(self, step: int, timer: PhaseTimer) -> tuple[torch.Tensor, dict | None]:
        """Gradient accumulation over the step's micro-batches."""
        loss_sum = torch.zeros((), device=self.batches.device)
        accum = self.batches.accum
        weight = self.objective.backward_weight()
        for k in range(accum):
            with timer.phase("data"):
                x, y = self.batches.micro_batch(step, k)  # (b, T) each
            # ZeRO-0/1 accumulate full gradients and reduce once per step; ZeRO-2/3 keep only
            # slices, so they reduce-scatter every micro-batch (as DeepSpeed does).
            local = k < accum - 1 and self.grad_sync.accumulates_locally
            with self.grad_sync.no_sync() if local else contextlib.nullcontext():
                with timer.phase("forward"):
                    loss = self.objective.loss_sum(self.grad_sync(x), y)
                with timer.phase("backward"):
                    (loss * weight).backward()
            loss_sum += loss.detach()
        with timer.phase("backward"):  # a one-rank group reduces here (no hooks ran)
            self.grad_sync.sync_gradients()
        # Gradient waits ran inside backward's final callback: report them as exposed comm.
        timer.move(self.ledger.total(tag="grad").seconds, src="backward", dst="comm_exposed")
        return loss_sum, None

    @torch.no_grad()
    def evaluate(self, batches: Batches) -> torch.Tensor:
        total = torch.zeros((), device=self.batches.device)
        for x, y in batches:
            total += self.objective.loss_sum(self.grad_sync(x), y)
        return total


class PipelineRunner:
    def __init__(
        self,
        executor: PipelineExecutor,
        grad_sync: FlatDataParallel,
        batches: RankBatches,
        schedule: Schedule,
        chunks: int,
    ):
        self.executor, self.grad_sync, self.batches = executor, grad_sync, batches
        self.schedule, self.chunks = schedule, chunks

    def run(self, step: int, timer: PhaseTimer) -> tuple[torch.Tensor, dict]:
        """The schedule's actions over all micro-batches, then one gradient reduction."""
        with timer.phase("data"):
            batches = self.batches.step(step)
        with self.grad_sync.no_sync(), timer.label("pipeline schedule"):
            loss_sum, record = self.executor.run([x for x, _ in batches], [y for _, y in batches])
        timer.seconds["forward"] += record.busy["F"]
        timer.seconds["backward"] += record.busy["B"] + record.busy["I"] + record.busy["W"]
        timer.seconds["bubble"] = record.waiting
        timer.injected += record.injected
        timer.spans += [(k, s - timer.origin, e - timer.origin) for k, s, e in record.spans]
        with timer.phase("comm_exposed"):
            self.grad_sync.sync_gradients()
        p, m = self.executor.p, self.batches.accum
        pipeline = {
            "schedule": self.schedule.name,
            "bubble_measured": round(record.bubble, 4),
            "bubble_formula": round(self.schedule.bubble_fraction(p, m, self.chunks), 4),
            "action_seconds": {
                k: round(record.mean(k), 6) for k in record.busy if record.counts[k]
            },
            "p2p_latency": round(record.latency, 6) if record.latency != float("inf") else 0.0,
        }
        return loss_sum, pipeline

    @torch.no_grad()
    def evaluate(self, batches: Batches) -> torch.Tensor:
        return self.executor.forward_only([x for x, _ in batches], [y for _, y in batches])
