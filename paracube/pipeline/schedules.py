"""Pipeline schedules as data, and the registry that owns every fact about them.

An :class:`Action` is ``F`` (forward), ``B`` (full backward), or, for schedules that
split the backward, ``I`` (input gradient) and ``W`` (weight gradient), of micro-batch
``mb`` on one of the rank's model chunks ``chunk``. Communication is implied by the
stage graph and done by the executor: the forward of virtual stage ``s`` receives from
``s−1`` and sends to ``s+1``, the backward the other way. With ``v`` chunks per rank,
virtual stage ``s = chunk·p + rank`` (Narayanan et al. 2021, §2.2).

Each schedule is one :class:`Schedule` object in :data:`SCHEDULES`: how to build each
rank's action list, which (p, m, v) it accepts, whether it splits the backward, how many
micro-batches of activations a stage holds at its peak, and its idle time per rank — the
bubble formula. The executor, the simulator, the partitioner, the planner and the command
line all ask the registry, and the tests are parametrised over it, so a schedule added
here is run, simulated, planned and tested everywhere. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.errors import ConfigError

# p·m·v (stage passes of a micro-batch per step) bounds one step's action lists — every
# rank's is about 3·m·v long, and the simulator and the picture handle them all: beyond
# this a step is a typo, not a pipeline.
MAX_STAGE_PASSES = 100_000


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "I" or "W"
    mb: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


class Schedule:
    """One pipeline schedule. Subclasses give :meth:`rank_actions` and the formulas.

    Costs below are per whole stage (a chunk costs 1/v of it): ``F`` forward, ``I`` the
    input-gradient pass, ``W`` the weight-gradient pass, ``B = I + W``.
    """

    name: str = ""
    reference: str = ""
    splits_backward = False  # actions I and W instead of B: needs deferrable weight gradients
    chunked = False  # v ≥ 2 virtual chunks per rank
    needs_m_at_least_p = False  # fewer micro-batches than stages cannot fill the warm-up
    dominated_by: str | None = None  # another schedule with the same bubble and less memory
    shrinks_as = "(p−1)/m"  # idle_over_busy in words: how more micro-batches shrink the bubble

    def rank_actions(self, p: int, m: int, v: int, rank: int) -> list[Action]:
        raise NotImplementedError

    def idle_per_rank(
        self, p: int, m: int, v: int = 1, F: float = 1.0, I: float = 1.0, W: float = 1.0
    ) -> float:
        """Seconds each rank waits in one step when every stage is equally loaded."""
        raise NotImplementedError

    def in_flight(self, p: int, m: int, v: int = 1, stage: int = 0) -> float:
        """Micro-batches whose activations ``stage`` holds at its peak (in whole-stage units)."""
        raise NotImplementedError

    # -- derived, the same for every schedule ----------------------------------------------

    def check(self, p: int, m: int, v: int = 1) -> None:
        """Refuse a (p, m, v) this schedule cannot run — before any collective."""
        for flag, value in (("--pp", p), ("--microbatches", m), ("--chunks", v)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{flag} must be ≥ 1, got {value!r}")
        if p * m * v > MAX_STAGE_PASSES:
            raise ConfigError(
                f"--pp {p} × --microbatches {m} × --chunks {v} = {p * m * v:,} stage passes per step, "
                f"over the limit of {MAX_STAGE_PASSES:,}: use fewer stages or micro-batches"
            )
        if self.chunked:
            if v < 2:
                raise ConfigError(f"{self.name} needs --chunks ≥ 2 (virtual stages per rank)")
            if m % p:
                raise ConfigError(
                    f"{self.name} needs --microbatches a multiple of --pp: {m} is not a multiple of {p}"
                )
        elif v != 1:
            chunked = ", ".join(n for n, s in SCHEDULES.items() if s.chunked)
            raise ConfigError(
                f"--chunks {v} needs --schedule {chunked} ({self.name} runs one chunk per rank)"
            )
        if self.needs_m_at_least_p and m < p:
            raise ConfigError(
                f"{self.name} needs at least as many micro-batches as stages: --microbatches {m} < --pp {p}"
            )

    def why_not(self, p: int, m: int, v: int = 1) -> str | None:
        """Why :meth:`check` refuses (p, m, v); None where it runs."""
        try:
            self.check(p, m, v)
        except ConfigError as e:
            return str(e)
        return None

    def dominated_at(self, p: int, m: int) -> bool:
        """Whether the schedule that dominates this one (the same bubble, less memory) runs at
        (p, m): only then is this one not worth planning unless asked for. With fewer
        micro-batches than stages 1F1B does not run and GPipe, which does, is the choice.

        >>> get_schedule("gpipe").dominated_at(4, 8), get_schedule("gpipe").dominated_at(8, 2)
        (True, False)
        """
        return self.dominated_by is not None and SCHEDULES[self.dominated_by].why_not(p, m) is None

    def build(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        """The action list of every rank, ``[rank][i]``."""
        self.check(p, m, v)
        return [self.rank_actions(p, m, v, r) for r in range(p)]

    def bubble_fraction(
        self, p: int, m: int, v: int = 1, F: float = 1.0, I: float = 1.0, W: float = 1.0
    ) -> float:
        """Idle over total rank-time, the published formula (unit costs by default)."""
        idle = self.idle_per_rank(p, m, v, F, I, W)
        return idle / (idle + m * (F + I + W))

    def idle_over_busy(
        self, p: int, m: int, v: int = 1, F: float = 1.0, I: float = 1.0, W: float = 1.0
    ) -> float:
        """What the bubble adds to a stage's compute (the planner's term): the idle over the
        m micro-batches' F + I + W — at unit costs unless a stage's own pass costs are given,
        which only a schedule that splits the backward tells apart."""
        return self.idle_per_rank(p, m, v, F, I, W) / (m * (F + I + W))


class GPipe(Schedule):
    """All forwards, then all backwards; every stage holds all m micro-batches."""

    name, reference = "gpipe", "Huang et al. 2019"
    dominated_by: str | None = "1f1b"

    def rank_actions(self, p, m, v, rank):
        return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]

    def idle_per_rank(self, p, m, v=1, F=1.0, I=1.0, W=1.0):
        return (p - 1) * (F + I + W)  # bubble (p−1)/(m+p−1)

    def in_flight(self, p, m, v=1, stage=0):
        return float(m) if p > 1 else 1.0


class OneFOneB(GPipe):
    """PipeDream-Flush: p−r−1 warm-up forwards, one forward / one backward, cool-down
    backwards; stage r holds at most p−r micro-batches. Same bubble as GPipe."""

    name, reference = "1f1b", "Narayanan et al. 2021"
    needs_m_at_least_p = True
    dominated_by = None

    def rank_actions(self, p, m, v, rank):
        warmup = min(p - rank - 1, m)
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action("F", warmup + i), Action("B", i)]
        return acts + [Action("B", i) for i in range(m - warmup, m)]

    def in_flight(self, p, m, v=1, stage=0):
        return float(min(p - stage, m)) if p > 1 else 1.0


class Interleaved(Schedule):
    """Megatron's interleaved 1F1B over v chunks per rank, micro-batches in groups of p:
    the k-th forward is micro-batch ``(k // (p·v))·p + k % p`` on chunk ``(k // p) % v``;
    backwards walk the chunks in reverse; warm-up ``2(p−r−1) + (v−1)·p`` forwards.
    Bubble (p−1)/(v·m + p−1)."""

    name, reference = "interleaved-1f1b", "Narayanan et al. 2021, §2.2"
    chunked = True
    shrinks_as = "(p−1)/(v·m)"

    def rank_actions(self, p, m, v, rank):
        total = m * v

        def fwd(k: int) -> Action:
            return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

        def bwd(k: int) -> Action:
            return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        acts = [fwd(k) for k in range(warmup)]
        for i in range(total - warmup):
            acts += [fwd(warmup + i), bwd(i)]
        return acts + [bwd(k) for k in range(total - warmup, total)]

    def idle_per_rank(self, p, m, v=1, F=1.0, I=1.0, W=1.0):
        return (p - 1) * (F + I + W) / v

    def in_flight(self, p, m, v=1, stage=0):
        """Stage r's warm-up of 2(p−r−1) + (v−1)·p forwards plus the steady state's one,
        each a chunk (1/v of the stage), capped by the m·v there are: p·(1 + (p−1)/(p·v)) on
        the first stage (Korthikanti et al. 2022, Eq. 5)."""
        if p == 1:
            return 1.0
        return min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v) / v


class ZeroBubbleH1(Schedule):
    """Zero-bubble H1 (Qi et al. 2024, §3.1): the backward split into I (on the critical
    path) and W (free to move). Rank r warms up with p−r forwards, then repeats I(k),
    W(k−r), F; the deferred W's fill the time 1F1B spends waiting. Idle per rank
    (p−1)(F+I−W) against 1F1B's (p−1)(F+I+W); at most p micro-batches in flight."""

    name, reference = "zb-h1", "Qi et al. 2024"
    splits_backward = True
    # F, I, W: a block's forward, input-gradient and weight-gradient passes; (p−1)/(3m) when
    # they cost the same
    shrinks_as = "(p−1)·(F+I−W)/((F+I+W)·m)"
    needs_m_at_least_p = True

    def rank_actions(self, p, m, v, rank):
        warmup = min(p - rank, m)
        acts = [Action("F", i) for i in range(warmup)]
        next_f, next_w = warmup, 0
        for k in range(m):
            acts.append(Action("I", k))
            if k >= rank:
                acts.append(Action("W", next_w))
                next_w += 1
            if next_f < m:
                acts.append(Action("F", next_f))
                next_f += 1
        return acts + [Action("W", i) for i in range(next_w, m)]

    def idle_per_rank(self, p, m, v=1, F=1.0, I=1.0, W=1.0):
        return (p - 1) * (F + I - W)

    def in_flight(self, p, m, v=1, stage=0):
        return float(min(p, m)) if p > 1 else 1.0


SCHEDULES: dict[str, Schedule] = {
    s.name: s for s in (GPipe(), OneFOneB(), Interleaved(), ZeroBubbleH1())
}


def get_schedule(name: str) -> Schedule:
    """The registered schedule ``name``, or a one-line refusal naming the choices."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def check_schedule(name: str, p: int, m: int, v: int = 1) -> None:
    get_schedule(name).check(p, m, v)


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """The action list of every rank of schedule ``name``, ``[rank][i]``."""
    return get_schedule(name).build(p, m, v)
