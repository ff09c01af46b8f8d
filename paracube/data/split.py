"""How a global batch is split over the data-parallel ranks: evenly, by given weights
(``--dp-balance 1,3``), or by each replica's measured speed (``--dp-balance auto``).

The split changes *who* computes which sample, never *what* is computed: every rank still
takes a contiguous run of the same global batch (:meth:`ShardedBatchSampler.rows`), and
the loss is normalised by the global token count (:mod:`paracube.objective`), so the
summed gradient is the serial one whatever the shares. Every rank runs the same number of
micro-steps (``accum``) — the collectives of ZeRO-2/3 (one reduce-scatter per micro-step)
and of tensor parallelism stay in lockstep — and a rank's share is cut into ``accum``
micro-batches as even as possible: an uneven split means unequal micro-batch *sizes*.

Layout of one global batch of ``G`` windows, shares ``n_0 … n_{dp-1}`` (Σ n = G)::

    [ rank 0: n_0 windows | rank 1: n_1 windows | … ]   rank r's micro-step k: a slice of its run
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paracube.errors import ConfigError


@dataclass(frozen=True)
class DataSplit:
    """``shares[r]``: the windows of each global batch data-parallel rank ``r`` takes."""

    shares: tuple[int, ...]
    accum: int

    @classmethod
    def even(cls, dp: int, global_batch: int, accum: int) -> DataSplit:
        return cls((global_batch // dp,) * dp, accum)

    @classmethod
    def weighted(
        cls, weights: list[float], global_batch: int, accum: int, flag: str = "--dp-balance"
    ) -> DataSplit:
        """Shares proportional to ``weights`` (largest remainders), each at least ``accum``
        (one window per micro-step); refused, with the smallest global batch that works,
        when the batch is too small for that."""
        total = sum(weights)
        exact = [global_batch * w / total for w in weights]
        shares = [math.floor(x) for x in exact]
        by_remainder = sorted(range(len(weights)), key=lambda r: shares[r] - exact[r])
        for r in by_remainder[: global_batch - sum(shares)]:  # what rounding left, largest first
            shares[r] += 1
        if min(shares) < accum:
            need = math.ceil(accum * total / min(weights))
            raise ConfigError(
                f"{flag} {','.join(f'{w:g}' for w in weights)}: a global batch of {global_batch} "
                f"leaves a rank less than one window per micro-step (of {accum} a step): "
                f"use --global-batch ≥ {need}"
            )
        return cls(tuple(shares), accum)

    def check(self, dp: int, global_batch: int, accum: int) -> None:
        """Refuse a split that is not one of ``global_batch`` windows over ``dp`` ranks in
        ``accum`` micro-steps each, every micro-step at least one window."""
        if len(self.shares) != dp:
            problem = f"{len(self.shares)} shares for {dp} data-parallel ranks"
        elif sum(self.shares) != global_batch:
            problem = f"covers {sum(self.shares)} of the global batch's {global_batch} windows"
        elif self.accum != accum:
            problem = f"{self.accum} micro-steps, not the {accum} this run takes"
        elif min(self.shares) < accum:
            problem = f"a rank gets less than one window per micro-step ({min(self.shares)})"
        else:
            return
        raise ConfigError(f"data split {self.describe()}: {problem}")

    def rows(self, dp_rank: int, k: int) -> tuple[int, int]:
        """(first window, windows) of micro-step ``k`` of ``dp_rank`` in the global batch."""
        start = sum(self.shares[:dp_rank])
        base, extra = divmod(self.shares[dp_rank], self.accum)
        sizes = [base + (1 if i < extra else 0) for i in range(self.accum)]
        return start + sum(sizes[:k]), sizes[k]

    def describe(self) -> str:
        return " / ".join(str(n) for n in self.shares) + " windows"


def parse_weights(text: str, dp: int) -> list[float]:
    """``"1,3"`` → [1.0, 3.0]: one positive finite weight per data-parallel rank."""
    try:
        weights = [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--dp-balance {text!r}: give even, auto or one weight per data-parallel rank (1,3)"
        ) from None
    if len(weights) != dp:
        raise ConfigError(
            f"--dp-balance {text}: {len(weights)} weights for --dp {dp}: give one per rank"
        )
    if not all(0 < w < math.inf for w in weights):
        raise ConfigError(f"--dp-balance {text}: every weight must be a finite number > 0")
    return weights


class AutoBalance:
    """``--dp-balance auto``: every rank's compute seconds per window of the batch (from
    the per-step timings every rank already holds, :mod:`paracube.ranktimes`) → each
    replica's, its slowest rank's; after ``WINDOW`` steps, shares ∝ speed if that is predicted to shorten the slowest
    replica's compute by more than ``HYSTERESIS`` — so a noisy few percent never moves
    it, and every rank, seeing the same gathered floats, decides the same split.
    The first step (warm-up) is not measured."""

    WINDOW = 3
    HYSTERESIS = 0.10

    def __init__(self, split: DataSplit, replica_of: list[int]):
        self.split = split
        self.replica_of = replica_of  # global rank → its data-parallel rank
        self._per_window: list[list[float]] = []

    def update(self, step: int, per_window: list[float]) -> DataSplit | None:
        """After ``step`` with each rank's compute seconds per window it took
        (:func:`paracube.ranktimes.compute_per_window`): a new split, or None."""
        if step == 0:
            return None
        slowest = [0.0] * len(self.split.shares)  # a replica is as fast as its slowest rank
        for rank, seconds in enumerate(per_window):
            r = self.replica_of[rank]
            slowest[r] = max(slowest[r], seconds)
        self._per_window.append(slowest)
        if len(self._per_window) < self.WINDOW:
            return None
        per_window = [sum(col) / len(col) for col in zip(*self._per_window)]
        self._per_window.clear()
        speeds = [1 / t if t > 0 else 0.0 for t in per_window]
        if min(speeds) <= 0:
            return None
        batch = sum(self.split.shares)
        try:
            proposal = DataSplit.weighted(speeds, batch, self.split.accum)
        except ConfigError:
            return None  # the batch cannot be split that finely: keep the split
        now = max(n * t for n, t in zip(self.split.shares, per_window))
        then = max(n * t for n, t in zip(proposal.shares, per_window))
        if proposal == self.split or then > (1 - self.HYSTERESIS) * now:
            return None
        self.split = proposal
        return proposal
