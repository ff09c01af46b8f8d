"""A run's metrics read for diagnosis: its step records with every rank's timings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from paracube.errors import ConfigError


class DiagnoseError(ConfigError):
    """A run that cannot be diagnosed (exit 2)."""


@dataclass
class Run:
    path: str
    steps: list[dict]  # the step records, in order, each with "ranks"
    header: dict = field(default_factory=dict)  # what ran: model, layout, hosts (first record)
    timeline: dict | None = None  # one step's phases per rank (the last record's)

    @property
    def world(self) -> int:
        return len(self.steps[0]["ranks"]["step_time"])

    def steady(self) -> list[dict]:
        """The steps after the first (which pays for warm-up)."""
        return self.steps[1:] or self.steps


def read_run(path: str) -> Run:
    """The run at ``path`` — a metrics file, or a folder holding one ``*.jsonl``."""
    p = Path(path)
    if not p.exists():
        raise DiagnoseError(
            f"{path} does not exist: give the --metrics file of a run (paracube train ... --metrics FILE)"
        )
    if p.is_dir():
        found = sorted(p.glob("*.jsonl"))
        if len(found) != 1:
            raise DiagnoseError(
                f"{path} holds {len(found)} metrics files (*.jsonl): give one of them"
            )
        p = found[0]
    records = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise DiagnoseError(
                    f"{p} line {n} is not JSON: not a paracube metrics file"
                ) from None
    steps = [r for r in records if isinstance(r, dict) and "step" in r and "step_time" in r]
    if not steps:
        raise DiagnoseError(f"{p} holds no step records: is it the --metrics file of a run?")
    if any("ps_version" in r for r in steps):
        raise DiagnoseError(
            f"{p} is a --dp-mode ps run: its workers never wait for each other, so there is no "
            "shared step to break down; its staleness distribution is in the last record "
            "(ps_staleness) — diagnose a synchronous run of the same job"
        )
    if any("ranks" not in r for r in steps):
        raise DiagnoseError(
            f"{p} has no per-rank timings (written by an older paracube): re-run the job with "
            "this version to diagnose it"
        )
    header: dict = next((r["run"] for r in steps if "run" in r), {})
    timeline = next((r["timeline"] for r in reversed(steps) if "timeline" in r), None)
    # An appended (restarted) run repeats steps: keep each step's last record.
    by_step = {r["step"]: r for r in steps}
    return Run(str(p), [by_step[s] for s in sorted(by_step)], header, timeline)
