"""``paracube plan``: what it runs — the search, the speed-up's baseline, the report and
what it says when nothing fits (the planner itself is ``paracube.planner``; the arguments:
:mod:`paracube.cli.plan_args`; their checks: :mod:`paracube.cli.plan_inputs`; the training
budget: :mod:`paracube.cli.plan_budget`).

Torch-free: planning a 1T-parameter model on thousands of GPUs answers in well under a
second, without importing torch.
"""

from __future__ import annotations

import math
from argparse import Namespace

from paracube.cli.plan_args import add_parser
from paracube.cli.plan_budget import time_to_train, training_seconds, training_tokens
from paracube.cli.plan_inputs import (
    BLOCK,
    MAX_GPUS,
    SHAPE,
    SOFTWARE,
    check_args,
    cluster_of,
    parse_gpus,
    plan_fixed,
    plan_model,
    set_default_precision,
)
from paracube.config import ModelConfig
from paracube.errors import ParacubeError

__all__ = ["add_parser", "cmd_plan"]


def cmd_plan(args) -> int:
    if args.calibrate:  # the same as `paracube calibrate`
        from paracube.cli.calibrate import cmd_calibrate

        return cmd_calibrate(args)
    mixed = parse_gpus(args)
    set_default_precision(args, mixed)
    check_args(args, whole_nodes=mixed is None)  # a mixed cluster's pools are checked apart
    if mixed is not None:
        from paracube.cli.plan_mixed import cmd_plan_mixed

        return cmd_plan_mixed(args, mixed)
    from paracube.planner.generic import generic

    other = generic(args.model) if args.model else None
    shape = [
        f"--{k.replace('_', '-')}"
        for k in (*SHAPE, *BLOCK, "recompute_blocks")
        if getattr(args, k) is not None
    ]
    if other is not None and shape:
        raise ParacubeError(
            f"{' '.join(shape)} with --model {args.model}: it is not a transformer and its "
            f"shape is fixed; drop {' '.join(shape)}"
        )
    if other is not None and args.emit == "megatron":
        raise ParacubeError(
            f"--emit megatron with --model {args.model}: Megatron-LM's pretrain_gpt.py trains "
            "transformers; drop --emit megatron"
        )
    if other is not None and args.stack is not None:
        from paracube.planner.generic import GENERIC_SOFTWARE
        from paracube.planner.stacks import stack

        unmodelled = sorted(set(stack(args.stack)) - set(GENERIC_SOFTWARE))
        if unmodelled:
            raise ParacubeError(
                f"--stack {args.stack} with --model {args.model}: it is described without layers, "
                f"and the stack's {', '.join(unmodelled)} describe blocks it does not have; use "
                "--stack paracube or fsdp"
            )
    cfg = other or plan_model(args)  # a transformer (ModelConfig) or a generic model
    if isinstance(cfg, ModelConfig) and args.emit == "torchrun":
        from paracube.validate import untrainable

        refusal = untrainable(cfg)  # what paracube train would refuse at launch
        if refusal:
            raise ParacubeError(f"--emit torchrun: {refusal}")
    if isinstance(cfg, ModelConfig) and args.emit == "megatron":
        from paracube.planner.megatron import model_refusal

        refusal = model_refusal(cfg)
        if refusal:
            raise ParacubeError(f"--emit megatron: {refusal}")
    training_tokens(args, cfg)  # refused before the search, not after its table
    if other is not None and args.global_batch % args.gpus:
        lower = args.global_batch // args.gpus * args.gpus
        multiples = " or ".join(str(n) for n in (lower, lower + args.gpus) if n > 0)
        raise ParacubeError(
            f"--global-batch {args.global_batch} does not divide over --gpus {args.gpus}: "
            f"{cfg.name} is planned data parallel only (one replica per GPU); use {multiples}"
        )
    cluster = cluster_of(args)
    from paracube.planner.time_model import at_precision, kernel_refusal

    at_precision(cluster, args.precision)  # units the GPU lacks: refused before the search
    fixed = plan_fixed(args, args.gpus)
    refusal = kernel_refusal(fixed.get("attention", "fused"), cluster.gpu, args.precision)
    if refusal:
        raise ParacubeError(refusal)
    # ep above 1, or any etp: the experts' layout, which a dense model has none of
    experts = [f"ep={fixed['ep']}"] if fixed.get("ep", 1) > 1 else []
    if fixed.get("etp"):
        experts.append(f"etp={fixed['etp']}")
    dense = not (isinstance(cfg, ModelConfig) and cfg.moe)
    if experts and dense:
        what = ",".join(experts)
        raise ParacubeError(
            f"--layout {what}: expert parallelism spreads a mixture of experts, and "
            f"{cfg.name} is dense; drop {what}, or plan a mixture (--experts, a preset such as "
            "mixtral-8x7b)"
        )
    # the token dispatch's facts, stated for a model with no tokens to dispatch
    dispatch = [
        f"--{k.replace('_', '-')} {fixed[k]}" for k in ("ep_dispatch", "router") if k in fixed
    ]
    if dispatch and dense:
        what = " ".join(dispatch)
        raise ParacubeError(
            f"{what}: how a mixture of experts dispatches its tokens, and {cfg.name} is dense; "
            "drop it, or plan a mixture (--experts, a preset such as mixtral-8x7b)"
        )
    result = _search(args, cfg, cluster, fixed)
    if not result.ranked:
        return _nothing_fits(result, cfg, cluster, args)
    _print(args, cfg, cluster, result)
    return 0


