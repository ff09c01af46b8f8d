"""FLOPs and training-time formulas for GPT-style decoders (formulas.md)."""

from __future__ import annotations


def narayanan_params(l: int, h: int, V: int, s: int) -> float:  # noqa: E741
    """Narayanan et al. 2021 (SC21), Eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def flops_with_full_recompute(B: int, s: int, l: int, h: int, V: int) -> float:  # noqa: E741
    """SC21 Eq. 3, FLOPs per iteration with full activation recomputation:
    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def model_flops(B: int, s: int, L: int, h: int, v: int) -> float:
    """Korthikanti et al. 2022, Eq. 7 — model FLOPs per iteration, no recomputation:
    72·B·L·s·h²·(1 + s/(6h) + v/(12·h·L)). MFU = model FLOPs / (time × peak)."""
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def hardware_flops_selective(B: int, s: int, L: int, h: int, v: int) -> float:
    """Korthikanti et al. 2022: with selective recompute, 72·B·L·s·h²·(1 + s/(3h) + v/(12·h·L))."""
    return 72 * B * L * s * h * h * (1 + s / (3 * h) + v / (12 * h * L))


def training_days(tokens: float, params: float, gpus: int, flops_per_gpu: float) -> float:
    """SC21 Eq. 4: end-to-end time ≈ 8·T·P / (n·X) seconds (with recomputation), in days."""
    return 8 * tokens * params / (gpus * flops_per_gpu) / 86400
