"""Where every rank is, so that a rank whose collective failed can name the peer that stopped.

A timed-out collective only tells the rank that waited *that* it waited. To say *who* it
waited for, each rank publishes its position — step, phase, process id, host — in the
job's key-value store (the TCPStore the launcher's agent hosts, alive while any rank is)
from a daemon thread every :data:`INTERVAL` seconds; the training loop only assigns two
attributes, so the hot path does no I/O. A rank that is stopped (SIGSTOP), hung in a
kernel or dead stops publishing: when a collective fails, :meth:`Heartbeat.laggards`
reads every rank's record and names those whose record is stale, or, if none is, those
furthest behind.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

INTERVAL = 0.5  # seconds between a rank's records
STALE = 5 * INTERVAL  # a record this old means the rank is not running
SETTLE = 1.0  # seconds a failed collective waits for a dying peer to read as dead
_KEY = "paracube/heartbeat/{}"


@dataclass(frozen=True)
class Position:
    rank: int
    step: int
    phase: str
    pid: int
    host: str
    age: float  # seconds since the rank last published

    def state(self) -> str:
        """ "stopped" (SIGSTOP, a debugger), "dead", "running", or "unknown" on another host."""
        if self.host != socket.gethostname():
            return "unknown"
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                code = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "dead"
        return {"T": "stopped", "t": "stopped", "Z": "dead", "X": "dead"}.get(code, "running")

    def stopped(self) -> bool:
        return self.state() == "stopped"


class Heartbeat:
    """This rank's publisher, and the reader of every rank's record (``store``: a
    ``torch.distributed.Store`` shared by the job; ``where(rank)``: its coordinates)."""

    def __init__(self, store, rank: int, world: int) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.step, self.timer = 0, None  # set by the training loop (see at())
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._stop, self._wake = threading.Event(), threading.Event()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="paracube-heartbeat", daemon=True)
        self._thread.start()

    def at(self, step: int, timer=None) -> None:
        """The loop is in ``step``; ``timer.current`` (a PhaseTimer) or ``timer`` itself
        (a string) names the phase."""
        moved = step != self.step
        self.step, self.timer = step, timer
        if moved:
            self._wake.set()  # publish the new step now, from the thread

    @property
    def phase(self) -> str:
        if isinstance(self.timer, str):
            return self.timer
        current = getattr(self.timer, "current", None)
        return current or ("start-up" if self.timer is None else "between phases")

    def _publish(self) -> None:
        record = {"step": self.step, "phase": self.phase, "pid": self._pid, "host": self._host}
        self.store.set(_KEY.format(self.rank), json.dumps({**record, "time": time.time()}))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(INTERVAL)
            self._wake.clear()
            try:
                self._publish()
            except (RuntimeError, OSError):  # the store is gone: the job is ending
                return

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def positions(self) -> list[Position]:
        """Every other rank's last record (ranks that never published are left out)."""
        keys = [_KEY.format(r) for r in range(self.world) if r != self.rank]
        try:
            self.store.set_timeout(timedelta(seconds=2))
            found = [k for k in keys if self.store.check([k])]
            records = {k: json.loads(self.store.get(k)) for k in found}
        except (RuntimeError, OSError, ValueError):  # the store is unreachable: nothing to add
            return []
        now = time.time()
        return [
            Position(
                int(k.rsplit("/", 1)[1]),
                r["step"],
                r["phase"],
                r["pid"],
                r["host"],
                now - r["time"],
            )
            for k, r in records.items()
        ]

    def laggards(self, settle: float = SETTLE) -> list[Position]:
        """The ranks that are dead, stopped or no longer publishing; else those behind.

        A killed peer's sockets close in the kernel's exit path *before* its process is
        marked a zombie, so the collective that saw "connection reset" can look while the
        peer still reads as running: look again for up to ``settle`` seconds before
        falling back to the ranks behind."""
        deadline = time.monotonic() + settle
        while True:
            others = self.positions()
            gone = [p for p in others if p.age > STALE or p.state() in ("dead", "stopped")]
            if gone or time.monotonic() >= deadline:
                return gone or [p for p in others if p.step < self.step]
            time.sleep(0.05)


def describe(positions: list[Position], where) -> str:
    """``rank 1 (dp=1) last answered 10.3 s ago in step 3, phase backward (its process is
    stopped)`` for each laggard; ``where(rank)`` gives a rank's coordinates."""
    parts = []
    notes = {"stopped": " (its process is stopped)", "dead": " (its process has died)"}
    for p in positions:
        state = notes.get(p.state(), "")
        parts.append(
            f"rank {p.rank} ({where(p.rank)}) last answered {p.age:.1f} s ago in step {p.step}, "
            f"phase {p.phase}{state}"
        )
    return "; ".join(parts)
