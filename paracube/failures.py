"""Turning a collective that failed inside a step into one line naming who, when, where."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from paracube.errors import CollectiveTimeout


class PhaseLike(Protocol):
    """What :func:`name_failures` reads of a :class:`~paracube.metrics.PhaseTimer`."""

    @property
    def current(self) -> str | None: ...


@contextlib.contextmanager
def name_failures(rank: int, coords: dict[str, int], step: int, phase: PhaseLike) -> Iterator[None]:
    """Re-raise a RuntimeError (gloo/NCCL timeouts and peer failures surface as one) as a
    :class:`CollectiveTimeout`: ``rank 3 (pp=1 dp=0 tp=1) failed in step 12, phase
    backward: <the first line of the backend's message>``."""
    try:
        yield
    except RuntimeError as e:
        where = " ".join(f"{a}={i}" for a, i in coords.items())
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CollectiveTimeout(
            f"rank {rank} ({where}) failed in step {step}, phase {phase.current or 'between phases'}: {first}"
        ) from e
