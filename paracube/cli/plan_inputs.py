"""What ``paracube plan``'s command line asks for, checked before any search: the model
(a preset, a Hugging Face config, a factory or a custom shape), the cluster, and the fixed
choices of ``--layout``, ``--stack`` and the explicit flags — each bad value refused as one
line naming it and the fix (exit status 2), never a search that finds nothing and blames
something else."""

from __future__ import annotations

import math

from paracube.choices import (
    GRAD_REDUCE,
    OFFLOAD,
    PLANNED_RECOMPUTE,
    PRECISIONS,
    RECOMPUTE_MODULES,
)
from paracube.cli.plan_budget import count_text, tokens_text
from paracube.config import ModelConfig
from paracube.errors import ParacubeError
from paracube.planner.layout import NAMED_CHOICES, OTHER_SOFTWARE, Layout, expert_refusal
from paracube.planner.pipeline_layout import is_layout, layout_refusal, stages_of

# The custom-shape flags (their ModelConfig fields are spelled out in _model_shape)
SHAPE = ("layers", "hidden", "heads", "vocab", "seq", "ffn", "kv_heads")
# a custom shape's block: flags named as ModelConfig's fields, --no-bias (bias=False) and
# --router-keep-scores (router_renorm=False)
BLOCK = (
    "activation",
    "norm",
    "position",
    "tie_embeddings",
    "no_bias",
    "qkv_bias",
    "experts",
    "experts_per_token",
    "route_groups",
    "route_group_topk",
    "router_score",
    "router_keep_scores",
    "router_expert_bias",
    "router_scale",
    "shared_expert_ffn",
    "first_dense_blocks",
    "dense_ffn",
    "mtp_layers",
    "attention_window",
    "attention_chunk",
    "full_attention_every",
    "head_size",
    "qk_norm",
    "post_norms",
    "attention_softcap",
    "logit_softcap",
)


def plan_model(args):
    """The transformer to plan: --model's, or the custom shape's; --recompute-blocks and an
    explicit --pipeline-split layout checked against its blocks."""
    cfg = _model_shape(args)
    if args.recompute_blocks is not None and args.recompute_blocks > cfg.n_layers:
        raise ParacubeError(
            f"--recompute-blocks {args.recompute_blocks} is more than the model's "
            f"{cfg.n_layers} blocks: give at most {cfg.n_layers}"
        )
    if args.split is not None and is_layout(args.split):
        refusal = layout_refusal(stages_of(args.split), cfg.n_layers, cfg.mtp_layers)
        if refusal:
            raise ParacubeError(f"--pipeline-split {args.split!r}: {refusal}")
    if args.recompute_modules is not None and isinstance(cfg, ModelConfig):
        asked = Layout(
            recompute="selective", recompute_modules=args.recompute_modules, activations="megatron"
        )
        refusal = asked.recompute_modules_refusal(cfg)
        if refusal:
            raise ParacubeError(f"--recompute-modules: {refusal}")
    return cfg


def _model_shape(args):
    from paracube.config import ModelConfig

    custom = {k: getattr(args, k) for k in SHAPE}
    for k, value in custom.items():
        if value is not None and value <= 0:
            raise ParacubeError(f"--{k.replace('_', '-')} must be a positive integer, got {value}")
    if args.head_size is not None and args.head_size <= 0:
        raise ParacubeError(f"--head-size must be a positive integer, got {args.head_size}")
    negated = {"no_bias": "bias", "router_keep_scores": "router_renorm"}
    block = {
        k: getattr(args, k) for k in BLOCK if k not in negated and getattr(args, k) is not None
    }
    for flag, field in negated.items():
        if getattr(args, flag):
            block[field] = False
    if "first_dense_blocks" in block:  # DeepSeek's first_k_dense_replace: blocks 0 … K-1
        first = block.pop("first_dense_blocks")
        if first < 0:
            raise ParacubeError(
                f"--first-dense-blocks must be 0 or more (the first K blocks dense), got {first}"
            )
        block["dense_layers"] = tuple(range(first))
    if args.model:
        # a model's shape is its own; only its sequence length may change, as train's --seq-len
        shape = [
            f"--{k.replace('_', '-')}"
            for k in (*SHAPE, *BLOCK)
            if getattr(args, k) is not None and k != "seq"
        ]
        if shape:
            raise ParacubeError(
                f"{' '.join(shape)} with --model {args.model}: a model's shape is its own; plan "
                "a custom shape without --model (--layers --hidden --heads --vocab --seq), or "
                f"drop {' '.join(shape)}"
            )
        _plan_at_the_models_context(args)
        return _named_model(args.model, args.seq)
    missing = [f"--{k}" for k in ("layers", "hidden", "heads", "vocab", "seq") if custom[k] is None]
    if missing:
        raise ParacubeError(f"give --model PRESET or a custom shape; missing {' '.join(missing)}")
    return ModelConfig(
        n_layers=custom["layers"],
        hidden=custom["hidden"],
        n_heads=custom["heads"],
        vocab_size=custom["vocab"],
        seq_len=custom["seq"],
        ffn_hidden=custom["ffn"],
        n_kv_heads=custom["kv_heads"],
        name="custom",
        **block,
    )


