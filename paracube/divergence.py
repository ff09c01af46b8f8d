"""Noticing that training diverged, and stopping as ``--on-nan`` says.

After every step the loss (the global mean) and the gradient norm (global, before
clipping) are the same on every rank, so every rank reaches the same verdict at the same
step and the job stops cleanly (exit status 3) with the step's metrics written:

- ``--on-nan stop`` (default): a non-finite loss or gradient norm stops the run, naming
  the step and the first non-finite quantity; no optimizer step is taken with it.
- ``--on-nan skip``: such a step is skipped (the optimizer does not step) and training
  goes on; the metrics mark it ``skipped``.
- ``--on-nan continue``: nothing is checked (the weights take whatever comes).

fp16 skips overflowing steps by design (dynamic loss scaling); under ``stop`` it stops
after :data:`FP16_MAX_SKIPS` consecutive skips, or when the dynamic scale has reached its
floor and still overflows — the run would otherwise skip every remaining step.
"""

from __future__ import annotations

import math

from paracube.config import TrainConfig
from paracube.errors import Diverged

FP16_MAX_SKIPS = 20  # the dynamic scale reaches its floor after 16 halvings from 2**16


def check_step(metrics, cfg: TrainConfig, scaler=None) -> None:
    """Raise :class:`Diverged` if ``metrics`` (a StepMetrics) shows divergence under ``stop``."""
    if cfg.on_nan != "stop":
        return
    step, hint = metrics.step, f"lower --lr (now {cfg.lr:g}) or pass --on-nan skip"
    if not math.isfinite(metrics.loss):
        raise Diverged(f"step {step}: the loss is {metrics.loss}: training diverged; {hint}")
    if scaler is None and not math.isfinite(metrics.grad_norm):
        raise Diverged(
            f"step {step}: the gradient norm is {metrics.grad_norm} (loss {metrics.loss:.4g}): "
            f"training diverged; {hint}"
        )
    if scaler is not None and metrics.skipped:
        at_floor = scaler.dynamic and scaler.scale <= scaler.floor
        if scaler.consecutive >= FP16_MAX_SKIPS or at_floor:
            why = (
                "at the loss scale's floor of 1"
                if at_floor
                else f"on {scaler.consecutive} steps in a row"
            )
            raise Diverged(
                f"step {step}: fp16 gradients overflowed {why} (loss scale {scaler.scale:g}): "
                f"training diverged; lower --lr (now {cfg.lr:g}), use --precision bf16, or pass --on-nan skip"
            )
