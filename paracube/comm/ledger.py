"""One place that counts every collective: calls, bytes and time, per kind and axis.

Bytes are the payload of the tensor handed to the collective (``numel × element size``),
the quantity the planner's formulas are written in; the wire traffic of a ring algorithm
is ``2(p−1)/p`` of it for all-reduce (docs/formulas.md, "Communication volume"). Time is the
time the caller *waited*: for an asynchronous collective that is only the exposed part,
the rest was hidden behind computation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class CommCount:
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


class CommLedger:
    """Counts collectives by ``(kind, tag)``, e.g. ``("all_reduce", "grad")``.

    ``tag`` says what the traffic is for (``grad``, ``loss``, ``broadcast`` …) so that a
    test can check, for instance, that gradient bytes per step equal the parameter bytes.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], CommCount] = defaultdict(CommCount)

    def record(
        self, kind: str, tag: str, nbytes: int, seconds: float = 0.0, calls: int = 1
    ) -> None:
        c = self._counts[(kind, tag)]
        c.calls += calls
        c.bytes += nbytes
        c.seconds += seconds

    def add_time(self, kind: str, tag: str, seconds: float) -> None:
        self._counts[(kind, tag)].seconds += seconds

    def total(self, *, kind: str | None = None, tag: str | None = None) -> CommCount:
        out = CommCount()
        for (k, t), c in self._counts.items():
            if (kind is None or k == kind) and (tag is None or t == tag):
                out.calls += c.calls
                out.bytes += c.bytes
                out.seconds += c.seconds
        return out

    def snapshot(self) -> dict[str, dict]:
        """Plain-dict copy, ``{"all_reduce/grad": {"calls", "bytes", "seconds"}}``."""
        return {f"{k}/{t}": vars(c).copy() for (k, t), c in sorted(self._counts.items())}

    def reset(self) -> None:
        self._counts.clear()