def _plan_at_the_models_context(args) -> None:
    """A Hugging Face model without --seq is planned at its own context, as a preset is:
    ``paracube train`` caps its default at 1,024 tokens so that a run fits a CPU, which is
    no guide to the GPUs planned. Set as ``args.seq``, so the header and the emitted
    command (``--seq-len``) say it."""
    from paracube.models.sources import hf_context, parse_model, read_hf_config

    if args.seq is None:
        source = parse_model(args.model)
        if source.kind == "hf":
            args.seq = hf_context(read_hf_config(source.where))


def _named_model(text: str, seq: int | None):
    """--model's shape, read as paracube train reads it (paracube.models.sources): a preset,
    a local Hugging Face config, or a factory called on the meta device."""
    from dataclasses import replace

    from paracube.models.sources import parse_model, source_config

    source = parse_model(text)
    if source.kind != "factory":
        return source_config(source, seq_len=seq)
    from paracube.models.spec import factory_config  # imports torch: the factory builds modules

    cfg = factory_config(source.where)
    return cfg if seq is None else replace(cfg, seq_len=seq)


# Fixed choices that describe the software rather than the layout: the speed-up's baseline
# runs them too — the other stacks' facts a Layout states (layout.OTHER_SOFTWARE), the dtype
# gradients are reduced in, FP8's scaling, and how the pipeline is split.
SOFTWARE = (*OTHER_SOFTWARE, "grad_reduce", "fp8_scaling", "split")


