"""Mixed precision: compute dtypes and dynamic loss scaling.

bf16/fp16 runs keep the model's parameters in the compute dtype and fp32 *main*
parameters in the optimizer (Micikevicius et al. 2018; see
:mod:`paracube.data_parallel.optimizer`). fp16's narrow exponent range flushes small
gradients to zero, so its loss is multiplied by a scale before backward and the gradients
are divided by it before the step; on overflow (inf/NaN anywhere on any rank) the step is
skipped and the scale halved, and after ``growth_interval`` clean steps it is doubled
(the dynamic loss scaling of Micikevicius et al. and of torch's ``GradScaler``).
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """``"dynamic"`` (start 2¹⁶, ×0.5 on overflow, ×2 after ``growth_interval`` clean
    steps) or a fixed scale given as a number."""

    floor = 1.0  # the dynamic scale never goes below 1 (no scaling)

    def __init__(self, spec: str | float, growth_interval: int = 1000, initial: float = 2.0**16):
        from paracube.values import check_loss_scale  # torch-free; one owner of the bounds

        self.dynamic = spec == "dynamic"
        self.scale = initial if self.dynamic else check_loss_scale(spec)
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval!r}")
        self.growth_interval = growth_interval
        self._clean = 0
        self.skipped = 0  # steps skipped so far
        self.consecutive = 0  # steps skipped in a row, up to the last one

    def update(self, overflow: bool) -> None:
        self.consecutive = self.consecutive + 1 if overflow else 0
        if overflow:
            self.skipped += 1
        if not self.dynamic:
            return
        if overflow:
            self.scale = max(self.scale / 2, self.floor)
            self._clean = 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self.scale *= 2
                self._clean = 0
