"""``paracube plan --gpus 8xa100-80gb,8xv100``: a mixed cluster's plans, against planning
every GPU as the slowest (the math is :mod:`paracube.planner.mixed`). Torch-free."""

from __future__ import annotations

import json
from dataclasses import asdict

from paracube.cli.plan_budget import budget_text, duration, training_tokens
from paracube.cli.plan_inputs import plan_fixed, plan_model
from paracube.config import ModelConfig
from paracube.errors import ParacubeError
from paracube.planner.mixed import plan_mixed
from paracube.planner.pools import MixedPlan, Pool
from paracube.planner.reasons import seconds_text
from paracube.planner.report import describe, model_args

GB = 1e9


def cmd_plan_mixed(args, pools: list[Pool]) -> int:
    if args.model and not _is_transformer(args.model):
        raise ParacubeError(
            f"--model {args.model}: mixed clusters are planned for transformer models; "
            f"plan {args.model} on one device type (--gpus N --gpu TYPE)"
        )
    if args.emit == "megatron":
        raise ParacubeError(
            "--emit megatron on a mixed cluster: Megatron-LM gives every rank the same share; "
            "plan one device type (--gpus N --gpu TYPE) for its command"
        )
    cfg = plan_model(args)
    tokens = training_tokens(args, cfg)
    fixed = plan_fixed(args, args.gpus, mixed=True)
    if fixed.get("cp", 1) > 1:
        raise ParacubeError(
            f"--layout cp={fixed['cp']}: context parallelism is planned on one device type "
            "(--gpus N --gpu TYPE), not on a mixed cluster"
        )
    if fixed.get("shard"):
        raise ParacubeError(
            f"--shard-group {fixed['shard']}: hybrid sharding is planned on one device type "
            "(--gpus N --gpu TYPE), not on a mixed cluster"
        )
    if fixed.get("split", "engine") != "engine":
        stated = (
            f"--pipeline-split {fixed['split']}"
            if args.split is not None
            else f"--stack {args.stack} (Megatron's even pipeline split)"
        )
        raise ParacubeError(
            f"{stated}: a mixed cluster's stages are cut by each pool's speed; plan the even "
            "splits on one device type (--gpus N --gpu TYPE)"
        )
    from paracube.planner.stacks import stack_choices

    plans, slowest = plan_mixed(
        cfg, pools, args.global_batch, args.precision, fixed, stack_choices(args.stack)
    )
    if not plans:
        _why_nothing_plans(cfg, pools, args, fixed, stack_choices(args.stack))
    if args.json:
        print(json.dumps(_json(cfg, pools, plans[: args.top], slowest, tokens)))
        return 0
    print(
        f"{cfg.name} on a mixed cluster: {_cluster_text(pools)}, global batch {args.global_batch} "
        f"× {cfg.seq_len} tokens, {args.precision}"
        + (f", as {args.stack} runs it" if args.stack not in (None, "paracube") else "")
        + f"; {len(plans)} plans evaluated\n"
    )
    print(_table(plans[: args.top], slowest))
    print("\n" + headline(plans[0], slowest, pools))
    if args.explain:
        print("\n" + explain(plans[0], pools))
    if tokens is not None:
        print("\n" + time_to_train(args, cfg, tokens, plans[0], slowest))
    if args.emit == "torchrun":
        command = torchrun_command(
            plans[0], args.model, args.gpus_per_node, args.precision, args.seq, pools
        )
        print("\n" + command)
    return 0