def plan_fixed(args, gpus: int, mixed: bool = False) -> dict:
    """The fixed choices of ``--layout``, ``--stack`` and the explicit flags, each checked
    against ``gpus`` (on a ``mixed`` cluster only cp must divide them all: each device type
    takes its own share of the replicas, and plan_mixed checks tp and pp per type)."""
    from paracube.planner.stacks import stack

    layout: dict = {}
    if args.layout:
        try:
            layout = {
                k.strip(): int(v) for k, v in (part.split("=") for part in args.layout.split(","))
            }
        except ValueError:
            raise ParacubeError(f"--layout {args.layout!r}: write it as dp=N,tp=N,pp=N") from None
        if set(layout) - {"dp", "tp", "pp", "cp", "ep", "etp"} or any(
            v <= 0 for v in layout.values()
        ):
            raise ParacubeError(
                f"--layout {args.layout!r}: only dp, tp, pp, cp, ep and etp, each a positive "
                "integer"
            )
        # the experts' groups, where the layout fixes what they depend on (folded: tp too)
        if {"ep", "dp"} <= set(layout) and ("etp" not in layout or "tp" in layout):
            refusal = expert_refusal(
                layout["ep"],
                layout.get("etp", 0),
                layout.get("tp", 1),
                layout["dp"],
                layout.get("cp", 1),
            )
            if refusal:
                raise ParacubeError(f"--layout {refusal}")
        if (layout.get("ep", 1) > 1 or "etp" in layout) and args.emit == "torchrun":
            what = ",".join(f"{k}={layout[k]}" for k in ("ep", "etp") if k in layout)
            raise ParacubeError(
                f"--layout {what} with --emit torchrun: paracube train builds dense "
                "models and runs no expert parallelism (it is planned to evaluate "
                "mixture-of-experts runs); drop one"
            )
        if layout.get("tp", 1) > gpus:
            raise ParacubeError(
                f"--layout tp={layout['tp']} is more GPUs than --gpus {gpus}: choose a tp that "
                "divides them"
            )
        if layout.get("tp", 1) > args.gpus_per_node:
            raise ParacubeError(
                f"--layout tp={layout['tp']} is larger than a node ({args.gpus_per_node} GPUs): "
                "tensor parallelism needs the intra-node links; use pipeline or data parallelism across nodes"
            )
        tp = layout.get("tp", 1)
        if gpus > args.gpus_per_node and args.gpus_per_node % tp and not mixed:
            raise ParacubeError(
                f"--layout tp={tp} does not divide --gpus-per-node {args.gpus_per_node}: some "
                "tensor-parallel groups would span two nodes; choose a tp that divides it"
            )
        # ep (and the experts' etp) regroup the other degrees' ranks
        degrees = {k: v for k, v in layout.items() if k not in ("ep", "etp")}
        total = math.prod(degrees.values())
        if {"dp", "tp", "pp"} <= set(layout) and total != gpus:
            raise ParacubeError(
                f"--layout {args.layout}: dp×tp×pp×cp = {total} but --gpus is {gpus}; make them equal"
            )
        dividing = {k: v for k, v in degrees.items() if not mixed or k == "cp"}
        product = math.prod(dividing.values())
        if gpus % product:  # checked here: the search would find nothing and blame others
            given = ",".join(f"{k}={v}" for k, v in dividing.items())
            what = given if len(dividing) == 1 else f"{given} (product {product})"
            raise ParacubeError(
                f"--layout {what} does not divide --gpus {gpus}: choose degrees whose product does"
            )
        if layout.get("cp", 1) > 1 and args.emit == "torchrun":
            raise ParacubeError(
                f"--layout cp={layout['cp']} with --emit torchrun: paracube train does not run "
                "context parallelism (cp is planned to evaluate Megatron-Core runs); drop one"
            )
    # the stack's software first: the layout and every explicit flag override it
    fixed: dict = {**(stack(args.stack) if args.stack else {}), **layout}
    for name in (
        "micro_batch",
        "schedule",
        "chunks",
        "zero",
        "recompute",
        "sequence_parallel",
        *SOFTWARE,
    ):
        if getattr(args, name) is not None:
            fixed[name] = getattr(args, name)
    if fixed.get("activations") == "compiled" and args.elementwise is None:
        fixed["elementwise"] = "fused"  # a stack's eager blocks, compiled, run fused kernels
    if args.recompute_blocks is not None:
        fixed.update(recompute="full", recompute_blocks=args.recompute_blocks)
    if args.recompute_modules is not None:
        fixed["recompute"] = "selective"
        if fixed.get("activations") != "megatron" and set(args.recompute_modules) - {"core_attn"}:
            raise ParacubeError(
                f"--recompute-modules {','.join(args.recompute_modules)}: planned as "
                "Megatron-Core keeps its blocks; add --stack megatron-core (or --emit megatron)"
            )
    if args.offload is not None:
        fixed["offload"] = args.offload == "optimizer"
    if args.compress is not None:
        fixed["compress"] = args.compress
    if args.shard_group is not None:
        _hybrid_shard(args, fixed)
    _check_stack_choices(args, fixed)
    return fixed


def _hybrid_shard(args, fixed: dict) -> None:
    """``--shard-group N`` into the fixed choices (ZeRO-3 within groups of N, or ZeRO-1's
    optimizer states with --zero 1), refused by name where it cannot be: another ZeRO stage,
    a data-parallel group it does not divide, a command paracube train would have to run."""
    n = args.shard_group
    if n <= 0:
        raise ParacubeError(f"--shard-group must be a positive integer, got {n}")
    if fixed.get("zero", 3) not in (1, 3):
        raise ParacubeError(
            f"--shard-group {n} with --zero {fixed['zero']}: hybrid sharding shards ZeRO-3's "
            "states or ZeRO-1's optimizer states; use --zero 3 or 1, or drop --shard-group"
        )
    if "dp" in fixed and (fixed["dp"] * fixed.get("cp", 1)) % n:
        raise ParacubeError(
            f"--shard-group {n} does not divide the data-parallel group of --layout "
            f"(dp × cp = {fixed['dp'] * fixed.get('cp', 1)}): choose a group that does"
        )
    if args.emit == "torchrun":
        raise ParacubeError(
            f"--shard-group {n} with --emit torchrun: paracube train shards ZeRO over the "
            "whole data-parallel group (hybrid sharding is planned to evaluate the FSDP and "
            "InternLM stacks that run it); drop one"
        )
    fixed.update(zero=fixed.get("zero", 3), shard=n)


