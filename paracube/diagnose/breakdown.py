"""The loss-of-scaling breakdown: a step's time split into what it was spent on, per rank,
adding up to the measured step.

Per rank and step (:data:`paracube.ranktimes.FIELDS`)::

    step = data + compute + tp + dp/exposed + pp + bubble + straggler + optimizer + other

- compute = forward + backward − tp waits; of it, ``small_batch`` is what a larger
  micro-batch would have saved (a measured per-token efficiency, :mod:`.efficiency`);
- straggler = the time this rank waited for the slowest of its peers (the ranks of the
  same pipeline stage): ``max(peer work) − own work``, taken out of the waits it shows up
  in (exposed gradient/loss communication first, then the bubble);
- comm_pp = the pipeline's p2p transfers (inside the measured bubble);
- other = the remainder (Python between phases) and the timing gather (measured on rank 0).

The figures are means over ranks and over the steps after the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paracube.diagnose.records import Run
from paracube.ranktimes import compute_per_window, compute_seconds, relative_to_peers

PARTS = (
    "compute",
    "small_batch",
    "data",
    "comm_dp",
    "comm_tp",
    "comm_pp",
    "bubble",
    "straggler",
    "optimizer",
    "other",
)
# What counts as lost to scaling (compute and the optimizer are the work itself).
LOSSES = ("small_batch", "data", "comm_dp", "comm_tp", "comm_pp", "bubble", "straggler")


@dataclass
class Breakdown:
    step_time: float  # the measured step (mean over ranks and steady steps)
    parts: dict[str, float]  # PARTS, seconds per step, summing to step_time
    per_rank: list[dict[str, float]]  # the same per rank
    slowest: int  # the rank with the most compute relative to its peers
    slowest_ratio: float
    steps: int  # steady steps averaged
    notes: list[str] = field(default_factory=list)

    def share(self, part: str) -> float:
        return self.parts[part] / self.step_time if self.step_time else 0.0


def breakdown(run: Run, peers: list[list[int]], small_batch_fraction: float | None) -> Breakdown:
    """``peers``: groups of ranks doing the same work (one per pipeline stage);
    ``small_batch_fraction``: the share of compute a larger micro-batch saves (None: not
    measured)."""
    world = run.world
    sums = [dict.fromkeys(PARTS, 0.0) for _ in range(world)]
    stepsum = [0.0] * world
    ratios = [0.0] * world
    steady = run.steady()
    for record in steady:
        ranks = record["ranks"]
        # The timing gather itself ran after the figures were taken: rank 0 measured it
        # (its whole step minus the step it reported); every rank paid about the same.
        gather = max(record["step_time"] - ranks["step_time"][0], 0.0)
        compute = compute_seconds(ranks)
        speed = compute_per_window(ranks)  # who is slow: per window, whatever the split
        work = [c + d for c, d in zip(compute, ranks["data"])]
        for group in peers:
            slowest = max(work[r] for r in group)
            for r in group:
                ratios[r] += relative_to_peers(speed, group, r) if len(group) > 1 else 1.0
                _one_rank(sums[r], ranks, r, compute[r], slowest - work[r], small_batch_fraction)
                sums[r]["other"] += gather
                stepsum[r] += ranks["step_time"][r] + gather
    n = len(steady)
    per_rank = [{k: v / n for k, v in s.items()} for s in sums]
    parts = {k: sum(p[k] for p in per_rank) / world for k in PARTS}
    ratios = [r / n for r in ratios]
    slowest = max(range(world), key=lambda r: ratios[r])
    notes = []
    if small_batch_fraction is None:
        notes.append("small-batch inefficiency not measured (it is counted as compute)")
    return Breakdown(sum(stepsum) / world / n, parts, per_rank, slowest, ratios[slowest], n, notes)


def _one_rank(acc: dict, ranks: dict, r: int, compute: float, wait: float, small: float | None):
    exposed, bubble, pp = ranks["comm_exposed"][r], ranks["bubble"][r], ranks["comm_pp"][r]
    bubble -= pp
    from_exposed = min(max(wait, 0.0), exposed)
    from_bubble = min(max(wait, 0.0) - from_exposed, max(bubble, 0.0))
    optimizer = ranks["optimizer"][r]
    kernel = compute - optimizer  # forward + backward − tp
    lost = kernel * small if small else 0.0
    acc["compute"] += compute - lost
    acc["small_batch"] += lost
    acc["data"] += ranks["data"][r]
    acc["comm_dp"] += exposed - from_exposed
    acc["comm_tp"] += ranks["comm_tp"][r]
    acc["comm_pp"] += pp
    acc["bubble"] += bubble - from_bubble
    acc["straggler"] += from_exposed + from_bubble
    acc["optimizer"] += optimizer
    counted = (
        ranks["data"][r] + ranks["forward"][r] + ranks["backward"][r] + optimizer + exposed
        + ranks["bubble"][r]
    )  # fmt: skip
    acc["other"] += ranks["step_time"][r] - counted
    acc["compute"] -= optimizer  # the optimizer is its own part


def peer_groups(header: dict, world: int) -> list[list[int]]:
    """Ranks of the same pipeline stage (from the run's recorded coordinates)."""
    coords = header.get("coords")
    if not coords:
        return [list(range(world))]
    groups: dict[int, list[int]] = {}
    for r, c in enumerate(coords):
        groups.setdefault(c["pp"], []).append(r)
    return list(groups.values())
