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

import contextlib
import time
from dataclasses import dataclass, field

import torch

from paracube import inject
from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.memory.activations import note_saved
from paracube.pipeline.schedules import Action
from paracube.weight_grad import WeightGradStore


@dataclass
class StepRecord:
    """What one rank did in one step.

    ``busy[kind]``: seconds from having an action's input to finishing it (compute, plus
    posting its send); ``waiting``: seconds blocked on a receive or on the other stages
    at the end of the step — the bubble; ``latency``: the shortest receive, an estimate of
    one transfer's time when the data was already on its way."""

    busy: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "B": 0.0, "I": 0.0, "W": 0.0})
    counts: dict[str, int] = field(default_factory=lambda: {"F": 0, "B": 0, "I": 0, "W": 0})
    waiting: float = 0.0
    latency: float = float("inf")
    wall: float = 0.0
    spans: list = field(default_factory=list)  # (kind, start, end) perf_counter seconds
    injected: float = 0.0  # seconds slept by an injected slow rank (paracube.inject)

    @property
    def bubble(self) -> float:
        """Measured idle fraction of this rank: time waiting for other stages / wall."""
        return self.waiting / self.wall if self.wall else 0.0

    def wait(self, seconds: float) -> None:
        self.waiting += seconds
        self.latency = min(self.latency, seconds)

    def mean(self, kind: str) -> float:
        return self.busy[kind] / self.counts[kind] if self.counts[kind] else 0.0


@dataclass
class _Step:
    """The state of one step in flight on this rank."""

    loss_sum: torch.Tensor  # the raw loss summed over the micro-batches (last stage)
    record: StepRecord = field(default_factory=StepRecord)
    pending: list = field(default_factory=list)  # started sends, waited at the end
    saved: dict[tuple, tuple] = field(default_factory=dict)  # (mb, chunk) -> (input, output)
    posted: dict[int, tuple] = field(default_factory=dict)  # receives posted ahead, by tag