def _why_nothing_plans(cfg, pools: list[Pool], args, fixed: dict, allowed: dict) -> None:
    """Refuse a mixed cluster nothing plans on, naming the cause: the fixed choices that
    rule every plan out, a global batch too small to give every GPU work, or the memory."""
    cluster = _cluster_text(pools)
    shaping = {k: v for k, v in fixed.items() if k in SHAPING}
    free = {k: v for k, v in fixed.items() if k not in SHAPING}
    if shaping and plan_mixed(cfg, pools, args.global_batch, args.precision, free, allowed)[0]:
        degrees = ",".join(f"{k}={v}" for k, v in shaping.items() if k in ("dp", "tp", "pp"))
        given = " ".join(
            ([f"--layout {degrees}"] if degrees else [])
            + [f"--{k.replace('_', '-')} {v}" for k, v in shaping.items() if k not in ("dp", "tp", "pp")]
        )  # fmt: skip
        raise ParacubeError(
            f"{cfg.name} fits no plan on {cluster} with {given}: each type holds whole replicas "
            "(data parallel by speed) or whole groups of every replica's stages (pipeline "
            "stages by speed); without those choices it plans — relax them"
        )
    gpus = sum(p.count for p in pools)
    for other in nearby_batches(args.global_batch, gpus):
        if plan_mixed(cfg, pools, other, args.precision, fixed, allowed)[0]:
            why = (
                "too little work to share over"
                if other > args.global_batch and args.global_batch < gpus
                else "it does not split into whole micro-batches over"
            )
            raise ParacubeError(
                f"{cfg.name} fits no plan on {cluster} for global batch {args.global_batch}: "
                f"{why} {gpus} GPUs by speed (each replica takes a whole number of samples of "
                "every micro-step, their mean whole as paracube train's --dp-balance needs; "
                "each pipeline at least as many micro-batches as stages) — a global batch of "
                f"{other} plans; or use fewer GPUs"
            )
    raise ParacubeError(
        f"{cfg.name} fits no plan on {cluster} for global batch {args.global_batch}: "
        "use more GPUs, GPUs with more memory, or a smaller global batch"
    )


def nearby_batches(batch: int, gpus: int) -> list[int]:
    """Global batches to try when ``batch`` plans on no mixed cluster of ``gpus`` GPUs,
    nearest first: the multiples of ``gpus`` either side of it (every replica a whole mean
    micro-batch), then 2, 3, 4 and 8 times it (enough micro-steps for a pipeline).

    >>> nearby_batches(64, 18), nearby_batches(8, 9)
    ([72, 54, 128, 192, 256, 512], [9, 16, 24, 32, 64])
    """
    below = batch // gpus * gpus
    multiples = sorted({n for n in (below, below + gpus) if n > 0 and n != batch},
                       key=lambda n: (abs(n - batch), n))  # fmt: skip
    return multiples + [batch * k for k in (2, 3, 4, 8) if batch * k not in multiples]


# the fixed choices that shape a plan's replicas (--layout and the flags that name a
# layout's degree, micro-batch, schedule, ZeRO stage or recomputation)
SHAPING = ("dp", "tp", "pp", "micro_batch", "schedule", "chunks", "zero", "recompute")


def time_to_train(args, cfg, tokens: float, best: MixedPlan, slowest: MixedPlan | None) -> str:
    """--epochs or --train-tokens on a mixed cluster: the time with the speed-aware plan, and
    with every GPU planned as the slowest when that fits."""
    line = f"{budget_text(args, cfg)}: {duration(tokens, best.tokens_per_s)} with {best.kind}"
    if slowest is not None:
        line += f", against {duration(tokens, slowest.tokens_per_s)} with all as the slowest"
    return line + "."


def _is_transformer(name: str) -> bool:
    from paracube.planner.generic import generic

    return generic(name) is None


def _cluster_text(pools: list[Pool]) -> str:
    return " + ".join(f"{p.count} × {p.gpu.name}" for p in pools)


def stage_blocks(sizes: tuple[int, ...]) -> str:
    """A pool's stages' blocks (``1/1/2 blocks``); a stage of none holds the head alone — the
    pipeline's last, which the engine's cut may give nothing else."""
    blocks = [str(n) for n in sizes if n]
    text = f"{'/'.join(blocks)} blocks" if blocks else ""
    if len(blocks) < len(sizes):
        text = f"{text} and one of the head alone" if text else "the head alone"
    return text