def _search(args, cfg, cluster, fixed: dict):
    """Rank the layouts: every 3D layout of a transformer, data parallel only otherwise."""
    from paracube.planner.generic import search_generic
    from paracube.planner.search import search

    if isinstance(cfg, ModelConfig):
        from paracube.planner.stacks import search_options

        return search(
            cfg,
            cluster,
            args.gpus,
            args.global_batch,
            precision=args.precision,
            fixed=fixed,
            top=args.top,
            **search_options(args.stack, split_chosen=args.split is not None),
        )
    if fixed.get("tp", 1) != 1 or fixed.get("pp", 1) != 1 or fixed.get("cp", 1) != 1:
        raise ParacubeError(
            f"{cfg.name} is planned for data parallelism only: use --layout dp={args.gpus}"
        )
    per_model = {k: v for k, v in fixed.items() if k not in ("dp", "tp", "pp")}
    return search_generic(cfg, cluster, args.gpus, args.global_batch, args.precision, per_model)


def _generic_zero_reason(model, best, cluster, precision: str) -> str:
    """Why a model described without layers is sharded: its ZeRO stage's states over the
    data-parallel group, and the replicated twin's fit and step (reasons.without_zero_text)."""
    from paracube.planner.generic import evaluate
    from paracube.planner.reasons import without_zero_text

    L = best.layout
    memory, other = evaluate(model, L.replace(zero=0), cluster, precision)
    sharded, then = {
        1: ("the optimizer states", "steps its slice and all-gathers the updated parameters"),
        2: (
            "the optimizer states and the gradients",
            "reduce-scatters the gradients, steps its slice and all-gathers the updated parameters",
        ),
        3: (
            "the optimizer states, the gradients and the parameters",
            "gathers the parameters for each forward and backward and reduce-scatters the "
            "gradients",
        ),
    }[L.zero]
    return (
        f"- ZeRO-{L.zero} shards {sharded} over the {L.dp} GPUs; each {then}. "
        + without_zero_text(best, memory.total, other, cluster.gpu.memory_bytes)
    )


def _baseline_counts(gpus: int, node: int) -> list[int]:
    """The GPU counts a speed-up is measured from, fewest first: 1, then 1, 2, 4… nodes —
    all below ``gpus`` (a plan on one GPU has no speed-up)."""
    nodes = [node * 2**k for k in range(gpus.bit_length())]
    return [c for c in dict.fromkeys([1, *nodes]) if c < gpus]


def _baseline(args, cfg, cluster):
    """The fastest layout for the same global batch on one GPU — or, for a model that does
    not fit on one, on one node, two, four… (the fewest of those below --gpus that hold it,
    as scaling studies start from the smallest run that fits) — for the speed-up column
    (None: none fits)."""
    from argparse import Namespace

    from paracube.planner.report import Baseline

    # the same software (its attention kernel, whether and in what dtype it reduces), any layout
    software = {k: v for k, v in plan_fixed(args, args.gpus).items() if k in SOFTWARE}
    for gpus in _baseline_counts(args.gpus, cluster.gpus_per_node):
        few = Namespace(**{**vars(args), "gpus": gpus, "top": 1})
        ranked = _search(few, cfg, cluster, software).ranked
        if ranked:
            return Baseline(gpus, ranked[0])
    return None


