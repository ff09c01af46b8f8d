"""Pipelines across a mixed cluster's pools: each replica's stages on every device type,
blocks cut by each stage's own speed and memory (:mod:`paracube.planner.mixed`)."""

from __future__ import annotations

import math

from paracube.choices import ELEMENT_BYTES, RECOMPUTE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.pipeline.partition import partition
from paracube.pipeline.schedules import SCHEDULES, get_schedule
from paracube.planner.dp_comm import dp_exposed_time
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_bytes
from paracube.planner.mp_comm import block_tp_comm, pp_transfer_time
from paracube.planner.pools import (
    MAX_MICRO_BATCH,
    MixedPlan,
    Pool,
    offloadable,
    tp_fits_nodes,
)
from paracube.planner.search import divisors, software
from paracube.planner.time_model import (
    at_precision,
    block_gemm_time,
    head_time,
    layer_time,
    optimizer_time,
    pass_costs,
    recompute_time,
)


def pipeline_plans(
    cfg: ModelConfig, pools: list[Pool], global_batch: int, precision: str, fixed: dict
) -> list[MixedPlan]:
    """Every pipeline whose stages span the pools (pool i: ``s_i`` stages of each of R
    replicas), blocks cut by each stage's own speed and memory."""
    order = sorted(pools, key=lambda p: -p.gpu.memory_bytes)
    common = math.gcd(*(p.count for p in pools))
    plans = []
    for tp in divisors(common):
        if not all(tp_fits_nodes(p, tp) for p in pools):
            continue
        if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
            continue
        for dp in divisors(common // tp):
            stages = tuple(p.count // (dp * tp) for p in order)
            pp = sum(stages)
            if pp > cfg.n_layers or global_batch % dp:
                continue
            for b in divisors(global_batch // dp):
                m = global_batch // (dp * b)
                if b > MAX_MICRO_BATCH or m < pp:
                    continue
                for schedule, zero, recompute in (
                    (s, z, r)
                    for s in _schedules(pp, m, fixed)
                    for z in (0, 1, 2)
                    for r in RECOMPUTE
                ):
                    layout = Layout(
                        dp=dp, tp=tp, pp=pp, micro_batch=b, microbatches=m, zero=zero,
                        recompute=recompute, sequence_parallel=tp > 1, schedule=schedule,
                        **software(fixed),
                    )  # fmt: skip
                    if all(getattr(layout, k) == v for k, v in fixed.items()):
                        plan = _pipeline(cfg, order, stages, layout, precision)
                        if plan is None and offloadable(pools, fixed):  # as data_parallel_plans
                            offloaded = layout.replace(offload=True)
                            plan = _pipeline(cfg, order, stages, offloaded, precision)
                        if plan is not None:
                            plans.append(plan)
    return plans


def _schedules(p: int, m: int, fixed: dict) -> list[str]:
    """The one-chunk schedules a replica's pipeline can run at (p, m) — the blocks are cut
    per stage, not per chunk — those another dominates where both run (GPipe under 1F1B)
    only when asked for, as the homogeneous search does (:func:`~paracube.planner.search.search`):
    so the speed-aware plans are not held to 1F1B's bubble where the all-as-the-slowest plan
    they are compared with may take zero-bubble's."""
    names = []
    for name, sched in SCHEDULES.items():
        if sched.chunked or fixed.get("schedule", name) != name:
            continue
        if "schedule" not in fixed and sched.dominated_at(p, m):
            continue
        try:
            sched.check(p, m)
        except ConfigError:
            continue
        names.append(name)
    return names


def _pipeline(cfg: ModelConfig, order, stages, layout: Layout, precision: str):
    """The layers of each stage by its pool's speed and memory, and the step they make. The
    cut is the engine's (``--balance speed``, :mod:`paracube.pipeline.speed`): of its chain
    ``embed, blocks, norm, head`` (:func:`~paracube.models.shapes.chain_names`), so the last
    stage may hold the head alone where its time outweighs a block's."""
    elem, fp8 = ELEMENT_BYTES[precision], precision == "fp8"
    pool_of = [i for i, s in enumerate(stages) for _ in range(s)]  # stage → pool
    L, p, m = cfg.n_layers, layout.pp, layout.microbatches
    block, head, passes = [], [], []
    for pool in order:  # one block's and the head's forward + backward, per micro-batch
        cluster = at_precision(pool.cluster, precision)  # the precision's matmul units
        g = cluster.gpu
        fwd, bwd, _ = layer_time(cfg, layout, g, elem, fp8)
        redo = recompute_time(cfg, layout, g, elem, fp8, fwd)
        passes.append(pass_costs(cfg, layout, g, elem, fp8, fwd, bwd, redo))
        gemms = sum(block_gemm_time(cfg, layout, g, elem, fp8))
        tp = block_tp_comm(cfg, layout, cluster, elem, gemms)
        block.append(fwd + bwd + redo + tp)
        head.append(head_time(cfg, layout, g, elem))  # the final norm, logits and loss
    # a stage's bytes are affine in its blocks (states, activations, the 10 % allowance);
    # the embedding's and the head's are the first and the last stage's (stage_bytes)
    empty = [stage_bytes(cfg, layout, k, 0, precision).total for k in range(p)]
    per_block = [stage_bytes(cfg, layout, k, 1, precision).total - empty[k] for k in range(p)]

    def blocks_in(start: int, end: int) -> int:  # chain layers 1 … L are the blocks
        return max(0, min(end, L + 1) - max(start, 1))

    def load(part: int, layer: int) -> float:
        if 1 <= layer <= L:
            return block[pool_of[part]]
        # the embedding's lookup and the norm weigh nothing beside a block; the norm's time
        # is in the head's
        return head[pool_of[part]] if layer == L + 2 else 0.0

    if layout.offload:  # the states each stage moves to its host, affine in its blocks too
        kept = layout.replace(offload=False)
        states = [
            [stage_bytes(cfg, held, k, n, precision).model_states for n in (0, 1)]
            for k in range(p)
            for held in (kept, layout)
        ]  # [kept at 0, 1 blocks], [offloaded at 0, 1 blocks] per stage, interleaved
        moved_empty = [states[2 * k][0] - states[2 * k + 1][0] for k in range(p)]
        moved_block = [states[2 * k][1] - states[2 * k + 1][1] - moved_empty[k] for k in range(p)]

    def fits(part: int, start: int, end: int) -> bool:
        gpu = order[pool_of[part]].gpu
        need = empty[part] + blocks_in(start, end) * per_block[part]
        if layout.offload:
            moved = moved_empty[part] + blocks_in(start, end) * moved_block[part]
            if moved > gpu.host_memory_bytes:
                return False
        return need <= gpu.memory_bytes

    try:
        bounds = partition(L + 3, p, load, fits)
    except ConfigError:
        return None  # no cut fits every stage
    stage_times = [sum(load(k, i) for i in range(a, b)) for k, (a, b) in enumerate(bounds)]
    busiest = max(stage_times)
    link = order[0].cluster  # stages on different pools meet over the inter-node link
    # the bubble at the busiest stage's pool's pass costs, as the uniform plans charge it
    costs = passes[pool_of[stage_times.index(busiest)]]
    bubble = get_schedule(layout.schedule).idle_over_busy(p, m, 1, *costs) * m * busiest
    rest = []
    for k, (a, b) in enumerate(bounds):  # each stage's gradient reduction and optimizer
        pool = order[pool_of[k]]
        held = blocks_in(a, b)
        shard = held * shapes.block_params(cfg, tp=layout.tp)
        dp_exposed = dp_exposed_time(layout, pool.cluster, shard, stage_times[k], cfg, held, elem)
        optimizer = optimizer_time(layout, pool.gpu, shard, elem)
        rest.append(m * stage_times[k] + dp_exposed + optimizer)
    step = max(rest) + bubble + pp_transfer_time(cfg, layout, link, elem)
    shares = tuple(
        (pool.key, s, tuple(blocks_in(a, b) for k, (a, b) in enumerate(bounds) if pool_of[k] == i))
        for i, (pool, s) in enumerate(zip(order, stages))
    )
    tokens = layout.dp * layout.micro_batch * m * cfg.seq_len / step
    return MixedPlan(
        "pipeline stages by speed", layout, step, tokens, shares, (), tuple(stage_times)
    )