def where(plan: MixedPlan) -> str:
    """What each pool does: its replicas' micro-batches, or its stages' blocks."""
    parts = []
    for key, n, sizes in plan.shares:
        if plan.kind.startswith("data parallel"):
            spread = (
                f"b={min(sizes)}" if min(sizes) == max(sizes) else f"b={min(sizes)}–{max(sizes)}"
            )
            parts.append(f"{key}: {n} replicas × {spread}")
        else:
            parts.append(f"{key}: {n} stage(s) of {stage_blocks(sizes)}")
    return "; ".join(parts)


def _table(plans: list[MixedPlan], slowest: MixedPlan | None) -> str:
    rows = [
        "| # | plan | layout (per replica) | each device type | step | tokens/s | ÷ all as slowest |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for i, plan in enumerate(plans, 1):
        ratio = f"{plan.tokens_per_s / slowest.tokens_per_s:.2f}×" if slowest else "—"
        rows.append(
            f"| {i} | {plan.kind} | {describe(plan.layout)} | {where(plan)} | "
            f"{seconds_text(plan.step_time)} | {plan.tokens_per_s:,.0f} | {ratio} |"
        )
    if slowest is not None:
        rows.append(
            f"| — | {slowest.kind} | {describe(slowest.layout)} | every GPU as the slowest type | "
            f"{seconds_text(slowest.step_time)} | {slowest.tokens_per_s:,.0f} | 1.00× |"
        )
    return "\n".join(rows)


def headline(best: MixedPlan, slowest: MixedPlan | None, pools: list[Pool]) -> str:
    if slowest is None:
        return (
            "Planned as if every GPU were the slowest with the smallest memory, the model fits no "
            f"layout: only the speed-aware plan runs it ({seconds_text(best.step_time)} per step)."
        )
    slow = min(pools, key=lambda p: p.gpu.peak_flops * p.gpu.sustained_fraction)
    gpus = sum(p.count for p in pools)
    saved = slowest.step_time - best.step_time
    if abs(saved) < 0.005 * slowest.step_time:  # inside the model's resolution
        return (
            f"The speed-aware plan takes the {seconds_text(best.step_time)} per step of the best plan that "
            f"treats all {gpus} GPUs as {slow.gpu.name}s: the types "
            "differ too little in speed here for an uneven share to gain anything."
        )
    if saved < 0:  # the uniform plan's search ranges wider (interleaved chunks, any split)
        return (
            f"The speed-aware plan takes {seconds_text(best.step_time)} per step, {seconds_text(-saved)} more than "
            f"the {seconds_text(slowest.step_time)} of the best plan that treats all "
            f"{gpus} GPUs as {slow.gpu.name}s ({describe(slowest.layout)}): "
            "here the speeds buy nothing the layouts a uniform plan can take do not — run that one."
        )
    return (
        f"The speed-aware plan takes {seconds_text(best.step_time)} per step against {seconds_text(slowest.step_time)} "
        f"for the best plan that treats all {gpus} GPUs as {slow.gpu.name}s: "
        f"{seconds_text(saved)} saved per step ({saved / slowest.step_time:.0%}), "
        f"{best.tokens_per_s / slowest.tokens_per_s:.2f}× the throughput."
    )


def _short_time(seconds: float) -> str:
    """A micro-batch's time in the unit that reads: 530 ms, 1.09 s (never 1.09e+03 ms)."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else seconds_text(seconds)


def explain(plan: MixedPlan, pools: list[Pool]) -> str:
    by_key = {p.key: p for p in pools}
    lines = [f"Why {plan.kind} ({describe(plan.layout)}):"]
    rates = {k: p.gpu.peak_flops * p.gpu.sustained_fraction for k, p in by_key.items()}
    slowest_rate = min(rates.values())
    for (key, n, sizes), seconds in zip(plan.shares, _per_pool_times(plan)):
        gpu = by_key[key].gpu
        speed = rates[key] / slowest_rate
        if plan.kind.startswith("data parallel"):
            lines.append(
                f"- {gpu.name} ({speed:.2f}× the slowest type's sustained tensor-core rate, "
                f"{gpu.memory_bytes / GB:.0f} GB): its {n} replicas take {sum(sizes)} of every "
                f"micro-step's {sum(plan.weights)} samples; their step takes {seconds_text(seconds)}."
            )
        else:
            lines.append(
                f"- {gpu.name} ({speed:.2f}× the slowest type's rate, {gpu.memory_bytes / GB:.0f} GB): "
                f"{n} stage(s) of each pipeline, {stage_blocks(sizes)}, "
                f"{_short_time(seconds)} per micro-batch at the busiest."
            )
    lines.append(
        "- Tensor-parallel groups stay inside one device type's node; the step is set by the "
        "slowest replica or stage, so each gets work until they finish together."
    )
    return "\n".join(lines)


def _per_pool_times(plan: MixedPlan) -> list[float]:
    if plan.kind.startswith("data parallel"):
        return list(plan.pool_times)
    times, at = [], 0
    for _, n, _ in plan.shares:
        times.append(max(plan.pool_times[at : at + n]))
        at += n
    return times


def torchrun_command(
    plan: MixedPlan,
    preset_name: str | None,
    gpus_per_node: int,
    precision: str,
    seq_len: int | None = None,
    pools: list[Pool] | None = None,
) -> str:
    """The launch line, pools' nodes in the order listed (data-parallel ranks in that order
    take the shares in --dp-balance): the same command on every node where every node runs
    as many ranks, else one line per device type — a pool smaller than a node runs fewer
    (torchrun's agents may differ in --nproc-per-node: each worker's global rank counts the
    workers of the agents before it)."""
    L = plan.layout
    model = model_args(preset_name, seq_len)
    args = L.to_args(precision, gpus_per_node)
    if plan.weights:  # --micro-batch is the mean; each rank's share comes from the weights
        args.append(f"--dp-balance {','.join(map(str, plan.weights))}")
    else:
        args.append("--balance speed")
    per_node = [
        (pool.key, -(-pool.count // gpus_per_node), min(pool.count, gpus_per_node))
        for pool in (pools or [])
    ] or [("", -(-L.gpus // gpus_per_node), min(L.gpus, gpus_per_node))]
    nodes = sum(n for _, n, _ in per_node)

    def line(procs: int) -> str:
        return (
            f"torchrun --nnodes {nodes} --nproc-per-node {procs} --rdzv-backend c10d "
            f"--rdzv-endpoint $MASTER:29500 -m paracube train {model} {' '.join(args)}"
        )

    if len({procs for _, _, procs in per_node}) == 1:
        return line(per_node[0][2])
    return "\n".join(
        f"# on {'the' if n == 1 else f'each of the {n}'} {key} node{'s' if n > 1 else ''}:\n"
        + line(procs)
        for key, n, procs in per_node
    )


def _json(
    cfg: ModelConfig, pools: list[Pool], plans: list[MixedPlan], slowest, tokens: float | None
) -> dict:
    return {
        "model": cfg.name,
        "pools": [{"gpu": p.key, "count": p.count} for p in pools],
        "plans": [asdict(p) for p in plans],
        "all_as_slowest": asdict(slowest) if slowest else None,
        # --epochs / --train-tokens: the budget in tokens and the seconds to train it with
        # the speed-aware plan and with all planned as the slowest (as on one device type)
        "time_to_train": None
        if tokens is None
        else {
            "tokens": tokens,
            "seconds": tokens / plans[0].tokens_per_s,
            "all_as_slowest_seconds": None if slowest is None else tokens / slowest.tokens_per_s,
        },
    }