def _print(args, cfg, cluster, result) -> None:
    """The plan: the ranked table with its speed-up column, --explain's reasons, the time
    to train, ResNet-50's published check and the emitted command — or all of it as --json."""
    from paracube.planner.published import track_record as record_of
    from paracube.planner.report import (
        describe,
        explain,
        scaling,
        table,
        torchrun_command,
        track_record,
    )

    g = cluster.gpu
    baseline = _baseline(args, cfg, cluster) if result.ranked else None
    wanted = args.json or args.explain
    moe = getattr(cfg, "moe", None)  # a transformer's: dense or a mixture
    record = record_of(args.stack, args.gpu.lower(), args.precision, moe) if wanted else None
    if args.json:
        _print_json(args, cfg, g, result, baseline, record)
        return
    transformer = cfg if isinstance(cfg, ModelConfig) else None
    unit = f"× {transformer.seq_len} tokens" if transformer is not None else "samples"
    print(
        f"{cfg.name}: {args.gpus} × {g.name} ({cluster.gpus_per_node} per node), global batch {args.global_batch} "
        f"{unit}, {args.precision}"
        + (f", as {args.stack} runs it" if args.stack not in (None, "paracube") else "")
        + f"; {result.evaluated:,} layout{'s' if result.evaluated != 1 else ''} evaluated, "
        f"{result.fitting:,} fit\n"
    )
    print(table(result.ranked[: args.top], cluster, baseline))
    if baseline is None and result.ranked and args.gpus > 1:
        tried = _baseline_counts(args.gpus, cluster.gpus_per_node)
        print(
            f"\nNo speed-up column: {cfg.name} fits on none of the fewer-GPU runs it would be "
            f"measured from ({', '.join(map(str, tried))} GPU{'s' if tried[-1] > 1 else ''})."
        )
    if args.explain and result.ranked:
        text = (
            explain(result, transformer, cluster, args.gpus, args.precision)
            if transformer is not None
            else ""
        )
        if baseline is not None and result.ranked[0].layout.gpus > baseline.gpus:
            text += ("\n" if text else f"Why {describe(result.ranked[0].layout)}:\n") + scaling(
                result.ranked[0], baseline
            )
        if transformer is None and result.ranked[0].layout.zero:  # described without layers
            text += ("\n" if text else f"Why {describe(result.ranked[0].layout)}:\n") + (
                _generic_zero_reason(cfg, result.ranked[0], cluster, args.precision)
            )
        if record is not None and transformer is not None:
            text += "\n" + track_record(record, args.stack, args.precision, g.name)
        print("\n" + text)
    if (args.epochs is not None or args.train_tokens is not None) and result.ranked:
        print("\n" + time_to_train(args, cfg, result.ranked[0], baseline))
    if cfg.name == "resnet50" and result.ranked:  # the one model with published runs to show
        from paracube.planner.report import resnet50_check

        print("\n" + resnet50_check(g, args.precision))
    if args.emit == "torchrun":
        command = torchrun_command(
            result.ranked[0], args.model, cluster.gpus_per_node, args.precision, args.seq
        )
        print("\n" + command)
    if args.emit == "megatron":
        print("\n" + _megatron_emit(args, cfg, cluster, result))


def _print_json(args, cfg, g, result, baseline, record) -> None:
    """--json: the plan as one object — the model's shape, the search's counts, the
    baseline, the candidates, the track record and the time to train."""
    import json
    from dataclasses import asdict

    from paracube.planner.report import to_json

    # the shape planned, as read from --model or the custom flags (a transformer's)
    shape = asdict(cfg) if isinstance(cfg, ModelConfig) else None
    print(
        json.dumps(
            {
                "model": cfg.name,
                "shape": shape,
                "gpus": args.gpus,
                "gpu": g.name,
                "evaluated": result.evaluated,
                "fit": result.fitting,
                "rejected": result.rejected,
                "baseline": None
                if baseline is None
                else {
                    "gpus": baseline.gpus,
                    "layout": asdict(baseline.best.layout),
                    "step_time": baseline.best.time.step_time,
                    "tokens_per_s": baseline.best.time.tokens_per_s,
                },
                "candidates": to_json(result.ranked[: args.top], baseline),
                # how the planner did on the published runs of this stack, GPU, precision
                "track_record": None if record is None else asdict(record),
                # --epochs / --train-tokens: the budget in tokens (samples for a model
                # without tokens) and the seconds to train it on the best layout and on
                # the baseline
                "time_to_train": training_seconds(args, cfg, result, baseline),
            }
        )
    )


