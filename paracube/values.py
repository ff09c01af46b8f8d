"""Checks of one value on its own — positive integers, finite numbers in a range, a fixed
fp16 loss scale — that name the flag and the value. Torch-free; the config dataclasses
and the loss scaler use them."""

from __future__ import annotations

import math

from paracube.errors import ConfigError

# A day: a collective that waits longer is a hung job, not a slow one.
MAX_TIMEOUT_S = 86400.0


def positive(name: str, value, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        extra = f" ({hint})" if hint else ""
        raise ConfigError(f"{name} must be a positive integer, got {value!r}{extra}")


def number(name: str, value, *, low: float, high: float = math.inf, open_low: bool = False):
    """A finite real number in [low, high] (or (low, high] with ``open_low``)."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > low if open_low else value >= low)
        and value <= high
    )
    if not ok:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        upper = f" and <= {high:g}" if math.isfinite(high) else ""
        raise ConfigError(f"{name} must be a finite number {bound}{upper}, got {value!r}")


# torch.manual_seed takes 64-bit seeds; the sampler derives others from it by addition, so
# the bound leaves room (and matches NumPy's 32-bit seeds, which users often pass along).
MAX_SEED = 2**32 - 1


# fp16's largest value is 65504: a fixed loss scale far above the dynamic scaler's start
# (2**16) overflows every gradient, so every step would be skipped.
MAX_LOSS_SCALE = 2.0**24


def check_loss_scale(value) -> float:
    """A fixed fp16 loss scale: a finite number in [1, 2**24]; returns it as a float."""
    try:
        scale = float(str(value))
    except ValueError:
        scale = math.nan
    if not 1 <= scale <= MAX_LOSS_SCALE:
        raise ConfigError(
            f"--loss-scale must be 'dynamic' or a number in [1, 2**24], got {value!r} "
            "(fp16 overflows above 65504: a larger scale skips every step)"
        )
    return scale


def compression(spec: str) -> tuple[str, float]:
    """``--compress``: (kind, value) of ``none``, ``fp16``, ``bf16``, ``topk:RATIO`` (RATIO
    in (0, 1]) or ``powersgd:RANK`` (an integer ≥ 1; its upper bound depends on the model)."""
    from paracube.choices import COMPRESSORS

    kind, _, text = spec.partition(":")
    if kind not in COMPRESSORS:
        raise ConfigError(
            f"unknown --compress {spec!r}: choose none, fp16, bf16, topk:RATIO or powersgd:RANK"
        )
    if kind == "topk":
        ratio = _number(text, float)
        if ratio is None or not 0 < ratio <= 1:
            raise ConfigError(
                f"--compress {spec}: RATIO must be a number in (0, 1], e.g. topk:0.01"
            )
        return kind, ratio
    if kind == "powersgd":
        rank = _number(text, int)
        if rank is None or rank < 1:
            raise ConfigError(f"--compress {spec}: RANK must be an integer ≥ 1, e.g. powersgd:4")
        return kind, rank
    return kind, 0.0


def dp_mode(spec: str) -> tuple[str, int | None]:
    """``--dp-mode`` (checked by the config first): ``"diloco:50"`` → ("diloco", 50),
    ``"stale:0"`` → ("stale", 0), ``"ps"`` → ("ps", None: no bound), ``"sync"`` → ("sync", None)."""
    kind, _, text = spec.partition(":")
    return kind, int(text) if text else None


def _number(text: str, kind: type):
    """``kind(text)``, or None where it is no such number (NaN included)."""
    try:
        value = kind(text)
    except ValueError:
        return None
    return value if value == value else None
