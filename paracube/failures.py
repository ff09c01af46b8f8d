"""A rank that fails ends the job, in one line naming who failed, when, where and why.

:func:`name_failures` turns a collective's RuntimeError (a gloo/NCCL timeout, a peer that
closed its connection) into a :class:`~paracube.errors.CollectiveTimeout` naming this
rank, its coordinates, the step and phase, and — from the :mod:`paracube.heartbeat`
records — the peer that stopped answering. :func:`end_stalled_peers` then kills the
frozen peers on this host: the launcher's agent would otherwise wait 30 s for a stopped
process to honour its SIGTERM before killing it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Protocol

from paracube.errors import CollectiveTimeout
from paracube.heartbeat import Heartbeat, describe


class PhaseLike(Protocol):
    """What :func:`name_failures` reads of a :class:`~paracube.metrics.PhaseTimer`."""

    @property
    def current(self) -> str | None: ...


def backend_message(error: BaseException) -> str:
    """The backend's first sentence, without gloo's ``[file.cc:123]`` prefix and advice:
    ``Read error [127.0.0.1]:22169: Connection reset by peer``."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    first = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", text.splitlines()[0])
    return first.split(". ")[0].rstrip(".")


@contextlib.contextmanager
def name_failures(
    rank: int,
    where: Callable[[int], str],
    step: int,
    phase: PhaseLike | str,
    heartbeat: Heartbeat | None = None,
) -> Iterator[None]:
    """Re-raise a RuntimeError as ``rank 0 (pp=0 dp=0 tp=0) failed in step 12, phase
    backward: <the backend's first line>; rank 1 (…) last answered 10.2 s ago in step 12,
    phase forward (its process is stopped)``."""
    try:
        yield
    except RuntimeError as e:
        first = backend_message(e)
        name = phase if isinstance(phase, str) else (phase.current or "between phases")
        message = f"rank {rank} ({where(rank)}) failed in step {step}, phase {name}: {first}"
        laggards = heartbeat.laggards() if heartbeat is not None else []
        if laggards:
            message += "; " + describe(laggards, where)
        error = CollectiveTimeout(message)
        error.laggards = laggards  # type: ignore[attr-defined]
        raise error from e


def first_to_fail() -> bool:
    """Whether this rank is the job's first to fail (one atomic counter in the job's store).

    When one rank fails, its peers' collectives fail next ("connection closed by peer"):
    only the first failure is the cause, so only its line is printed."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return True
        return dist.distributed_c10d._get_default_store().add("paracube/failures", 1) == 1
    except (RuntimeError, OSError):  # no store to ask: say it
        return True


def end_stalled_peers(error: BaseException) -> None:
    """Kill the peers on this host that ``error`` found frozen (stale and stopped), so the
    job ends now rather than when the launcher's grace period runs out."""
    here = socket.gethostname()
    for peer in getattr(error, "laggards", []):
        if peer.host == here and peer.stopped():
            with contextlib.suppress(OSError):
                os.kill(peer.pid, signal.SIGKILL)
