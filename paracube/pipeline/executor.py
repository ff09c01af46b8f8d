"""Runs one rank's schedule actions on its model chunks, with point-to-point transfers.

For the action lists of :mod:`paracube.pipeline.schedules`: a forward receives its input
from the previous virtual stage (or takes the micro-batch's tokens on stage 0) and sends
its output on; a backward receives the output gradient (or starts from the loss on the
last stage) and sends the input gradient back. Sends are non-blocking and waited at the
end of the step; receives block when the action needs them, and that wait is the rank's
idle time. Every message carries a tag naming (direction, stage, micro-batch), so no two
transfers between the same ranks can be confused. Activations are dropped as soon as
their backward (or, for zero-bubble, their W) is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from paracube.comm.ledger import CommLedger
from paracube.pipeline.schedules import Action
from paracube.pipeline.zero_bubble import WeightGradStore


@dataclass
class StepRecord:
    """What one rank did in one step: compute seconds per action kind, wall time."""

    busy: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "B": 0.0, "I": 0.0, "W": 0.0})
    counts: dict[str, int] = field(default_factory=lambda: {"F": 0, "B": 0, "I": 0, "W": 0})
    wall: float = 0.0

    @property
    def bubble(self) -> float:
        """Measured idle fraction of this rank: 1 − compute / wall."""
        return max(0.0, 1.0 - sum(self.busy.values()) / self.wall) if self.wall else 0.0

    def mean(self, kind: str) -> float:
        return self.busy[kind] / self.counts[kind] if self.counts[kind] else 0.0


class PipelineExecutor:
    """One rank of a ``p``-stage pipeline with ``v`` chunks per rank.

    Args:
        chunks: this rank's chunks, ``chunks[c]`` is virtual stage ``c·p + rank``.
        actions: this rank's schedule.
        peer: ``peer(pp_index) → global rank`` of the same (dp, tp) place on another stage.
        act_shape: shape of the activation sent between stages for one micro-batch.
        loss_fn: ``loss_fn(output, targets) → scalar`` on the last stage (already normalised).
        store: the zero-bubble weight-gradient store, for schedules with I/W actions.
    """

    def __init__(self, chunks, actions: list[Action], *, p: int, rank: int, peer, act_shape, dtype, device,
                 loss_fn, ledger: CommLedger | None = None, store: WeightGradStore | None = None, timeout_s=None):
        self.chunks, self.actions, self.p, self.rank = chunks, actions, p, rank
        self.v = len(chunks)
        self.last_stage = self.p * self.v - 1
        self.peer, self.act_shape, self.dtype, self.device = peer, tuple(act_shape), dtype, device
        self.loss_fn, self.ledger, self.store = loss_fn, ledger, store
        self.loss_dtype = torch.promote_types(torch.float32, dtype)  # fp32 at least, fp64 in fp64 runs

    def _stage(self, a: Action) -> int:
        return a.chunk * self.p + self.rank

    def _tag(self, direction: int, stage: int, mb: int) -> int:
        return (direction * (self.last_stage + 1) + stage) * 65536 + mb

    def _send(self, t: torch.Tensor, to_stage: int, tag: int, pending: list) -> None:
        t = t.detach().contiguous()
        pending.append((dist.isend(t, dst=self.peer(to_stage % self.p), tag=tag), t))
        if self.ledger is not None:
            self.ledger.record("send", "pp", t.numel() * t.element_size())

    def _recv(self, from_stage: int, tag: int) -> torch.Tensor:
        t = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        start = time.perf_counter()
        dist.recv(t, src=self.peer(from_stage % self.p), tag=tag)
        if self.ledger is not None:
            self.ledger.record("recv", "pp", t.numel() * t.element_size(), time.perf_counter() - start)
        return t

    def run(self, inputs: list, targets: list) -> tuple[torch.Tensor, StepRecord]:
        """Run the step's actions. ``inputs[mb]`` are used on stage 0, ``targets[mb]`` on
        the last stage. Returns the summed loss (zero off the last stage) and the record."""
        record, pending = StepRecord(), []
        saved: dict[tuple, tuple] = {}  # (mb, chunk) -> (input, output or loss)
        loss_sum = torch.zeros((), device=self.device, dtype=self.loss_dtype)
        start_step = time.perf_counter()
        for a in self.actions:
            s = self._stage(a)
            if a.kind == "F":
                x = inputs[a.mb] if s == 0 else self._recv(s - 1, self._tag(0, s - 1, a.mb)).requires_grad_()
                t0 = time.perf_counter()
                out = self.chunks[a.chunk](x)
                if s == self.last_stage:
                    out = self.loss_fn(out, targets[a.mb])
                    loss_sum += out.detach()
                else:
                    self._send(out, s + 1, self._tag(0, s, a.mb), pending)
                saved[(a.mb, a.chunk)] = (x, out)
            elif a.kind in ("B", "I"):
                x, out = saved[(a.mb, a.chunk)] if a.kind == "B" else saved[(a.mb, a.chunk)]
                grad = None if s == self.last_stage else self._recv(s + 1, self._tag(1, s + 1, a.mb))
                t0 = time.perf_counter()
                if a.kind == "I":
                    self.store.key = (a.mb, a.chunk)
                try:
                    torch.autograd.backward(out, grad)
                finally:
                    if self.store is not None:
                        self.store.key = None
                if s > 0:
                    self._send(x.grad, s - 1, self._tag(1, s, a.mb), pending)
                if a.kind == "B":
                    del saved[(a.mb, a.chunk)]
            else:  # W
                t0 = time.perf_counter()
                self.store.flush((a.mb, a.chunk))
                del saved[(a.mb, a.chunk)]
            record.busy[a.kind] += time.perf_counter() - t0
            record.counts[a.kind] += 1
        for work, _ in pending:
            work.wait()
        record.wall = time.perf_counter() - start_step
        return loss_sum, record

    @torch.no_grad()
    def forward_only(self, inputs: list, targets: list) -> torch.Tensor:
        """Evaluation: every micro-batch through every stage, no backward; chunk by chunk
        (all micro-batches of chunk 0, then chunk 1 …), which cannot deadlock."""
        pending: list = []
        loss_sum = torch.zeros((), device=self.device, dtype=self.loss_dtype)
        for c in range(self.v):
            s = c * self.p + self.rank
            for mb in range(len(inputs)):
                x = inputs[mb] if s == 0 else self._recv(s - 1, self._tag(2, s - 1, mb))
                out = self.chunks[c](x)
                if s == self.last_stage:
                    loss_sum += self.loss_fn(out, targets[mb])
                else:
                    self._send(out, s + 1, self._tag(2, s, mb), pending)
        for work, _ in pending:
            work.wait()
        return loss_sum