def _check_stack_choices(args, fixed: dict) -> None:
    """A choice fixed on the command line that the named stack does not run is refused,
    naming what it runs (the search proposes only those: stacks.STACK_CHOICES)."""
    from paracube.planner.stacks import stack_choices

    for field, values in stack_choices(args.stack).items():
        if field in fixed and fixed[field] not in values:
            flag = (
                f"--layout {field}={fixed[field]}"
                if field in ("tp", "pp")
                else (f"--{field} {fixed[field]}")
            )
            names = [str(v) for v in values]
            runs = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            raise ParacubeError(f"{flag} with --stack {args.stack}: it runs {field} {runs}")


def parse_gpus(args):
    """``--gpus N`` (an int from here on), or a mixed cluster's pools (N = their sum)."""
    if args.gpus is None:
        return None
    try:
        args.gpus = int(args.gpus)
        return None
    except ValueError:
        pass
    from paracube.planner.pools import parse_pools

    pools = parse_pools(args.gpus, args.gpus_per_node, args.intra, args.inter)
    args.gpus = sum(p.count for p in pools)
    return pools


def set_default_precision(args, pools) -> None:
    """Unless ``--precision`` is given, the GPUs' own (:func:`~paracube.planner.hardware.
    default_precision`: bf16, fp16 on V100s)."""
    if args.precision is not None:
        return
    from paracube.planner import hardware as hw

    keys = [p.key for p in pools] if pools else [args.gpu.lower()]
    args.precision = hw.default_precision([hw.GPUS[k] for k in keys if k in hw.GPUS])


# Beyond any cluster built (the largest are ~10⁵ GPUs); bounds the search's enumeration.
MAX_GPUS = 2**20


def check_args(args, whole_nodes: bool = True) -> None:
    """Every flag checked on its own and against the others, before any search, in this
    order: the counts and the training budget, the named choices, the software choices that
    need one another, what the emitted command runs, recomputation and precision
    (``whole_nodes``: --gpus must be whole nodes — not on a mixed cluster, whose pools are
    checked apart)."""
    _check_counts(args, whole_nodes)
    _check_names(args)
    _check_software(args)
    _check_emit(args)
    _check_recompute_and_precision(args)