def _megatron_emit(args, cfg, cluster, result) -> str:
    """--emit megatron: Megatron-LM's command for the best layout it runs as planned — the
    first-ranked, or, where that one is not, the fastest that is, with the reason."""
    from paracube.planner.megatron import megatron_command, megatron_refusal
    from paracube.planner.report import describe

    best = result.ranked[0]
    for rank, cand in enumerate(result.ranked, start=1):
        if megatron_refusal(cand.layout, cfg, args.precision) is None:
            command = megatron_command(
                cand.layout, cfg, args.precision, args.global_batch, cluster.gpus_per_node
            )
            if rank == 1:
                return command
            slower = best.time.tokens_per_s / cand.time.tokens_per_s - 1
            return (
                f"Megatron-LM does not run #1 ({describe(best.layout)}) as planned — "
                f"{megatron_refusal(best.layout, cfg, args.precision)}; the command runs "
                f"#{rank} ({describe(cand.layout)}), {slower:.1%} slower:\n{command}"
            )
    raise ParacubeError(
        f"--emit megatron: none of the {len(result.ranked)} layouts that fit runs in Megatron-LM "
        f"as planned — the first, {describe(best.layout)}: "
        f"{megatron_refusal(best.layout, cfg, args.precision)}"
    )


def _nothing_fits(result, cfg, cluster, args) -> int:
    g = cluster.gpu
    if result.smallest_misfit is None:
        from paracube.planner.report import merged_reasons

        reasons = "; ".join(
            f"{why} ({n} layout{'s' if n > 1 else ''})"
            for why, n in sorted(merged_reasons(result.rejected).items())
        )
        raise ParacubeError(
            "no layout satisfies the constraints (divisibility, tp within a node, the fixed choices)"
            + (f" — {reasons}" if reasons else "")
            + ": relax --layout or the fixed options"
        )
    need = result.smallest_misfit.memory.total
    from paracube.planner.report import describe

    # a shaping choice of the user's without which it fits: named first
    lifted = _fits_without(args, cfg, cluster)
    given, drop = "", ""
    if lifted is not None:
        flag, layout = lifted
        given, drop = f" with {flag}", f"drop {flag} (without it: {describe(layout)}), or "
    # recomputation was ruled out by the user's choice: say what it would do
    recompute = (
        "--recompute full (blocks keep only their input), "
        if getattr(args, "recompute", None) not in (None, "full")
        else ""
    )
    fewest = _fewest_gpus_that_fit(args, cfg)
    gpus = ""
    if fewest is not None:
        n, layout = fewest
        gpus = f"{n} GPUs or more ({n} hold it as {describe(layout)}), "
    in_place = _fits_with_the_loss_in_place(args, cfg, cluster)
    loss = (
        f"a loss computed in place (--loss fused, Megatron's and llm-foundry's; it fits as "
        f"{describe(in_place)}), "
        if in_place
        else ""
    )
    raise ParacubeError(
        f"{cfg.name} fits no layout on {args.gpus} × {g.name}{given}: "
        f"the leanest ({describe(result.smallest_misfit.layout)}) "
        f"needs {need / 1e9:.1f} GB per GPU, {need / g.memory_bytes:.1f}× the {g.memory_bytes / 1e9:.0f} GB; "
        f"{drop}use {recompute}{loss}{gpus}GPUs with more memory, or a smaller global batch / "
        "micro-batch"
    )


