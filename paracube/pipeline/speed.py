"""``--balance speed``: pipeline stages cut by each stage's own measured speed and memory.

Every stage does not run on the same hardware: an older GPU, a shared node or a throttled
device runs its layers slower, a smaller one holds fewer. So every rank times each layer
of the chain on its own device (:func:`paracube.pipeline.stage.measure_layer_times`, times
an injected ``--inject slow-rank`` factor) and states its memory capacity; one all-reduce
(MAX) over the world of a ``(p, L + 1)`` grid — each rank fills the row of its pipeline
rank with its layer times and its negated capacity — gives every stage the times of its
slowest replica and the capacity of its smallest (the data-parallel replicas of a stage
must hold the same layers, so the slowest sets the pace).

The cut (:func:`speed_split`, exact, :func:`paracube.pipeline.partition.partition`): part
``k`` runs on pipeline rank ``k mod p`` and costs the sum of *that rank's* layer times —
so a rank twice as slow gets about half the work — and must fit: the fp32 Adam states of
its layers (the 1/tp share) plus their saved activations × the micro-batches in flight on
that rank (:func:`paracube.pipeline.balance.gpt_layer_loads`, ``memory``) within its
capacity ÷ chunks. Every rank computes the same split from the same grid.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from paracube import inject
from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.config import TrainConfig
from paracube.pipeline.balance import gpt_layer_loads
from paracube.pipeline.partition import partition
from paracube.pipeline.stage import measure_layer_times
from paracube.resources import RANK_RUNTIME_BYTES, available_memory


def speed_split(
    times: list[list[float]],
    capacity: list[float],
    memory: Callable[[int, int], float],
    parts: int,
) -> tuple[list[tuple[int, int]], Callable[[int, int], float]]:
    """The split of ``L`` layers into ``parts`` (``p × chunks``) stages that minimises the
    slowest stage's time, given ``times[r][layer]`` (seconds per micro-batch, forward +
    backward, on pipeline rank r), ``capacity[r]`` (bytes) and ``memory(part, layer)``
    (bytes); returns the bounds and the load they were cut by."""
    p, n = len(times), len(times[0])
    chunks = parts // p
    # prefix sums of each part's memory, so that fits() is O(1) inside the O(parts·L²) cut
    prefix = []
    for k in range(parts):
        run, sums = 0.0, [0.0]
        for layer in range(n):
            run += memory(k, layer)
            sums.append(run)
        prefix.append(sums)

    def fits(part: int, start: int, end: int) -> bool:
        return prefix[part][end] - prefix[part][start] <= capacity[part % p] / chunks

    def load(part: int, layer: int) -> float:
        return times[part % p][layer]

    return partition(n, parts, load, fits), load


def capacity_bytes(device: torch.device) -> float:
    """What this rank can hold: its GPU's memory, or on a CPU its share of the host's
    available memory (less the runtime a rank costs before any model)."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return available_memory() / local - RANK_RUNTIME_BYTES


def measured_speed_split(
    layers: list[nn.Module],
    sample: torch.Tensor,
    cfg: TrainConfig,
    pp_rank: int,
    device: torch.device,
    ledger: CommLedger | None,
) -> tuple[list[tuple[int, int]], Callable[[int, int], float]]:
    """Time this rank's layers, agree on every stage's times and capacity, cut."""
    par = cfg.parallel
    n = len(layers)
    grid = torch.full((par.pp, n + 1), -math.inf, dtype=torch.float64)  # MAX: others' rows
    factor = inject.compute_factor()
    grid[pp_rank, :n] = torch.tensor([t * factor for t in measure_layer_times(layers, sample)])
    grid[pp_rank, n] = -capacity_bytes(device)
    ops.all_reduce(grid, None, ledger, tag="balance", op=dist.ReduceOp.MAX)
    memory = gpt_layer_loads(
        cfg.model, "memory", micro_batch=cfg.micro_batch, p=par.pp, schedule=par.schedule,
        m=cfg.grad_accum,
    )  # fmt: skip
    times = grid[:, :n].tolist()
    capacity = (-grid[:, n]).tolist()
    return speed_split(
        times, capacity, lambda part, layer: memory(part, layer) / par.tp, par.pp * par.chunks
    )
