"""A mixed cluster's pools: counts of device types, each on whole nodes of its own, and
the plans made for them (:mod:`paracube.planner.mixed`). Torch-free."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from paracube.errors import ConfigError
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.time_model import Cluster

MAX_MICRO_BATCH = 64


@dataclass(frozen=True)
class Pool:
    """``count`` GPUs of one type (whole nodes), and the cluster they form: their GPU and
    NVLink, the job's slowest inter-node link."""

    key: str
    count: int
    cluster: Cluster

    @property
    def gpu(self) -> hw.GPU:
        return self.cluster.gpu


@dataclass(frozen=True)
class MixedPlan:
    """One plan for the whole mixed cluster."""

    kind: str  # "data parallel by speed", "pipeline stages by speed", "all as the slowest"
    layout: Layout  # per replica (data parallel: micro_batch is the replicas' mean)
    step_time: float
    tokens_per_s: float
    # per pool: (pool key, replicas or stages, micro-batch sizes or blocks per stage)
    shares: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
    weights: tuple[int, ...] = ()  # --dp-balance: samples per micro-step of each replica
    pool_times: tuple[float, ...] = ()  # each pool's step (data parallel) or stage time (pipeline)


def parse_pools(
    spec: str, gpus_per_node: int, intra: str | None = None, inter: str | None = None
) -> list[Pool]:
    """``"8xa100-80gb,8xv100"`` → pools; one line naming what is wrong otherwise."""
    pools: list[Pool] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*[x×]\s*([\w.-]+)\s*", part)
        if not match:
            raise ConfigError(
                f"--gpus {spec}: {part.strip()!r} is not COUNTxTYPE; write a count (--gpus 16) or "
                "counts of device types (--gpus 8xa100-80gb,8xv100)"
            )
        count, key = int(match[1]), match[2].lower()
        if key not in hw.GPUS:
            raise ConfigError(
                f"--gpus {spec}: unknown device type {match[2]!r}: choose from {', '.join(hw.GPUS)}"
            )
        if count <= 0:
            raise ConfigError(f"--gpus {spec}: {part.strip()} has no GPUs: give a count ≥ 1")
        if any(p.key == key for p in pools):
            raise ConfigError(f"--gpus {spec}: {key} is listed twice: give its GPUs once")
        pools.append(Pool(key, count, _cluster(key, count, gpus_per_node, intra)))
    if len(pools) < 2:
        raise ConfigError(
            f"--gpus {spec}: one device type is not a mixed cluster: use --gpus {pools[0].count} "
            f"--gpu {pools[0].key}"
        )
    for pool in pools:
        if pool.count > gpus_per_node and pool.count % gpus_per_node:
            raise ConfigError(
                f"--gpus {spec}: {pool.count}x{pool.key} is not whole nodes of --gpus-per-node "
                f"{gpus_per_node}: each device type fills its own nodes"
            )
    # between pools (and between nodes of a pool) the slowest of their default links
    slowest = min((inter or hw.DEFAULT_INTER[p.key] for p in pools), key=_bandwidth)
    link = hw.interconnect(slowest, network=True)
    return [replace(p, cluster=replace(p.cluster, inter=link)) for p in pools]


def _bandwidth(name: str) -> float:
    return hw.interconnect(name, network=True).bandwidth


def _cluster(key: str, count: int, gpus_per_node: int, intra: str | None) -> Cluster:
    link = hw.interconnect(intra or hw.DEFAULT_INTRA[key])
    inter = hw.interconnect(hw.DEFAULT_INTER[key], network=True)
    return Cluster(hw.gpu(key), min(gpus_per_node, count), link, inter)


def tp_fits_nodes(pool: Pool, tp: int) -> bool:
    """Whether tensor-parallel groups of ``tp`` consecutive ranks tile the pool's nodes:
    within a node, dividing the pool, and dividing the node when the pool spans several."""
    node = pool.cluster.gpus_per_node
    return tp <= node and pool.count % tp == 0 and (pool.count <= node or node % tp == 0)


def check_tp(pools: list[Pool], tp: int) -> None:
    """A tensor-parallel group must stay inside one device type's node."""
    for pool in pools:
        if not tp_fits_nodes(pool, tp):
            raise ConfigError(
                f"tp={tp} cannot stay within one device type: {pool.count}x{pool.key} has nodes of "
                f"{pool.cluster.gpus_per_node}; use a tp that divides every pool's node"
            )


def offloadable(pools: list[Pool], fixed: dict) -> bool:
    """Whether a speed-aware plan may move the optimizer to host memory: not where
    ``--offload`` was fixed, and only on GPUs with a host link and host-memory figures."""
    return "offload" not in fixed and all(
        p.gpu.host_link_bandwidth and p.gpu.host_memory_bandwidth for p in pools
    )