def _fits_with_the_loss_in_place(args, cfg, cluster):
    """The best layout of the same search with the loss's backward computed in place
    (Megatron's and llm-foundry's loss: no two fp32 gradients of the logits' shape alive at
    once, which a large vocabulary at a long sequence makes the peak) — None when the loss
    was given (by --loss or the stack), the model has no logits (a generic model) or it does
    not fit either."""
    fixed = plan_fixed(args, args.gpus)
    if "loss" in fixed or not isinstance(cfg, ModelConfig):  # given, or the stack's own
        return None
    fixed["loss"] = "fused"
    ranked = _search(Namespace(**{**vars(args), "top": 1}), cfg, cluster, fixed).ranked
    return ranked[0].layout if ranked else None


# The flags that fix a layout's shape, as --flag and the args attribute they set: "fits no
# layout" tries the search without each one the user gave (and without a fixed
# --sequence-parallel or --no-sequence-parallel; --recompute is suggested apart)
SHAPING_FLAGS = {
    "--micro-batch": "micro_batch",
    "--schedule": "schedule",
    "--chunks": "chunks",
    "--zero": "zero",
    "--recompute-blocks": "recompute_blocks",
    "--offload": "offload",
    "--shard-group": "shard_group",
    "--pipeline-split": "split",
}


def _fits_without(args, cfg, cluster):
    """The first of the user's layout-shaping choices (a --layout degree, or a flag of
    :data:`SHAPING_FLAGS`) without which the same search finds a layout that fits: (the
    choice as written, that layout's best); None when dropping no single one does."""
    from argparse import Namespace

    variants = []
    if args.layout:
        parts = [part.strip() for part in args.layout.split(",")]
        for k, part in enumerate(parts):
            rest = ",".join(parts[:k] + parts[k + 1 :]) or None
            variants.append((f"--layout {part}", {"layout": rest}))
    for flag, name in SHAPING_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            variants.append((f"{flag} {value}", {name: None}))
    if getattr(args, "sequence_parallel", None) is not None:  # a switch: no value to echo
        switch = "--sequence-parallel" if args.sequence_parallel else "--no-sequence-parallel"
        variants.append((switch, {"sequence_parallel": None}))
    for flag, change in variants:
        lifted = Namespace(**{**vars(args), **change, "top": 1})
        try:
            ranked = _search(lifted, cfg, cluster, plan_fixed(lifted, args.gpus)).ranked
        except ParacubeError:
            continue  # the other choices alone are refused: not this one's doing
        if ranked:
            return flag, ranked[0].layout
    return None


# How many doublings of the GPU count "fits no layout" tries before giving up on more GPUs
MORE_GPU_DOUBLINGS = 8


def _fewest_gpus_that_fit(args, cfg):
    """The fewest GPUs — whole nodes past one — on which the same search, fixed choices and
    all, finds a layout that fits: doubling --gpus until one does, then bisecting down to a
    node (the offload and recomputation the search may choose included). As (count, its
    best layout); None when no count up to 2^MORE_GPU_DOUBLINGS × --gpus does (--layout
    pins every degree, or extra GPUs only add replicas that keep their own activations)."""
    from argparse import Namespace

    if {"dp", "tp", "pp"} <= set(plan_fixed(args, args.gpus)):  # as --layout gave them
        return None  # the whole layout is fixed: more GPUs cannot run it
    node = args.gpus_per_node  # the cluster of --gpus below a node is one partial node

    def best(count: int):
        more = Namespace(**{**vars(args), "gpus": count, "top": 1})
        try:
            ranked = _search(more, cfg, cluster_of(more), plan_fixed(more, count)).ranked
        except ParacubeError:
            return None  # a fixed choice that does not divide this count
        return ranked[0].layout if ranked else None

    def whole(count: int, up: bool) -> int:  # past one node, whole nodes
        if count <= node:
            return count
        return (math.ceil(count / node) if up else count // node) * node

    low, high, found = args.gpus, whole(2 * args.gpus, up=True), None
    for _ in range(MORE_GPU_DOUBLINGS):
        if high > MAX_GPUS:
            return None
        found = best(high)
        if found is not None:
            break
        low, high = high, whole(2 * high, up=True)
    if found is None:
        return None
    while True:  # it fits on high GPUs, not on low: bisect
        middle = whole((low + high) // 2, up=False)
        if not low < middle < high:
            return high, found
        layout = best(middle)
        if layout is None:
            low = middle
        else:
            high, found = middle, layout
