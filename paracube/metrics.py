"""Step metrics: a phase timer and the per-step record (written by :mod:`paracube.outputs`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from paracube import inject

PHASES = ("data", "forward", "backward", "comm_exposed", "optimizer")
COMPUTE = ("forward", "backward", "optimizer")  # what an injected slow rank slows


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase of one step, and the phases' spans
    (``(name, start, end)``, seconds from the timer's start) for a step's timeline.

    ``sync`` waits for the device (``torch.cuda.synchronize`` on a GPU): a CUDA kernel is
    queued and returns at once, so without it a phase measures the launching, and its
    kernels' time lands in whichever later phase first waits for a result (Megatron-LM's
    timers synchronize the same way). A CPU rank computes as it goes: None."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.current: str | None = None  # the phase running now (named in error messages)
        self.origin = time.perf_counter()
        self.spans: list[tuple[str, float, float]] = []
        self.injected = 0.0  # seconds slept by an injected fault (paracube.inject)

    @contextmanager
    def phase(self, name: str):
        """Time ``name``. A compute phase runs the injected slow rank's compute clock
        (:mod:`paracube.inject`): its waits for peers inside the phase are not slowed
        (slowing a wait for the other ranks by a factor would feed on itself)."""
        if self.sync is not None:
            self.sync()  # what earlier phases queued is theirs
        start = time.perf_counter()
        self.current = name
        slept = inject.slept()
        if name in COMPUTE:
            inject.start_compute()
        try:
            yield
            if self.sync is not None:
                self.sync()  # not after a failure: waiting on a broken device would mask it
            self.current = None  # on an exception it stays: the error names the phase
        finally:
            if name in COMPUTE:
                inject.stop_compute()
            self.injected += inject.slept() - slept
            end = time.perf_counter()
            self.seconds[name] = self.seconds.get(name, 0.0) + end - start
            self.spans.append((name, start - self.origin, end - self.origin))

    @contextmanager
    def label(self, name: str):
        """Name the phase running now (for error messages) without timing it: the pipeline
        schedule, whose time the executor splits into forward, backward and bubble."""
        self.current = name
        yield
        self.current = None

    def move(self, seconds: float, *, src: str, dst: str) -> None:
        """Re-attribute time, e.g. gradient waits that happened inside backward."""
        self.seconds[src] -= seconds
        self.seconds[dst] += seconds


@dataclass
class StepMetrics:
    """One optimizer step, as written to the metrics file (one JSON object per line).

    ``loss`` is the mean next-token loss over the whole global batch (all data-parallel
    ranks, all micro-steps) — the number a serial run on the same batch reports.
    ``time`` splits the step's wall time on rank 0; ``comm`` counts collectives by kind.
    """

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    step_time: float
    tokens_per_s: float
    time: dict[str, float] = field(default_factory=dict)
    comm: dict[str, dict] = field(default_factory=dict)
    pipeline: dict | None = None  # schedule, measured and formula bubble, seconds per action
    memory: dict[str, int] | None = (
        None  # bytes per rank: weights, gradients, optimizer, activations_peak
    )
    skipped: bool | None = None  # fp16: the step was skipped on a gradient overflow
    loss_scale: float | None = None  # fp16: the loss scale this step used
    val_loss: float | None = None
    # Every rank's timings of this step ({field: [per rank]}, paracube.ranktimes).
    ranks: dict[str, list[float]] | None = None
    stragglers: list[dict] | None = None  # ranks named slow, as of this step
    run: dict | None = None  # the first record of a run: model, layout, ranks' places
    timeline: dict | None = None  # the last record: one step's phases on every rank
    # windows of this step's global batch per data-parallel rank (when not split evenly)
    dp_split: list[int] | None = None
    dp_split_changed: bool | None = None  # --dp-balance auto chose a new split after this step
    # --dp-mode ps: this worker's applied gradient was this many other updates late, and
    # the server's version after it (the worker's step counts its own pushes only)
    staleness: int | None = None
    ps_version: int | None = None
    ps_staleness: dict[int, int] | None = None  # the last record: pushes applied per staleness

    def to_json(self) -> str:
        record = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(record, separators=(",", ":"))


def read_metrics(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
