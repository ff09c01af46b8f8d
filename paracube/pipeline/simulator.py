"""Run a schedule's action lists with costs instead of tensors: timeline, bubble, memory.

Dependencies (virtual stage ``s = chunk·p + rank``, ``S = p·v`` stages):
- ``F(mb, s)`` needs ``F(mb, s−1)`` (the activation from the previous stage);
- ``B(mb, s)`` / ``I(mb, s)`` need ``F(mb, s)`` and the input gradient of ``s+1``;
- ``W(mb, s)`` needs ``I(mb, s)``.
Each rank runs its list in order; an action starts when the rank is free and its
dependencies have finished (plus ``comm`` seconds when they come from another rank). A
list that can never finish is reported as a deadlock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paracube.pipeline.schedules import Action


@dataclass(frozen=True)
class Costs:
    """Duration of one action on a whole stage (a chunk costs 1/v of it). ``B = I + W``."""

    F: float = 1.0
    I: float = 1.0
    W: float = 1.0
    comm: float = 0.0

    def __post_init__(self) -> None:
        for name in ("F", "I", "W", "comm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"cost {name} must be a number, got {value!r}")
            if not 0 <= value < math.inf:
                raise ValueError(f"cost {name} must be finite and >= 0, got {value!r}")
        if self.F <= 0 or self.I + self.W <= 0:
            raise ValueError(
                f"a forward (F={self.F:g}) and a backward (I + W = {self.I + self.W:g}) must "
                "each cost more than 0"
            )

    @property
    def B(self) -> float:
        return self.I + self.W

    def of(self, a: Action, v: int = 1) -> float:
        return getattr(self, a.kind) / v


@dataclass
class Timeline:
    """The simulated run: ``events[rank] = [(action, start, end), ...]``."""

    p: int
    v: int
    events: list[list[tuple[Action, float, float]]] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(e[-1][2] for e in self.events if e)

    def busy(self, rank: int) -> float:
        return sum(end - start for _, start, end in self.events[rank])

    def idle(self, rank: int) -> float:
        return self.makespan - self.busy(rank)

    @property
    def bubble_fraction(self) -> float:
        """Idle time over total rank-time: (p−1)/(m+p−1) for GPipe and 1F1B at any costs."""
        return sum(self.idle(r) for r in range(self.p)) / (self.p * self.makespan)

    def peak_in_flight(self, rank: int) -> float:
        """Most micro-batches whose activations this rank holds at once (forward done,
        backward — or W for split schedules — not yet), in whole-stage micro-batch units."""
        live, peak = 0, 0
        split = any(a.kind == "W" for a, _, _ in self.events[rank])
        for a, _, _ in self.events[rank]:
            if a.kind == "F":
                live += 1
                peak = max(peak, live)
            elif a.kind == ("W" if split else "B"):
                live -= 1
        return peak / self.v


def stage_of(a: Action, rank: int, p: int) -> int:
    return a.chunk * p + rank


def _deps(a: Action, rank: int, p: int, v: int) -> list[tuple]:
    """Keys of the events ``a`` waits for: ("F", mb, stage) or ("G", mb, stage) = input
    gradient of that stage produced (by B or I)."""
    s, last = stage_of(a, rank, p), p * v - 1
    if a.kind == "F":
        return [("F", a.mb, s - 1)] if s > 0 else []
    if a.kind in ("B", "I"):
        return [("F", a.mb, s)] + ([("G", a.mb, s + 1)] if s < last else [])
    return [("G", a.mb, s)]  # W


def _produces(a: Action, rank: int, p: int) -> tuple:
    s = stage_of(a, rank, p)
    return (
        ("F", a.mb, s)
        if a.kind == "F"
        else ("G", a.mb, s)
        if a.kind in ("B", "I")
        else ("W", a.mb, s)
    )


def simulate(
    lists: list[list[Action]], costs: Costs | list[Costs] = Costs(), v: int = 1
) -> Timeline:
    """``costs``: one :class:`Costs` for every stage, or one per virtual stage (e.g. the
    per-action times a real run measured on each stage)."""
    p = len(lists)
    per_stage = costs if isinstance(costs, (list, tuple)) else [costs] * (p * v)
    if len(per_stage) != p * v:
        raise ValueError(f"need costs for {p * v} stages, got {len(per_stage)}")
    finished: dict[tuple, tuple[float, int]] = {}  # key -> (time, rank)
    free = [0.0] * p
    pos = [0] * p
    timeline = Timeline(p, v, [[] for _ in range(p)])
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(lists[r]):
                a = lists[r][pos[r]]
                deps = _deps(a, r, p, v)
                if any(d not in finished for d in deps):
                    break
                c = per_stage[stage_of(a, r, p)]
                ready = [
                    t + (c.comm if src != r else 0.0) for t, src in (finished[d] for d in deps)
                ]
                start = max([free[r], *ready])
                end = start + c.of(a, v)
                finished[_produces(a, r, p)] = (end, r)
                timeline.events[r].append((a, start, end))
                free[r] = end
                pos[r] += 1
                progress = True
    stuck = [r for r in range(p) if pos[r] < len(lists[r])]
    if stuck:
        waits = ", ".join(f"rank {r} at {lists[r][pos[r]]}" for r in stuck)
        raise RuntimeError(f"schedule deadlocks: {waits} wait forever")
    return timeline
