"""Mixed clusters: a plan that gives each device type work in proportion to its speed.

``paracube plan --gpus 8xa100-80gb,8xv100`` — pools of whole nodes, one device type each.
Every training stack plans such a cluster as if all its devices were the slowest (and
smallest): the same layout, the same share of the batch everywhere, so the fast devices
wait. Two plans use the speeds instead, both with tensor-parallel groups inside one pool
(inside a node of one device type):

- **data parallel by speed** (:func:`data_parallel_plans`): every pool runs replicas of one
  ``tp × pp`` layout (the data-parallel reduction needs the same shards everywhere), every
  replica the same m micro-steps, but each its own micro-batch size — what ``paracube
  train --dp-balance W0,W1,...`` runs. The sizes minimise the slowest replica's step: the
  least time T at which the pools' replicas, each taking the largest micro-batch that runs
  within T and fits its memory, cover the global batch.
- **pipeline stages by speed** (:func:`pipeline_plans`): every replica's pipeline has
  stages on every pool (pool i holding ``s_i`` of them), the stages on faster GPUs taking
  more blocks — the exact partition of :mod:`paracube.pipeline.partition` with each
  stage's own per-block time and memory bound (what ``--balance speed`` does at run time).
  Larger-memory pools come first: the first stages hold the most micro-batches in flight.

Both are compared with the best homogeneous plan on the slowest device type with the
smallest memory (:func:`slowest_plan`): the time saved is the headline. Pure math; every
step time comes from :func:`paracube.planner.time_model.estimate` and its parts.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from paracube.choices import RECOMPUTE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.mixed_pipeline import pipeline_plans
from paracube.planner.pools import (
    MAX_MICRO_BATCH,
    MixedPlan,
    Pool,
    check_tp,
    offloadable,
    parse_pools,
    tp_fits_nodes,
)
from paracube.planner.search import (
    Candidate,
    divisors,
    host_holds,
    search,
    simplicity,
    software,
)
from paracube.planner.time_model import Cluster, estimate

__all__ = ["MixedPlan", "Pool", "check_tp", "parse_pools", "pipeline_plans", "plan_mixed"]


def slowest_plan(
    cfg: ModelConfig,
    pools: list[Pool],
    global_batch: int,
    precision: str,
    fixed: dict,
    allowed: dict | None = None,
) -> tuple[Candidate | None, Cluster]:
    """The best homogeneous plan with every GPU taken as the slowest type, with the
    smallest memory of any type: what a stack unaware of the mix would run."""
    slow = min(pools, key=lambda p: p.gpu.peak_flops * p.gpu.sustained_fraction)
    smallest = min(p.gpu.memory_bytes for p in pools)
    gpu = replace(slow.gpu, memory_bytes=smallest)
    node = min(p.cluster.gpus_per_node for p in pools)
    cluster = replace(slow.cluster, gpu=gpu, gpus_per_node=node)
    gpus = sum(p.count for p in pools)
    result = search(
        cfg, cluster, gpus, global_batch, precision=precision, fixed=fixed, top=1, allowed=allowed
    )
    return (result.ranked[0] if result.ranked else None), cluster


def _replica_shapes(cfg: ModelConfig, pools: list[Pool], fixed: dict):
    """(tp, pp) every pool can run whole replicas of, tp inside a pool's node."""
    common = math.gcd(*(p.count for p in pools))
    for tp in divisors(common):
        if not all(tp_fits_nodes(p, tp) for p in pools):
            continue
        if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
            continue
        for pp in divisors(common // tp):
            if pp <= cfg.n_layers and all(
                fixed.get(k, v) == v for k, v in (("tp", tp), ("pp", pp))
            ):
                yield tp, pp


def data_parallel_plans(
    cfg: ModelConfig, pools: list[Pool], global_batch: int, precision: str, fixed: dict
) -> list[MixedPlan]:
    """Every replica layout with its best uneven split of each micro-step's samples."""
    plans = []
    for tp, pp in _replica_shapes(cfg, pools, fixed):
        replicas = [p.count // (tp * pp) for p in pools]
        total = sum(replicas)
        for m in divisors(global_batch):
            per_step = global_batch // m  # samples per micro-step, over all replicas
            if per_step % total or per_step > MAX_MICRO_BATCH * total or (pp > 1 and m < pp):
                continue  # (paracube train: global batch = dp × mean micro-batch × m)
            for zero in (0, 1, 2, 3) if pp == 1 else (0, 1, 2):
                for recompute in RECOMPUTE:
                    base = Layout(
                        dp=total, tp=tp, pp=pp, microbatches=m, zero=zero, recompute=recompute,
                        sequence_parallel=tp > 1, **software(fixed),
                    )  # fmt: skip
                    if any(getattr(base, k) != v for k, v in fixed.items()):
                        continue
                    plan, memory_bound = _split_by_speed(
                        cfg, pools, replicas, base, per_step, precision
                    )
                    if plan is None and memory_bound and offloadable(pools, fixed):
                        # what does not fit may with the optimizer in host memory, as the
                        # homogeneous search offers it (ZeRO-Offload)
                        offloaded = base.replace(offload=True)
                        if all(host_holds(cfg, offloaded, p.gpu, precision) for p in pools):
                            plan, _ = _split_by_speed(
                                cfg, pools, replicas, offloaded, per_step, precision
                            )
                    if plan is not None:
                        plans.append(plan)
                    if not memory_bound:
                        break  # recomputation only buys memory, and memory did not bind
    return plans


def _split_by_speed(cfg, pools, replicas, base: Layout, per_step: int, precision: str):
    """The least step time T at which every pool's replicas, each at the largest
    micro-batch that runs within T and fits its memory, cover ``per_step`` samples; then
    the surplus is taken back one sample at a time from the slowest replica. Returns the
    plan (None if there is none) and whether memory capped some pool's micro-batch."""
    times = []  # times[i][b - 1]: pool i's step at micro-batch b (up to what fits)
    memory_bound = False
    for pool, r in zip(pools, replicas):
        row = []  # no replica takes more than the pool's whole share alone would
        for b in range(1, min(MAX_MICRO_BATCH, -(-per_step // r)) + 1):
            layout = base.replace(micro_batch=b)
            if _peak(cfg, layout, precision) > pool.gpu.memory_bytes:
                memory_bound = True
                break
            row.append(_step(cfg, layout, pool.cluster, precision))
        times.append(row)
    if any(not row for row in times):
        return None, memory_bound  # a pool fits not even one sample per micro-step
    if sum(r * len(row) for r, row in zip(replicas, times)) < per_step:
        return None, memory_bound  # together they cannot hold the step's samples
    for limit in sorted({t for row in times for t in row}):
        sizes = [sum(1 for t in row if t <= limit) for row in times]
        if all(sizes) and sum(r * b for r, b in zip(replicas, sizes)) >= per_step:
            break
    owner = [i for i, r in enumerate(replicas) for _ in range(r)]  # replica → pool
    weights = [sizes[i] for i in owner]
    for _ in range(sum(weights) - per_step):  # the surplus, from the slowest replica first
        j = max(
            (j for j in range(len(weights)) if weights[j] > 1),
            key=lambda j: (times[owner[j]][weights[j] - 1], weights[j]),
        )
        weights[j] -= 1
    cut = [sum(replicas[:i]) for i in range(len(replicas) + 1)]
    shares = tuple(
        (p.key, r, tuple(weights[cut[i] : cut[i + 1]]))
        for i, (p, r) in enumerate(zip(pools, replicas))
    )
    pool_times = tuple(times[i][max(share[2]) - 1] for i, share in enumerate(shares))
    step = max(pool_times)
    layout = base.replace(micro_batch=per_step // len(weights))  # the mean, as --micro-batch
    tokens = per_step * base.microbatches * cfg.seq_len / step
    plan = MixedPlan(
        "data parallel by speed", layout, step, tokens, shares, tuple(weights), pool_times
    )
    return plan, memory_bound


def _ranked(plans: list[MixedPlan]) -> list[MixedPlan]:
    """Fastest first in steps of 1 % (the model's resolution), the simpler plan first within
    a step (as :func:`paracube.planner.search.rank`); a plan that differs from a better one
    only by a higher ZeRO stage and gains nothing from it is dropped."""
    if not plans:
        return []
    best = min(p.step_time for p in plans)
    plans.sort(key=lambda p: (int((p.step_time - best) / (0.01 * best)), simplicity(p.layout)))
    kept, seen = [], set()
    for plan in plans:
        key = (plan.kind, plan.layout.replace(zero=0), plan.shares, round(plan.step_time, 6))
        if key not in seen:
            seen.add(key)
            kept.append(plan)
    return kept


@cache
def _step(cfg: ModelConfig, layout: Layout, cluster: Cluster, precision: str) -> float:
    return estimate(cfg, layout, cluster, precision).step_time


@cache
def _peak(cfg: ModelConfig, layout: Layout, precision: str) -> float:
    return peak_memory(cfg, layout, precision).total


def plan_mixed(
    cfg: ModelConfig,
    pools: list[Pool],
    global_batch: int,
    precision: str | None = None,
    fixed=None,
    allowed: dict | None = None,
) -> tuple[list[MixedPlan], MixedPlan | None]:
    """The speed-aware plans, fastest first, and the all-as-the-slowest plan they beat;
    ``allowed`` keeps only what a stack runs, as in :func:`~paracube.planner.search.search`;
    ``precision`` by default the pools' own (:func:`~paracube.planner.hardware.
    default_precision`: fp16 with V100s among them).

    >>> from paracube.models.presets import preset
    >>> pools = parse_pools("8xa100-80gb,8xv100", gpus_per_node=8)
    >>> plans, slowest = plan_mixed(preset("gpt3-1.3b"), pools, global_batch=512)
    >>> best = plans[0]
    >>> best.kind, [(key, replicas, max(sizes)) for key, replicas, sizes in best.shares]
    ('data parallel by speed', [('a100-80gb', 8, 11), ('v100', 8, 5)])
    >>> best.tokens_per_s > 1.5 * slowest.tokens_per_s  # the A100s do more than their share
    True
    """
    if cfg.moe:
        raise ConfigError(
            f"{cfg.name} is a mixture of experts on a mixed cluster: expert parallelism is "
            "not planned over device types; plan it on one type of GPU"
        )
    fixed = fixed or {}
    precision = precision or hw.default_precision([p.gpu for p in pools])
    if "tp" in fixed:
        check_tp(pools, fixed["tp"])
    plans = data_parallel_plans(cfg, pools, global_batch, precision, fixed)
    plans += pipeline_plans(cfg, pools, global_batch, precision, fixed)
    allowed = allowed or {}
    plans = _ranked(
        [p for p in plans if all(getattr(p.layout, k) in v for k, v in allowed.items())]
    )
    best, _ = slowest_plan(cfg, pools, global_batch, precision, fixed, allowed)
    slowest = None
    if best is not None:
        t = best.time
        slowest = MixedPlan("all as the slowest", best.layout, t.step_time, t.tokens_per_s)
    return plans, slowest
