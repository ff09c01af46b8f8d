"""Faults injected on purpose — for tests and demos of ``paracube diagnose``, never for a
real run: ``--inject slow-rank=R:FACTOR`` (rank R's compute takes FACTOR times as long: it
sleeps ``(FACTOR - 1) ×`` its compute, in place — before each collective it starts or
waits for and at the end of each compute phase, so what its peers receive from it comes
FACTOR times later, as from a slower device), ``--inject data-delay=SECONDS``
(each micro-batch takes that much longer to load, in the loader — so prefetching can hide
it), ``--inject comm-delay=SECONDS`` (each collective and transfer starts that much later).

The job's injections are set once per rank (:func:`activate`); the hooks below are
called by the phase timer, the pipeline executor, the loader and the collectives, and
cost one attribute test when nothing is injected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from paracube.errors import ConfigError

KINDS = ("slow-rank", "data-delay", "comm-delay")


@dataclass(frozen=True)
class Injections:
    slow_rank: int | None = None
    slow_factor: float = 1.0
    data_delay: float = 0.0
    comm_delay: float = 0.0

    def describe(self) -> str:
        parts = []
        if self.slow_rank is not None:
            parts.append(f"rank {self.slow_rank}'s compute x{self.slow_factor:g}")
        if self.data_delay:
            parts.append(f"+{self.data_delay:g} s per micro-batch loaded")
        if self.comm_delay:
            parts.append(f"+{self.comm_delay:g} s per collective")
        return ", ".join(parts)


def parse_injections(items: list[str] | None) -> Injections:
    """``["slow-rank=3:1.8", "data-delay=0.05"]`` → :class:`Injections`; a bad item is
    refused naming it (the rank is checked against the world in :func:`check_world`)."""
    found: dict = {}
    for item in items or []:
        kind, _, value = item.partition("=")
        if kind not in KINDS:
            raise ConfigError(
                f"--inject {item}: unknown kind {kind!r}: choose slow-rank=R:FACTOR, "
                "data-delay=SECONDS or comm-delay=SECONDS"
            )
        if kind == "slow-rank":
            rank, _, factor = value.partition(":")
            found["slow_rank"] = _number(item, rank, int, "a rank R (slow-rank=R:FACTOR)")
            found["slow_factor"] = _number(item, factor, float, "a factor (slow-rank=R:FACTOR)")
            if found["slow_rank"] < 0:
                raise ConfigError(f"--inject {item}: rank {found['slow_rank']} is negative")
            if not 1 <= found["slow_factor"] <= 100:
                # Sleeping can only slow a rank: a factor under 1 would silently do nothing.
                raise ConfigError(
                    f"--inject {item}: factor {found['slow_factor']:g} must be in [1, 100] "
                    "(1.5: 50 % slower)"
                )
        else:
            seconds = _number(item, value, float, "seconds")
            if not 0 <= seconds <= 60:
                raise ConfigError(f"--inject {item}: {seconds:g} s must be in [0, 60]")
            found[kind.replace("-", "_")] = seconds
    return Injections(**found)


def check_world(inj: Injections, world: int) -> None:
    if inj.slow_rank is not None and inj.slow_rank >= world:
        raise ConfigError(
            f"--inject slow-rank={inj.slow_rank}:{inj.slow_factor:g}: rank {inj.slow_rank} is "
            f"outside the job's {world} ranks (0-{world - 1})"
        )


def _number(item: str, text: str, kind, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"--inject {item}: {text!r} is not {what}") from None
    if kind is float and value != value:  # NaN
        raise ConfigError(f"--inject {item}: {text!r} is not {what}")
    return value


# -- this rank's injections and the hooks ---------------------------------------------------

_slow_factor = 1.0  # > 1 only on the slowed rank
_data_delay = 0.0
_comm_delay = 0.0


def activate(inj: Injections, rank: int) -> None:
    """Set this rank's injections (once, when the rank starts)."""
    global _slow_factor, _data_delay, _comm_delay
    _slow_factor = inj.slow_factor if inj.slow_rank == rank else 1.0
    _data_delay, _comm_delay = inj.data_delay, inj.comm_delay


# The slow rank's compute clock: a compute phase runs from start_compute() to stop_compute();
# before the rank communicates it catches up (sleeps for the compute since the clock last
# ran), and the wait that follows is not compute, so it is not slowed.
_computing = False
_since: float | None = None
_slept = 0.0


def start_compute() -> None:
    global _computing, _since
    if _slow_factor != 1.0:
        _computing, _since = True, time.perf_counter()


def stop_compute() -> None:
    global _computing
    pause()
    _computing = False


def pause() -> float:
    """Before a collective starts or is waited for: sleep the extra for the compute since
    the clock last ran, then stop the clock; returns the seconds slept."""
    global _since, _slept
    if _since is None:
        return 0.0
    extra = (_slow_factor - 1.0) * (time.perf_counter() - _since)
    time.sleep(extra)
    _slept += extra
    _since = None
    return extra


def resume() -> None:
    """After a collective started or was waited for: the compute goes on."""
    global _since
    if _computing:
        _since = time.perf_counter()


def slept() -> float:
    """Seconds slept so far by the compute clock (the phase timer charges its share)."""
    return _slept


def compute_factor() -> float:
    """How many times as long this rank's compute takes (what ``--balance speed`` sees of
    an injected slow rank when it times the layers)."""
    return _slow_factor


def delay_data() -> None:
    if _data_delay:
        time.sleep(_data_delay)


def delay_comm() -> None:
    if _comm_delay:
        time.sleep(_comm_delay)