class PipelineExecutor:
    """One rank of a ``p``-stage pipeline with ``v`` chunks per rank.

    Args:
        chunks: this rank's chunks, ``chunks[c]`` is virtual stage ``c·p + rank``.
        actions: this rank's schedule.
        group: the pipeline process group (``mesh.group("pp")``): transfers address the
            other stages by their index in it, and its timeout bounds every wait.
        act_shape: shape of the activation sent between stages for one micro-batch.
        loss_fn: ``loss_fn(output, targets) → summed loss`` on the last stage.
        loss_weight: ``loss_weight() → float``, what that sum is multiplied by before
            backward (loss scale ÷ global tokens: :mod:`paracube.objective`).
        store: the zero-bubble weight-gradient store, for schedules with I/W actions.
    """

    def __init__(
        self,
        chunks,
        actions: list[Action],
        *,
        p: int,
        rank: int,
        act_shape,
        dtype,
        device,
        loss_fn,
        loss_weight=lambda: 1.0,
        group=None,
        ledger: CommLedger | None = None,
        store: WeightGradStore | None = None,
    ):
        self.chunks, self.actions, self.p, self.rank = chunks, actions, p, rank
        self.v = len(chunks)
        self.last_stage = self.p * self.v - 1
        self.act_shape, self.dtype, self.device = tuple(act_shape), dtype, device
        self.loss_fn, self.loss_weight, self.ledger, self.store, self.group = (
            loss_fn,
            loss_weight,
            ledger,
            store,
            group,
        )
        # fp32 at least, fp64 in fp64 runs.
        self.loss_dtype = torch.promote_types(torch.float32, dtype)
        # _ahead[i]: the receive needed by the first action after i that needs one.
        self._ahead: list[tuple[int, int] | None] = []
        following: tuple[int, int] | None = None
        for a in reversed(actions):
            self._ahead.append(following)
            following = self._needs(a) or following
        self._ahead.reverse()

    def measure_latency(self, repeats: int = 5) -> float:
        """One activation transfer's seconds, from ping-pongs with the neighbouring stages
        (pairs (0,1), (2,3), … then (1,2), (3,4), …): the simulator's ``comm`` cost."""
        buf = torch.zeros(self.act_shape, dtype=self.dtype, device=self.device)
        times = []
        for offset in (0, 1):
            partner = self.rank + 1 if (self.rank - offset) % 2 == 0 else self.rank - 1
            if not 0 <= partner < self.p or (min(self.rank, partner) - offset) % 2:
                continue
            leader, g = self.rank < partner, self.group
            for i in range(repeats + 1):
                start = time.perf_counter()
                if leader:  # uncounted (no ledger): a measurement, not training traffic
                    ops.send(buf, partner, g, message=2**30 + i)
                    ops.recv(buf, partner, g, message=2**30 + i)
                else:
                    ops.recv(buf, partner, g, message=2**30 + i)
                    ops.send(buf, partner, g, message=2**30 + i)
                if i and leader:  # the first round trip warms the connection up
                    times.append((time.perf_counter() - start) / 2)
        ops.all_reduce(torch.zeros(1), self.group)  # both rounds done everywhere
        return sum(times) / len(times) if times else 0.0

    @property
    def _store(self) -> WeightGradStore:
        """The zero-bubble store (only schedules that split the backward have I/W actions)."""
        assert self.store is not None, "an I or W action needs a weight-gradient store"
        return self.store

    def _stage(self, a: Action) -> int:
        return a.chunk * self.p + self.rank

    def _tag(self, direction: int, stage: int, mb: int) -> int:
        return (direction * (self.last_stage + 1) + stage) * 65536 + mb

    def _send(self, t: torch.Tensor, to_stage: int, tag: int, pending: list) -> None:
        t = t.detach().contiguous()
        pending.append(
            ops.isend(t, to_stage % self.p, self.group, self.ledger, tag="pp", message=tag)
        )

    def _post_recv(self, from_stage: int, tag: int):
        t = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        return ops.irecv(t, from_stage % self.p, self.group, self.ledger, tag="pp", message=tag), t

    def _needs(self, a: Action) -> tuple[int, int] | None:
        """(source stage, tag) of the message action ``a`` waits for, if any."""
        s = self._stage(a)
        if a.kind == "F" and s > 0:
            return s - 1, self._tag(0, s - 1, a.mb)
        if a.kind in ("B", "I") and s < self.last_stage:
            return s + 1, self._tag(1, s + 1, a.mb)
        return None

    def _recv(
        self,
        from_stage: int,
        tag: int,
        record: StepRecord | None = None,
        posted: dict | None = None,
    ):
        """The message ``tag`` — from a receive posted ahead of time (see :meth:`run`) or now."""
        work, t = posted.pop(tag) if posted and tag in posted else self._post_recv(from_stage, tag)
        start = time.perf_counter()
        try:
            work.wait()
        except RuntimeError as e:  # timeout, or the other stage died: say who waited for what
            direction = tag // (65536 * (self.last_stage + 1))
            what = ("activation", "gradient", "evaluation activation")[direction]
            raise RuntimeError(
                f"pipeline stage {from_stage + (1 if direction != 1 else -1)} (pp rank {self.rank}) waited in vain for "
                f"the {what} of micro-batch {tag % 65536} from stage {from_stage} (pp rank {from_stage % self.p}): "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            ) from e
        if record is not None:
            record.wait(time.perf_counter() - start)
        return t

    def run(self, inputs: list, targets: list) -> tuple[torch.Tensor, StepRecord]:
        """Run the step's actions. ``inputs[mb]`` are used on stage 0, ``targets[mb]`` on
        the last stage. Returns the raw summed loss (on every stage) and the record."""
        step = _Step(torch.zeros((), device=self.device, dtype=self.loss_dtype))
        self._start_together()
        start_step = time.perf_counter()
        weight = self.loss_weight()
        for a, ahead in zip(self.actions, self._ahead):
            # Post the receive of the next action that needs one now, so its transfer
            # overlaps this action's compute instead of starting when it is needed.
            if ahead is not None and ahead[1] not in step.posted:
                step.posted[ahead[1]] = self._post_recv(*ahead)
            # An injected slow rank sleeps in place: before the action's send and after it
            # (paracube.inject), so its outputs leave as late as a slower device's would.
            slept = inject.slept()
            inject.start_compute()
            if a.kind == "F":
                busy = self._forward(a, step, inputs, targets[a.mb], weight)
            elif a.kind in ("B", "I"):
                busy = self._backward(a, step)
            else:  # W: the deferred weight gradients of a finished I
                t0 = time.perf_counter()
                self._store.flush((a.mb, a.chunk))
                del step.saved[(a.mb, a.chunk)]
                busy = time.perf_counter() - t0
            inside = inject.slept()  # what slept before a send is inside ``busy`` already
            inject.stop_compute()
            busy += inject.slept() - inside
            step.record.injected += inject.slept() - slept
            end = time.perf_counter()
            step.record.spans.append((a.kind, end - busy, end))
            step.record.busy[a.kind] += busy
            step.record.counts[a.kind] += 1
        # The loss lives on the last stage; summing it over the pipeline group is also the
        # moment all stages are done, so every rank's wall time is the pipeline's makespan.
        end_wait = time.perf_counter()
        for handle in step.pending:
            handle.wait()
        ops.all_reduce(step.loss_sum, self.group, self.ledger, tag="loss")
        step.record.waiting += time.perf_counter() - end_wait
        step.record.wall = time.perf_counter() - start_step
        return step.loss_sum, step.record

    def _start_together(self) -> None:
        """Start all stages together, so that what a rank waits for in the step is the
        schedule's bubble, not the previous step's optimizer finishing at different times."""
        try:
            ops.all_reduce(
                torch.zeros(1, device=self.device), self.group, self.ledger, tag="pp_sync"
            )
        except RuntimeError as e:
            raise RuntimeError(
                f"pipeline stage {self.rank} (pp rank {self.rank}) waited in vain for the other "
                f"stages to start the step: {str(e).strip().splitlines()[0]}"
            ) from e

    def _forward(self, a: Action, step: _Step, inputs: list, target, weight) -> float:
        """Forward of micro-batch ``a.mb`` on chunk ``a.chunk``; returns the busy seconds."""
        s = self._stage(a)
        if s == 0:
            x = inputs[a.mb]
        else:
            tag = self._tag(0, s - 1, a.mb)
            x = self._recv(s - 1, tag, step.record, step.posted).requires_grad_()
        t0 = time.perf_counter()
        out = self.chunks[a.chunk](x)
        if s == self.last_stage:
            raw = self.loss_fn(out, target)
            step.loss_sum += raw.detach()
            out = raw * weight
        else:
            self._send(out, s + 1, self._tag(0, s, a.mb), step.pending)
        # A received activation is a leaf that requires grad, which the activation counter
        # takes for a parameter: charge it explicitly while it is kept.
        step.saved[(a.mb, a.chunk)] = (x, out, note_saved(x) if s > 0 else ())
        return time.perf_counter() - t0

    def _backward(self, a: Action, step: _Step) -> float:
        """Backward (B), or its input-gradient half (I, weight gradients deferred to W)."""
        s = self._stage(a)
        x, out, _ = step.saved[(a.mb, a.chunk)]
        grad = None
        if s < self.last_stage:
            grad = self._recv(s + 1, self._tag(1, s + 1, a.mb), step.record, step.posted)
        t0 = time.perf_counter()
        deferring = a.kind == "I"
        with self._store.deferring((a.mb, a.chunk)) if deferring else contextlib.nullcontext():
            torch.autograd.backward(out, grad)
        if s > 0:
            self._send(x.grad, s - 1, self._tag(1, s, a.mb), step.pending)
        if not deferring:
            del step.saved[(a.mb, a.chunk)]
        return time.perf_counter() - t0

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
        for handle in pending:
            handle.wait()
        ops.all_reduce(loss_sum, self.group, self.ledger, tag="eval")
        return loss_sum