def _check_counts(args, whole_nodes: bool) -> None:
    """The required counts, each positive; the training budget; whole nodes."""
    for name in ("gpus", "global_batch"):
        if getattr(args, name) is None:
            raise ParacubeError(f"--{name.replace('_', '-')} is required (or --calibrate)")
    for name in ("gpus", "gpus_per_node", "global_batch", "top"):
        if getattr(args, name) <= 0:
            raise ParacubeError(
                f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}"
            )
    for name in ("epochs", "train_samples"):
        value = getattr(args, name)
        if value is not None and not value > 0:  # NaN too
            raise ParacubeError(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    if args.train_tokens is not None and (args.epochs is not None or args.train_samples):
        raise ParacubeError(
            f"--train-tokens {tokens_text(args.train_tokens)} with --epochs: give one "
            "training budget, tokens or epochs"
        )
    if args.train_samples is not None and args.epochs is None:
        raise ParacubeError(
            f"--train-samples {count_text(args.train_samples)} without --epochs: it sizes the "
            "epochs of --epochs E (the time to train); add --epochs or drop it"
        )
    if args.gpus > MAX_GPUS:
        raise ParacubeError(f"--gpus {args.gpus} is more than {MAX_GPUS:,}: plan a real cluster")
    if whole_nodes and args.gpus > args.gpus_per_node and args.gpus % args.gpus_per_node:
        raise ParacubeError(
            f"--gpus {args.gpus} is not a whole number of nodes of --gpus-per-node {args.gpus_per_node}: "
            f"use a multiple of {args.gpus_per_node}"
        )
    for name in ("micro_batch", "chunks"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ParacubeError(
                f"--{name.replace('_', '-')} must be a positive integer, got {value}"
            )
    if args.logit_metrics is not None and args.logit_metrics < 0:
        raise ParacubeError(
            f"--logit-metrics must be 0 or more (metrics computed over the logits), got "
            f"{args.logit_metrics}"
        )


def _check_names(args) -> None:
    """Each named choice one of those its flag takes: a Layout's own (layout.NAMED_CHOICES,
    each flag its field's name), the plan's --grad-reduce, --offload and --stack, and
    --pipeline-split a named split or a layout in Megatron's grammar."""
    from paracube.planner.stacks import STACK_SOFTWARE

    named = [(name, "--" + name.replace("_", "-"), allowed) for name, allowed in NAMED_CHOICES] + [
        ("grad_reduce", "--grad-reduce", GRAD_REDUCE),
        ("offload", "--offload", OFFLOAD),
        ("stack", "--stack", tuple(STACK_SOFTWARE)),
    ]
    if args.split is not None and is_layout(args.split):  # Megatron's grammar (ConfigError)
        stages_of(args.split)
    for name, flag, allowed in named:
        value = getattr(args, name)
        if value is not None and value not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            raise ParacubeError(f"unknown {flag} {value!r}: choose one of {choices}")


def _check_software(args) -> None:
    """Software choices that need another: a ZeRO stage, FP8, an optimizer on the GPU."""
    if args.optimizer_kernel not in (None, "fused") and args.offload == "optimizer":
        raise ParacubeError(
            f"--optimizer-kernel {args.optimizer_kernel} with --offload optimizer: the offloaded "
            "step runs on the host, as its own loop; drop one of them"
        )
    if args.param_sync not in (None, "all-gather") and args.zero not in (None, 1, 2):
        raise ParacubeError(
            f"--param-sync {args.param_sync} with --zero {args.zero}: the parameter sync after "
            "the step is ZeRO-1/2's; use --zero 1 or 2, or drop --param-sync"
        )
    if args.grad_sync not in (None, "all-reduce") and args.zero not in (None, 1):
        raise ParacubeError(
            f"--grad-sync {args.grad_sync} with --zero {args.zero}: the choice is ZeRO-1's "
            "(ZeRO-0 all-reduces, ZeRO-2 and 3 reduce-scatter); use --zero 1, or drop --grad-sync"
        )
    if args.zero3_pipeline not in (None, "none") and args.zero not in (None, 3):
        raise ParacubeError(
            f"--zero3-pipeline {args.zero3_pipeline} with --zero {args.zero}: it is how ZeRO-3 "
            "runs under a pipeline; use --zero 3, or drop --zero3-pipeline"
        )
    if args.fp8_scaling is not None and args.precision != "fp8":
        raise ParacubeError(
            f"--fp8-scaling {args.fp8_scaling} under --precision {args.precision}: nothing is "
            "FP8; add --precision fp8 or drop the flag"
        )


def _check_emit(args) -> None:
    """--emit: the choices the command's trainer does not run, refused before the search
    (Megatron-LM's, or paracube train's own); --emit megatron plans as Megatron-Core runs."""
    if args.emit == "megatron":  # planned as Megatron-LM runs it, for its command
        if args.stack not in (None, "megatron-core"):
            raise ParacubeError(
                f"--stack {args.stack} with --emit megatron: the command is Megatron-LM's, so the "
                "plan is as Megatron-LM runs it (--stack megatron-core); drop --stack"
            )
        if args.precision == "tf32":
            raise ParacubeError(
                "--precision tf32 with --emit megatron: plan Megatron-LM in bf16, fp16, fp8 or fp32"
            )
        from paracube.planner.megatron import unrun_choice

        # choices given on the command line that Megatron-LM does not run
        megatron_stated = [
            ("--zero", "zero", args.zero),
            ("--recompute", "recompute", args.recompute),
            ("--schedule", "schedule", args.schedule),
            ("--attention", "attention", args.attention),
            ("--shard-group", "shard", args.shard_group),
            ("--compress", "compress", args.compress),
            ("--pipeline-split", "split", args.split),
            ("--grad-bucket", "grad_bucket", args.grad_bucket),
            ("--router", "router", args.router),
            ("--master-weights", "master_weights", args.master_weights),
        ]
        for flag, field, value in megatron_stated:
            words = None if value is None else unrun_choice(field, value)
            if words:
                raise ParacubeError(
                    f"{flag} {value} with --emit megatron: Megatron-LM runs {words}; drop one"
                )
        args.stack = "megatron-core"
    if args.emit == "torchrun":  # before the search: a command paracube train runs as planned
        from paracube.planner.layout import OTHER_SOFTWARE, Layout

        if args.stack not in (None, "paracube"):
            raise ParacubeError(
                f"--stack {args.stack} with --emit torchrun: paracube train runs its own software "
                "(the other stacks are planned to evaluate their runs); drop one"
            )
        stated = {k: getattr(args, k) for k in OTHER_SOFTWARE if getattr(args, k) is not None}
        Layout(**stated).check_paracube_software()
    if args.recompute in PLANNED_RECOMPUTE and args.emit == "torchrun":
        raise ParacubeError(
            f"--recompute {args.recompute} with --emit torchrun: paracube train recomputes "
            "none, selective or full blocks (op-level checkpointing is planned to evaluate "
            "torchtitan's runs); drop one"
        )
    if args.split not in (None, "engine") and args.emit == "torchrun":
        raise ParacubeError(
            f"--pipeline-split {args.split} with --emit torchrun: paracube train cuts its "
            "stages by --balance (the even splits are planned to evaluate Megatron runs); "
            "drop one"
        )


def _check_recompute_and_precision(args) -> None:
    """--recompute-blocks, --grad-reduce, --compress and --precision."""
    from paracube.values import compression

    if args.recompute_blocks is not None:
        if args.recompute_blocks <= 0:
            raise ParacubeError(
                f"--recompute-blocks must be a positive integer, got {args.recompute_blocks}"
            )
        if args.recompute not in (None, "full"):
            raise ParacubeError(
                f"--recompute-blocks with --recompute {args.recompute}: the planner recomputes "
                "the first N blocks whole; give --recompute full or drop --recompute"
            )
    if args.recompute_modules is not None:
        unknown = [m for m in args.recompute_modules if m not in RECOMPUTE_MODULES]
        if (
            unknown
            or not args.recompute_modules
            or len(set(args.recompute_modules)) != len(args.recompute_modules)
        ):
            raise ParacubeError(
                f"--recompute-modules {','.join(args.recompute_modules)!r}: give distinct "
                f"modules among {', '.join(RECOMPUTE_MODULES)} (the Megatron-Core modules the "
                "planner counts)"
            )
        if args.recompute not in (None, "selective"):
            raise ParacubeError(
                f"--recompute-modules with --recompute {args.recompute}: the modules are a "
                "selective recomputation's; give --recompute selective or drop one"
            )
    if args.grad_reduce == "compute" and args.precision in ("fp32", "tf32"):
        raise ParacubeError(
            f"--grad-reduce compute is for --precision bf16 or fp16: under {args.precision} "
            "gradients are reduced in fp32 anyway; drop the flag or choose a lower precision"
        )
    if args.compress is not None:
        compression(args.compress)  # train's names and ranges
    if args.precision not in (*PRECISIONS, "tf32", "fp8"):
        raise ParacubeError(
            f"unknown --precision {args.precision!r}: choose bf16, fp16, fp32, tf32 or fp8"
        )
    if args.emit == "torchrun" and args.precision not in PRECISIONS:
        raise ParacubeError(
            f"--precision {args.precision} with --emit torchrun: paracube train runs "
            f"{', '.join(PRECISIONS)}; plan in one of those for a command it runs"
        )


def cluster_of(args):
    from paracube.planner import hardware as hw
    from paracube.planner.time_model import Cluster

    gpu, key = _gpu(args)
    return Cluster(
        gpu,
        min(args.gpus_per_node, args.gpus),
        hw.interconnect(args.intra or hw.DEFAULT_INTRA[key]),
        hw.interconnect(args.inter or hw.DEFAULT_INTER[key], network=True),
    )


def _gpu(args):
    """(the GPU, its catalog key for the default links): a catalog entry, or ``calibrated``
    — the GPU ``paracube calibrate`` measured on this machine (``planner.local``)."""
    from paracube.planner import hardware as hw
    from paracube.planner import local

    if args.gpu.lower() != "calibrated":
        return hw.gpu(args.gpu), args.gpu.lower()
    data = local.load()
    measured = local.calibrated_gpu(data) if data is not None else None
    if data is None or measured is None:
        raise ParacubeError(
            f"--gpu calibrated: no GPU measured in {local.DEFAULT_PATH}: run `paracube "
            "calibrate` on a machine with a CUDA GPU first, or name a catalog GPU"
        )
    key = hw.catalog_key(data["gpu"]["name"])
    if key is None and not (args.intra and args.inter):
        raise ParacubeError(
            f"--gpu calibrated: {data['gpu']['name']} is not in the catalog, so its links "
            "are unknown: give --intra and --inter"
        )
    return measured[0], key
