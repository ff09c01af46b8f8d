"""``--profile STEPS``: torch profiler traces of chosen steps, one Chrome-trace file per
rank and step (``DIR/rank{r}-step{s}.json``, open in ui.perfetto.dev or chrome://tracing),
beside paracube's own per-phase timeline. Profiling slows the steps it covers; the other
steps run untouched."""

from __future__ import annotations

import contextlib
import os

from paracube.errors import ConfigError


def parse_steps(text: str) -> tuple[int, int]:
    """``"5"`` → (5, 5); ``"3-6"`` → (3, 6): the first and last step profiled (0-based)."""
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise ConfigError(f"--profile {text!r}: give a step N or steps A-B (3-5)") from None
    if a < 0 or b < a:
        raise ConfigError(f"--profile {text}: give steps A-B with 0 <= A <= B")
    if b - a >= 20:
        raise ConfigError(f"--profile {text}: at most 20 steps (each trace is large)")
    return a, b


class StepProfiler:
    """Around each step: the torch profiler if the step is chosen, nothing otherwise."""

    def __init__(self, steps: tuple[int, int] | None, folder: str, rank: int) -> None:
        self.steps, self.folder, self.rank = steps, folder, rank

    def around(self, step: int) -> contextlib.AbstractContextManager:
        if self.steps is None or not self.steps[0] <= step <= self.steps[1]:
            return contextlib.nullcontext()
        return self._profiled(step)

    @contextlib.contextmanager
    def _profiled(self, step: int):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            yield
        os.makedirs(self.folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(self.folder, f"rank{self.rank}-step{step}.json"))
