"""This machine as the planner sees it: the calibration file ``paracube calibrate`` wrote.

Pure reading and arithmetic (the measuring is :mod:`paracube.calibrate`).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from paracube.errors import ConfigError
from paracube.planner.hardware import (
    DEFAULT_INTRA,
    GPU,
    GPUS,
    INTERCONNECTS,
    Interconnect,
    catalog_key,
)

DEFAULT_PATH = Path(
    os.environ.get("PARACUBE_CALIBRATION", Path.home() / ".cache" / "paracube" / "calibration.json")
)


# What local_hardware() reads; each a finite positive number.
REQUIRED = (
    "matmul_flops_per_thread",
    "memory_bandwidth",
    "link_bandwidth",
    "allreduce_bandwidth",
    "allreduce_latency",
)


def load(path: Path | None = None) -> dict | None:
    """The saved calibration (default :data:`DEFAULT_PATH`), None if there is none; a
    damaged file is refused in one line."""
    path = path or DEFAULT_PATH
    if not path.exists():
        return None
    fix = "run `paracube calibrate` again"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"calibration file {path} is unreadable ({e}): {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"calibration file {path} holds no calibration (not an object): {fix}")
    for key in REQUIRED:
        value = data.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value < math.inf
        ):
            raise ConfigError(
                f"calibration file {path}: {key} is {value!r}, not a positive number: {fix}"
            )
    return data


def local_hardware(
    data: dict, threads_per_rank: int, local_ranks: int = 1
) -> tuple[GPU, Interconnect]:
    """This machine as the planner's 'GPU' (one rank) and 'link' (gloo between ranks).

    The link is set from the measured *all-reduce* so that the ring formula for two ranks,
    n/B + 2α, reproduces it: the planner's collectives are all-reduces (and their halves).
    Memory bandwidth is the machine's, shared by its ``local_ranks``; communication is not
    overlapped with compute (the cores do both)."""
    rank = GPU(
        "this machine (one rank)",
        data["matmul_flops_per_thread"] * threads_per_rank,
        memory_bytes=64e9,
        hbm_bandwidth=data["memory_bandwidth"] / local_ranks,
        nvlink_bandwidth=data["link_bandwidth"],
        overlaps_communication=False,
        attention_rate=data.get("attention_flops_per_thread", 0.0) * threads_per_rank,
        activation_rates=(
            data.get("gelu_forward_per_thread", 0.0) * threads_per_rank,
            data.get("gelu_backward_per_thread", 0.0) * threads_per_rank,
        ),
    )
    return rank, Interconnect(
        "gloo over loopback",
        data["allreduce_bandwidth"],
        data["allreduce_latency"] / 2,
        pair_cost_ratio=data.get("gather_scatter_pair_ratio", 1.0),
    )


def calibrated_gpu(data: dict) -> tuple[GPU, Interconnect] | None:
    """The GPU ``paracube calibrate`` measured (its ``gpu`` section), as the planner's GPU,
    and the catalog's link for it (one GPU measures no link); None without a section.

    What it sustains is what a transformer block's GEMMs sustain: the median over the
    measured block shapes of each rate over that shape's own wave efficiency (so that the
    time model, which derates every GEMM by its own, does not charge the waves twice). The
    squares' best is not it: on an H200 4096³ ran at 799 TFLOP/s where the block shapes ran
    at 640-694. Its peak stays the datasheet's where the GPU is listed — MFU is against the
    peak — and the sustained fraction is the measured rate over it; the fp32 and TF32 rates
    are stored over that fraction, so that the time model's derating gives back the
    measured ones. An unlisted GPU's peak is the measured rate (fraction 1). Attention
    (forward and backward rates) and HBM are measured too; what one GPU cannot measure — NVLink, the host link — is the
    catalog entry's, where the GPU is listed."""
    from paracube.calibrate_gpu import BLOCK_SHAPES
    from paracube.planner.time_model import wave_efficiency

    measured = data.get("gpu")
    if not measured:
        return None
    key = catalog_key(measured["name"])
    listed = GPUS.get(key) if key else None
    rates = measured["matmul"]["bf16"]
    sustained = statistics.median(
        rates["x".join(map(str, (m, n, k)))] / wave_efficiency(m, n, measured["sms"])
        for m, n, k in BLOCK_SHAPES
    )
    peak = listed.peak_flops if listed else sustained
    fraction = sustained / peak
    rank = GPU(
        f"{measured['name']} (calibrated)",
        peak,
        memory_bytes=measured["memory_bytes"],
        hbm_bandwidth=measured["memory_bandwidth"],
        nvlink_bandwidth=listed.nvlink_bandwidth if listed else 0.0,
        sms=measured["sms"],
        attention_rate=measured["attention"]["forward_flops"],
        attention_backward_rate=measured["attention"]["backward_flops"],
        fp32_flops=measured["matmul"]["fp32"] / fraction,
        tf32_flops=measured["matmul"]["tf32"] / fraction,
        measured_sustained=fraction,
        host_link_bandwidth=listed.host_link_bandwidth if listed else 0.0,
        host_memory_bandwidth=listed.host_memory_bandwidth if listed else 0.0,
        host_memory_bytes=listed.host_memory_bytes if listed else 0.0,
    )
    link = INTERCONNECTS[DEFAULT_INTRA[key] if key else "nvlink4"]
    return rank, link
