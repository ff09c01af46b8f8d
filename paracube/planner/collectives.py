"""The collectives every parallel dimension's time is built from (pure math): a ring
all-reduce and its half (an all-gather or a reduce-scatter) on a link, the link a group of
GPUs runs at — NVLink within a node, across nodes its members' rails together — and what a
collective that hides behind compute costs that compute (:data:`OVERLAP_SLOWDOWN`). Tensor,
context, expert and data parallelism time their traffic with these
(:mod:`paracube.planner.time_model`, :mod:`paracube.planner.dp_comm`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from paracube.planner.hardware import Interconnect

if TYPE_CHECKING:  # the cluster is the time model's; only its links are read here
    from paracube.planner.time_model import Cluster


def ring(bytes_: float, ranks: int, link: Interconnect) -> float:
    """An all-reduce of ``bytes_`` over ``ranks``: a ring's 2(n − 1)/n of the bytes at the
    link's bus bandwidth — the switch-reduced one where the fabric has it
    (``Interconnect.allreduce_bandwidth``: NVLS) — and its 2(n − 1) latency steps."""
    if ranks <= 1:
        return 0.0
    bandwidth = link.allreduce_bandwidth or link.bandwidth
    return 2 * (ranks - 1) / ranks * bytes_ / bandwidth + 2 * (ranks - 1) * link.latency


def half_ring(bytes_: float, ranks: int, link: Interconnect) -> float:
    """An all-gather (of ``bytes_`` gathered) or a reduce-scatter (of ``bytes_`` in): half a
    ring all-reduce's traffic and steps at the link's bandwidth, at what the link measured
    such a pair to cost against the all-reduce (``Interconnect.pair_cost_ratio``: 1 on NCCL,
    whose ring all-reduce is that pair; gloo implements the three separately and its pair
    costs 2–3×)."""
    if ranks <= 1:
        return 0.0
    one_way = (ranks - 1) / ranks * bytes_ / link.bandwidth + (ranks - 1) * link.latency
    return link.pair_cost_ratio * one_way


# Compute that runs while a collective is in flight runs slower — the collective's kernels
# hold SMs and HBM bandwidth: "overlapping computation and communication can result in an
# average computational slowdown of 18.9%" against the same compute alone ("Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance
# and Power Implications", arXiv 2507.03114, abstract; GPT and Llama models on A100, H100,
# MI250, MI210). Charged on the seconds of communication that hide behind compute.
OVERLAP_SLOWDOWN = 0.189


def group_link(cluster: Cluster, ranks: int, stride: int) -> Interconnect:
    """The link a ring over ``ranks`` GPUs runs at, per GPU, consecutive members ``stride``
    GPUs apart. Ranks are ordered tensor-parallel innermost, then data-parallel (Megatron's
    order): a data-parallel group's members are tp apart, a hybrid-sharding replica group's
    tp × shard. A node holds k = min(ranks, GPUs per node ÷ stride) members of the group.
    Within one node the ring runs on NVLink. Across nodes NCCL runs one ring per NIC: each
    member's rail carries 1/k of the group's inter-node traffic, so the group sees k × the
    per-GPU network bandwidth — capped by NVLink, which carries the rest of each ring. Of a
    ring's n − 1 steps per pass only the n/k − 1 that cross nodes pay the network's
    latency, the others NVLink's (NCCL's tuning model, ``nInterSteps`` against ``nsteps``:
    nccl src/graph/tuning.cc): the link's per-step latency is their mean."""
    members = min(ranks, max(1, cluster.gpus_per_node // stride))
    if stride * ranks <= cluster.gpus_per_node:
        return cluster.intra
    if members == 1:
        return cluster.inter
    bandwidth = min(cluster.intra.bandwidth, members * cluster.inter.bandwidth)
    crossing = node_crossings(cluster, ranks, stride)  # of the ring's ranks − 1 steps
    latency = (
        crossing * cluster.inter.latency + (ranks - 1 - crossing) * cluster.intra.latency
    ) / (ranks - 1)
    return replace(
        cluster.inter,
        name=f"{cluster.inter.name} × {members} rails",
        bandwidth=bandwidth,
        latency=latency,
    )


def node_crossings(cluster: Cluster, ranks: int, stride: int) -> float:
    """How many of a ring's (or chain's) ranks − 1 steps over ``ranks`` GPUs, consecutive
    members ``stride`` apart, go from one node to the next: none within a node; every one
    when each node holds a single member; else one per node boundary, ranks ÷ members − 1."""
    members = min(ranks, max(1, cluster.gpus_per_node // stride))
    if stride * ranks <= cluster.gpus_per_node:
        return 0.0
    if members == 1:
        return float(ranks - 1)
    return ranks / members - 1
