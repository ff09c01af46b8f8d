"""Every rank's timings of every step, gathered, and the straggler watch on top of them.

After each step a rank packs its phase times into a few floats (:data:`FIELDS`) and one
all-gather over the world (tag ``timing``, counted like every collective) gives every
rank all of them; rank 0 writes them into the step's metrics record as
``"ranks": {"forward": [rank 0, rank 1, …], …}`` — so one file holds the whole job.

Compute of a rank = forward + backward − its tensor-parallel waits (those are inside the
forward and backward phases) + optimizer. A rank whose compute per window of the batch
(so that a larger share under ``--dp-balance`` is not taken for slowness) stays above the
median of the other ranks of its pipeline stage by more than the threshold for
:data:`PATIENCE` steps in a row is a straggler: named once when it starts, counted until
it ends, and listed in the run's summary.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the gather alone needs torch: diagnose reads the records without it
    from paracube.comm.ledger import CommLedger

# One step of one rank: seconds of each.
FIELDS = (
    "step_time",  # the step's wall time on this rank, up to the gather
    "data",  # waited for its micro-batches
    "forward",
    "backward",
    "optimizer",
    "comm_exposed",  # waited for data-parallel gradients and the loss
    "bubble",  # pipeline: waited for other stages (includes the p2p transfers)
    "comm_tp",  # tensor-parallel collectives (inside forward and backward)
    "comm_pp",  # pipeline p2p transfers: receives × the shortest receive (inside bubble)
    "injected",  # slept by an injected fault (--inject), inside the phases above
    "windows",  # sequences of the global batch this rank computed (its replica's share)
)

# What each collective's tag belongs to (the tp waits sit inside forward and backward).
TP_TAGS = ("tp", "tp_loss", "sp_grad")

PATIENCE = 5  # steps in a row above the threshold before a rank is named


def rank_vector(
    seconds: dict[str, float],
    step_time: float,
    ledger: CommLedger,
    pipeline: dict | None,
    injected: float,
    windows: int,
) -> list[float]:
    """This rank's :data:`FIELDS` for the step just run."""
    tp = sum(ledger.total(tag=t).seconds for t in TP_TAGS)
    pp = 0.0
    if pipeline is not None:
        receives = ledger.total(kind="recv", tag="pp").calls
        pp = min(seconds.get("bubble", 0.0), receives * pipeline.get("p2p_latency", 0.0))
    values = {
        **seconds,
        "step_time": step_time,
        "comm_tp": tp,
        "comm_pp": pp,
        "injected": injected,
        "windows": windows,
    }
    return [float(values.get(name, 0.0)) for name in FIELDS]


def gather(vector: list[float], ledger: CommLedger, device=None) -> dict[str, list[float]]:
    """All ranks' vectors (one all-gather over the world) as ``{field: [per rank]}``."""
    import torch

    from paracube.comm import ops

    mine = torch.tensor(vector, dtype=torch.float64, device=device)
    world = ops.group_size(None)
    out = torch.empty(world * len(vector), dtype=torch.float64, device=device)
    if world == 1:
        out.copy_(mine)
    else:
        ops.all_gather_into(out, mine, None, ledger, tag="timing")
    table = out.view(world, len(vector)).t().tolist()
    return {name: [round(v, 6) for v in row] for name, row in zip(FIELDS, table)}


def compute_seconds(ranks: dict[str, list[float]]) -> list[float]:
    """Each rank's compute: forward + backward − tp waits + optimizer."""
    return [
        f + b - tp + o
        for f, b, tp, o in zip(
            ranks["forward"], ranks["backward"], ranks["comm_tp"], ranks["optimizer"]
        )
    ]


def compute_per_window(ranks: dict[str, list[float]]) -> list[float]:
    """Each rank's compute per window of the global batch it took (a record written
    before the windows were recorded: per step)."""
    compute = compute_seconds(ranks)
    windows = ranks.get("windows") or [1.0] * len(compute)
    return [c / w if w > 0 else c for c, w in zip(compute, windows)]


def relative_to_peers(compute: list[float], group: list[int], r: int) -> float:
    """Rank ``r``'s compute over the median of the others in its ``group``."""
    median = statistics.median(compute[p] for p in group if p != r)
    return compute[r] / median if median > 0 else 1.0


@dataclass
class Straggler:
    rank: int
    where: str  # "pp=0 dp=1 tp=0, host h"
    first_step: int
    steps: int = 0
    ratio: float = 0.0  # compute / peers' median, the latest

    def line(self) -> str:
        return (
            f"rank {self.rank} ({self.where}) is {self.ratio:.1f}x as slow as the median of "
            f"the other ranks of its stage for {self.steps} steps (since step {self.first_step})"
        )


class StragglerWatch:
    """Names ranks whose compute per window stays above their peers' median by more than
    ``threshold`` (0.10: 10 %) for :data:`PATIENCE` steps."""

    def __init__(self, peers: list[list[int]], where: list[str], threshold: float = 0.10):
        self.peers, self.where, self.threshold = peers, where, threshold
        self.streak: dict[int, int] = {}
        self.active: dict[int, Straggler] = {}
        self.seen: list[Straggler] = []

    def update(self, step: int, ranks: dict[str, list[float]]) -> list[Straggler]:
        """This step's timings; returns the stragglers named for the first time now."""
        compute = compute_per_window(ranks)
        new = []
        for group in self.peers:
            if len(group) < 2:
                continue  # no peer doing the same work to compare with
            for r in group:
                ratio = relative_to_peers(compute, group, r)
                if ratio > 1 + self.threshold:
                    self.streak[r] = self.streak.get(r, 0) + 1
                else:
                    self.streak[r] = 0
                    self.active.pop(r, None)
                if self.streak[r] >= PATIENCE:
                    if r not in self.active:
                        s = Straggler(r, self.where[r], step - PATIENCE + 1, PATIENCE - 1)
                        self.active[r] = s
                        self.seen.append(s)
                        new.append(s)
                    self.active[r].steps += 1
                    self.active[r].ratio = ratio
        return new
