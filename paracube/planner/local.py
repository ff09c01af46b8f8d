"""This machine as the planner sees it: the calibration file ``paracube calibrate`` wrote.

Pure reading and arithmetic (the measuring is :mod:`paracube.calibrate`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from paracube.errors import ConfigError
from paracube.planner.hardware import GPU, Interconnect

DEFAULT_PATH = Path(
    os.environ.get("PARACUBE_CALIBRATION", Path.home() / ".cache" / "paracube" / "calibration.json")
)


def load(path: Path = DEFAULT_PATH) -> dict | None:
    """The saved calibration, None if there is none; a damaged file is refused in one line."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"calibration file {path} is unreadable ({e}): run `paracube plan --calibrate` again"
        ) from None


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
