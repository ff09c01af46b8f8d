"""``paracube plan``: its arguments and what it runs (the planner itself is ``paracube.planner``).

Torch-free: planning a 1T-parameter model on thousands of GPUs answers in well under a
second, without importing torch.
"""

from __future__ import annotations

import argparse
import math

from paracube.config import ModelConfig
from paracube.errors import ParacubeError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="which parallel layout for a model on a cluster: memory, step time, MFU, bubble, ranked",
        description="Evaluate one layout (--layout) or search them all, for a model on a cluster.",
    )
    m = p.add_argument_group("model (a preset, or a custom transformer)")
    m.add_argument(
        "--model",
        default=None,
        help="a preset (see paracube.models.PRESETS), a Hugging Face model's local config "
        "(hf:DIR or DIR/config.json, as paracube train reads it), or a factory "
        "package.module:function",
    )
    for flag in ("--layers", "--hidden", "--heads", "--vocab", "--ffn", "--kv-heads"):
        m.add_argument(flag, type=int, default=None)
    m.add_argument("--seq", "--seq-len", type=int, default=None, help="tokens per sequence")
    # a custom shape's block, as ModelConfig names it (default: a GPT block)
    m.add_argument("--activation", default=None, help="gelu (default) or swiglu (LLaMA's MLP)")
    m.add_argument("--norm", default=None, help="layernorm (default) or rmsnorm")
    m.add_argument("--position", default=None, help="learned (default) or rope")
    m.add_argument(
        "--tie-embeddings", action="store_true", default=None, help="the head shares the embedding"
    )
    m.add_argument(
        "--no-bias", action="store_true", default=None, help="linear layers without bias"
    )
    m.add_argument(
        "--experts",
        type=int,
        default=None,
        help="a mixture of experts: each block's MLP as this many MLPs of its shape and a "
        "router (planned, not run by paracube train; with --experts-per-token)",
    )
    m.add_argument(
        "--experts-per-token",
        type=int,
        default=None,
        help="the experts each token is routed to (Mixtral, Grok-1: 2)",
    )
    m.add_argument(
        "--head-size",
        type=int,
        default=None,
        help="each attention head's width, where it is not --hidden / --heads (Qwen3-32B: "
        "128 over 5120 / 64)",
    )
    m.add_argument(
        "--qk-norm",
        action="store_true",
        default=None,
        help="each head's queries and keys normalised (Qwen3's q_norm, k_norm)",
    )
    c = p.add_argument_group("cluster")
    c.add_argument(
        "--gpus",
        default=None,
        help="how many GPUs (of --gpu), or a mixed cluster as counts of device types: "
        "8xa100-80gb,8xv100 (each type on its own nodes)",
    )
    c.add_argument("--gpus-per-node", type=int, default=8)
    c.add_argument(
        "--gpu",
        default="a100-80gb",
        help="v100, a100-40gb, a100-80gb, a800, h100, h800, h200, or calibrated (this machine's GPU, "
        "as `paracube calibrate` measured it)",
    )
    c.add_argument("--intra", default=None, help="intra-node link (default: the GPU's NVLink)")
    c.add_argument("--inter", default=None, help="inter-node link (default: InfiniBand HDR/NDR)")
    t = p.add_argument_group("training and fixed choices")
    t.add_argument("--global-batch", type=int, default=None, help="sequences per step")
    t.add_argument(
        "--precision",
        default=None,
        help="bf16 (the default; fp16 on GPUs without bfloat16 tensor cores: V100), fp16, "
        "fp32 (CUDA cores: torch's default for fp32 matmuls), tf32 (fp32 "
        "values, TF32 tensor-core matmuls) or fp8 (bf16 with the blocks' linear layers in FP8, "
        "as Transformer Engine runs them on Hopper: planned, not run by paracube train)",
    )
    t.add_argument(
        "--layout",
        default=None,
        help="evaluate one layout: dp=,tp=,pp= (and cp=, context parallelism as Megatron-Core "
        "runs it, and ep=, a mixture of experts' expert parallelism out of the dp ranks: "
        "planned, not run by paracube train)",
    )
    t.add_argument("--micro-batch", type=int, default=None)
    t.add_argument("--schedule", default=None)
    t.add_argument("--chunks", type=int, default=None)
    t.add_argument("--zero", type=int, default=None)
    t.add_argument(
        "--recompute",
        default=None,
        help="none, selective (the attention core), full, or op (torchtitan's op-level "
        "selective checkpointing: every matmul's output kept but every second one's; "
        "planned, not run by paracube train)",
    )
    t.add_argument(
        "--compress",
        default=None,
        help="gradient compression of the data-parallel reduction: fp16, bf16, topk:RATIO, "
        "powersgd:RANK (as paracube train's --compress)",
    )
    t.add_argument(
        "--offload",
        default=None,
        help="optimizer (states and step in host memory) or none; default: only where a "
        "layout does not fit without it",
    )
    t.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fix sequence parallelism on or off (default: on wherever tp > 1)",
    )
    t.add_argument(
        "--stack",
        default=None,
        help="the training software to plan for, all its facts at once (each flag below "
        "overrides its own): paracube (default: what paracube train runs), megatron-core "
        "(Transformer Engine's blocks, the fused loss, weight gradients accumulated by the "
        "GEMMs, Megatron's even pipeline split), nemo or megatron-bridge (the same, with the "
        "tensor-parallel collectives overlapped as their recipes run them), "
        "megatron-lm-2021 (unfused attention, no sequence parallelism, gradients reduced "
        "after the backward, even split), fsdp or torchtitan (PyTorch FSDP2: gradients cast "
        "and divided on a side stream, gathered parameters copied out into each parameter), "
        "fsdp1 (FSDP1's flat parameters: no copy-out) or composer (its FSDP1 without backward "
        "prefetch, the fused loss); the search then proposes only what the stack runs, and "
        "tries context parallelism where it runs it",
    )
    t.add_argument(
        "--attention",
        default=None,
        help="fused (FlashAttention-2 / PyTorch SDPA, paracube's default), fused-v1 "
        "(FlashAttention's own CUDA kernels before flash-attn 2.0), fused-triton "
        "(FlashAttention in Triton, as MPT's attn_impl: triton) or unfused (s×s scores "
        "materialized, as Megatron-LM before 2022)",
    )
    t.add_argument(
        "--overlap-grad-reduce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="data-parallel gradients reduced during the last backward (default, as paracube does) "
        "or only after it (--no-overlap-grad-reduce: Megatron-LM 2021, DeepSpeed's pipeline engine)",
    )
    t.add_argument(
        "--backward-prefetch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ZeRO-3: the next unit's parameters gathered during this unit's backward "
        "(default, as paracube, FSDP2 and FSDP1's BACKWARD_PRE do) or only after it "
        "(--no-backward-prefetch: FSDP1's BACKWARD_POST, Composer's default)",
    )
    t.add_argument(
        "--grad-reduce",
        default=None,
        help="under bf16/fp16, gradients accumulated and reduced in fp32 (default, as paracube "
        "train and Megatron do) or in the compute dtype (compute: half the bytes)",
    )
    t.add_argument(
        "--shard-group",
        type=int,
        default=None,
        help="hybrid sharding: ZeRO within groups of N data-parallel ranks, replicated across "
        "the groups — ZeRO-3 (HSDP: FSDP's HYBRID_SHARD; the default) or, with --zero 1, the "
        "optimizer states only (InternLM's zero1 size); planned, not run by paracube train "
        "(the FSDP stacks' searches try one node's group themselves)",
    )
    t.add_argument(
        "--param-sync",
        default=None,
        help="ZeRO-1/2's updated slices brought back after the step: one all-gather "
        "(all-gather: paracube train, Megatron, DeepSpeed; default) or a broadcast from each "
        "rank of the ZeRO group that owns parameters, in turn (broadcast: InternLM — a chain "
        "to fill, hop by hop, per owner)",
    )
    t.add_argument(
        "--grad-bucket",
        default=None,
        help="the gradient buckets of a reduction overlapped with the backward, whose last one "
        "is always waited for: 25 MiB (ddp: paracube train's --bucket-mb default, PyTorch "
        "DDP's; default), Megatron-Core's max(40M, 1M × dp) elements (megatron) or "
        "InternLM's 512M (internlm)",
    )
    t.add_argument(
        "--grad-sync",
        default=None,
        help="ZeRO-1's gradient reduction before each rank steps its slice: an all-reduce of "
        "the whole buffer (all-reduce: paracube train, InternLM; default) or a reduce-scatter "
        "into each rank's slice (reduce-scatter: Megatron-Core's distributed optimizer, half "
        "the traffic)",
    )
    t.add_argument(
        "--zero3-pipeline",
        default=None,
        help="ZeRO-3 under a pipeline: not run (none: paracube train; default) or each stage "
        "gathered once a step and kept, its gradients reduce-scattered after its last backward "
        "(per-step: torchtitan's FSDP2 under PyTorch's pipelining)",
    )
    t.add_argument(
        "--param-gather",
        default=None,
        help="ZeRO-3's gathered parameters: used where the all-gather wrote them (flat: "
        "paracube train, FSDP1, DeepSpeed; default) or copied out into each parameter "
        "(per-parameter: FSDP2, one read and write of every gathered parameter per pass)",
    )
    t.add_argument(
        "--optimizer-kernel",
        default=None,
        help="the AdamW step: one fused kernel (fused: paracube train, Megatron's and "
        "Transformer Engine's FusedAdam; default) or an op per pass over the states "
        "(multi-op: torch.optim.AdamW's default, Composer's DecoupledAdamW — 80 bytes a "
        "parameter against 28)",
    )
    t.add_argument(
        "--clip-scale",
        default=None,
        help="clipping rescales the gradients only when their norm is over the limit "
        "(when-clipped: paracube train, Megatron; default) or always (torch's and FSDP's "
        "clip_grad_norm_: one more read and write of every gradient)",
    )
    t.add_argument(
        "--recompute-replay",
        default=None,
        help="a fully recomputed block replayed until backward has what it needs "
        "(early-stop: torch's non-reentrant checkpoint since PyTorch 2.1 — paracube train, "
        "PyTorch FSDP, torchtitan; the block's last matmul is not redone; default) or whole "
        "(Megatron, DeepSpeed, InternLM, a reentrant or older torch checkpoint)",
    )
    t.add_argument(
        "--recompute-scope",
        default=None,
        help="which N blocks --recompute-blocks N takes: the model's first N (model: paracube "
        "train's; default) or the first N of every stage's chunk of blocks (stage: Megatron's "
        "--recompute-method block, the megatron-core, nemo and megatron-bridge stacks')",
    )
    t.add_argument(
        "--logit-metrics",
        type=int,
        default=None,
        metavar="N",
        help="cross-entropy metrics the trainer computes over every micro-batch's logits "
        "beside the loss (Composer's training metrics: 2; paracube train: 0, the default) — "
        "each a cast of the logits to fp32 and a log-softmax: 14 bytes a 16-bit logit",
    )
    t.add_argument(
        "--grad-accumulation",
        default=None,
        help="how each micro-batch's weight gradients reach the buffer they are reduced from: "
        "buffer (a pass adding them in, as paracube train, Megatron's DDP hook and FSDP do; "
        "default), fused (the weight-gradient GEMM accumulates: Megatron-Core's "
        "--gradient-accumulation-fusion), bf16-optimizer (cast to fp32, then added: "
        "DeepSpeed's BF16_Optimizer) or side-stream (cast and pre-divided beside the compute: "
        "PyTorch FSDP)",
    )
    t.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tensor-parallel collectives overlapped with the matmuls they feed (Megatron-Core's "
        "--tp-comm-overlap, NeMo's ub_tp_comm_overlap); default off, as paracube's tensor "
        "parallel waits for them",
    )
    t.add_argument(
        "--fp8-scaling",
        default=None,
        help="under --precision fp8: delayed (scales from the amax history, Transformer "
        "Engine's default; the planner's) or current (each tensor's own amax read before its "
        "cast: Megatron-Bridge's FP8-CS, torchao's dynamic float8)",
    )
    t.add_argument(
        "--loss",
        default=None,
        help="the loss's backward: torch (paracube's: two fp32 gradients of the logits' shape "
        "alive at once; default) or fused (computed in place: Megatron's vocabulary-parallel "
        "cross-entropy, llm-foundry's fused one)",
    )
    t.add_argument(
        "--recompute-blocks",
        type=int,
        default=None,
        help="recompute only the first N blocks, whole (implies --recompute full; as paracube "
        "train's --recompute-blocks — under --stack megatron-core, nemo or megatron-bridge the "
        "first N of every stage's chunk, as their --recompute-method block; default: the "
        "fewest that fit)",
    )
    t.add_argument(
        "--activations",
        default=None,
        help="what a block keeps for backward, in the memory model: paracube (its own blocks, "
        "op by op; default) or megatron (Megatron-Core with Transformer Engine: sequence-"
        "parallel inputs kept sharded, grouped-query keys and values unexpanded, FP8 inputs "
        "under --precision fp8)",
    )
    t.add_argument(
        "--pipeline-split",
        dest="split",
        default=None,
        help="how the blocks are cut into pipeline stages: engine (paracube train's cut by "
        "--balance, which gives a heavy embedding or head fewer blocks beside it; default), "
        "even (Megatron's equal blocks per virtual stage, the embedding and head on top) or "
        "even-ends (the embedding and the loss each counted as a block: Megatron-Core's "
        "--account-for-embedding/loss-in-pipeline-split) or torchtitan (the embedding and "
        "the head a layer each, the layers dealt as evenly as they go, the first stages "
        "taking the rest)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=5)
    o.add_argument("--explain", action="store_true", help="the reasoning, in plain language")
    o.add_argument(
        "--epochs",
        type=float,
        default=None,
        help="time to train this many epochs, on the best layout and on the speed-up's "
        "baseline (resnet50: ImageNet-1k's 1,281,167 images; transformers: --train-samples)",
    )
    o.add_argument(
        "--train-samples",
        type=float,
        default=None,
        help="samples (sequences, images) in one epoch, for --epochs",
    )
    o.add_argument(
        "--train-tokens",
        type=token_count,
        default=None,
        metavar="N",
        help="time to train on N tokens (a transformer's budget: 2e12, 300B, 15T), on the best "
        "layout and on the speed-up's baseline",
    )
    o.add_argument("--json", action="store_true", help="every figure as JSON")
    o.add_argument(
        "--emit",
        choices=["torchrun", "megatron"],
        default=None,
        help="print the launch command: paracube train's (torchrun), or Megatron-LM's "
        "pretrain_gpt.py for a plan as Megatron-LM runs it (megatron: --stack megatron-core)",
    )
    o.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine (matmul rate, memory and gloo bandwidth) for `train --predict`",
    )
    p.set_defaults(func=cmd_plan)


# The custom-shape flags (their ModelConfig fields are spelled out in _model_shape)
SHAPE = ("layers", "hidden", "heads", "vocab", "seq", "ffn", "kv_heads")
# a custom shape's block: flags named as ModelConfig's fields, and --no-bias (bias=False)
BLOCK = (
    "activation",
    "norm",
    "position",
    "tie_embeddings",
    "no_bias",
    "experts",
    "experts_per_token",
    "head_size",
    "qk_norm",
)


def _plan_model(args):
    """The transformer to plan: --model's, or the custom shape's; --recompute-blocks checked
    against its blocks."""
    cfg = _model_shape(args)
    if args.recompute_blocks is not None and args.recompute_blocks > cfg.n_layers:
        raise ParacubeError(
            f"--recompute-blocks {args.recompute_blocks} is more than the model's "
            f"{cfg.n_layers} blocks: give at most {cfg.n_layers}"
        )
    return cfg


def _model_shape(args):
    from paracube.config import ModelConfig

    custom = {k: getattr(args, k) for k in SHAPE}
    for k, value in custom.items():
        if value is not None and value <= 0:
            raise ParacubeError(f"--{k.replace('_', '-')} must be a positive integer, got {value}")
    if args.head_size is not None and args.head_size <= 0:
        raise ParacubeError(f"--head-size must be a positive integer, got {args.head_size}")
    block = {k: getattr(args, k) for k in BLOCK if k != "no_bias" and getattr(args, k) is not None}
    if args.no_bias:
        block["bias"] = False
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
# runs them too.
SOFTWARE = (
    "loss",
    "attention",
    "overlap_grad_reduce",
    "grad_reduce",
    "backward_prefetch",
    "activations",
    "tp_comm_overlap",
    "fp8_scaling",
    "split",
    "grad_accumulation",
    "param_gather",
    "param_sync",
    "grad_sync",
    "grad_bucket",
    "zero3_pipeline",
    "optimizer_kernel",
    "clip_scale",
    "logit_metrics",
    "recompute_replay",
    "recompute_scope",
)


def _plan_fixed(args, gpus: int, mixed: bool = False) -> dict:
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
        if set(layout) - {"dp", "tp", "pp", "cp", "ep"} or any(v <= 0 for v in layout.values()):
            raise ParacubeError(
                f"--layout {args.layout!r}: only dp, tp, pp, cp and ep, each a positive integer"
            )
        if "ep" in layout and "dp" in layout and layout["dp"] % layout["ep"]:
            raise ParacubeError(
                f"--layout ep={layout['ep']} does not divide dp={layout['dp']}: expert "
                "parallelism spreads the experts over data-parallel ranks; choose an ep that divides dp"
            )
        if layout.get("ep", 1) > 1 and args.emit == "torchrun":
            raise ParacubeError(
                f"--layout ep={layout['ep']} with --emit torchrun: paracube train builds dense "
                "models and runs no expert parallelism (ep is planned to evaluate "
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
        degrees = {k: v for k, v in layout.items() if k != "ep"}  # ep is carved out of dp
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
    if args.recompute_blocks is not None:
        fixed.update(recompute="full", recompute_blocks=args.recompute_blocks)
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


def cmd_plan(args) -> int:
    if args.calibrate:  # the same as `paracube calibrate`
        from paracube.cli.calibrate import cmd_calibrate

        return cmd_calibrate(args)
    mixed = _gpus(args)
    _default_precision(args, mixed)
    _check_args(args, whole_nodes=mixed is None)  # a mixed cluster's pools are checked apart
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
    cfg = other or _plan_model(args)  # a transformer (ModelConfig) or a generic model
    if isinstance(cfg, ModelConfig) and cfg.moe and args.emit == "torchrun":
        raise ParacubeError(
            f"{cfg.name} is a mixture of experts ({cfg.experts} experts) with --emit torchrun: "
            "paracube train builds dense models (a mixture is planned, not run); drop one"
        )
    if isinstance(cfg, ModelConfig) and cfg.qk_norm and args.emit == "torchrun":
        from paracube.models.sources import parse_model

        if args.model is None or parse_model(args.model).kind != "hf":
            raise ParacubeError(
                f"{cfg.name} has per-head q/k norms with --emit torchrun: paracube's GPT has "
                "none; plan its Hugging Face config (--model hf:DIR) for a command that trains it"
            )
    training_tokens(args, cfg)  # refused before the search, not after its table
    if other is not None and args.global_batch % args.gpus:
        lower = args.global_batch // args.gpus * args.gpus
        multiples = " or ".join(str(n) for n in (lower, lower + args.gpus) if n > 0)
        raise ParacubeError(
            f"--global-batch {args.global_batch} does not divide over --gpus {args.gpus}: "
            f"{cfg.name} is planned data parallel only (one replica per GPU); use {multiples}"
        )
    cluster = _cluster(args)
    from paracube.planner.time_model import at_precision

    at_precision(cluster, args.precision)  # units the GPU lacks: refused before the search
    fixed = _plan_fixed(args, args.gpus)
    if fixed.get("ep", 1) > 1 and not (isinstance(cfg, ModelConfig) and cfg.moe):
        raise ParacubeError(
            f"--layout ep={fixed['ep']}: expert parallelism spreads a mixture of experts, and "
            f"{cfg.name} is dense; drop ep, or plan a mixture (--experts, a preset such as "
            "mixtral-8x7b)"
        )
    result = _search(args, cfg, cluster, fixed)
    if not result.ranked:
        return _nothing_fits(result, cfg, cluster, args)
    _print(args, cfg, cluster, result)
    return 0


def _gpus(args):
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


def _default_precision(args, pools) -> None:
    """Unless ``--precision`` is given, the GPUs' own (:func:`~paracube.planner.hardware.
    default_precision`: bf16, fp16 on V100s)."""
    if args.precision is not None:
        return
    from paracube.planner import hardware as hw

    keys = [p.key for p in pools] if pools else [args.gpu.lower()]
    args.precision = hw.default_precision([hw.GPUS[k] for k in keys if k in hw.GPUS])


# Beyond any cluster built (the largest are ~10⁵ GPUs); bounds the search's enumeration.
MAX_GPUS = 2**20


def _check_args(args, whole_nodes: bool = True) -> None:
    from paracube.choices import (
        ACTIVATION_MEMORY,
        ATTENTION,
        CLIP_SCALING,
        FP8_SCALING,
        GRAD_ACCUMULATION,
        GRAD_BUCKETS,
        GRAD_REDUCE,
        GRAD_SYNC,
        LOSS_BACKWARD,
        OFFLOAD,
        OPTIMIZER_KERNELS,
        PARAM_GATHER,
        PARAM_SYNC,
        PIPELINE_SPLIT,
        PLANNED_RECOMPUTE,
        PRECISIONS,
        RECOMPUTE,
        RECOMPUTE_REPLAY,
        RECOMPUTE_SCOPES,
        ZERO3_PIPELINE,
        ZERO_STAGES,
    )
    from paracube.pipeline.schedules import SCHEDULES
    from paracube.planner.stacks import STACK_SOFTWARE
    from paracube.values import compression

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
            f"--train-samples {_count_text(args.train_samples)} without --epochs: it sizes the "
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
    named: tuple[tuple[str, str, tuple], ...] = (  # (dest, flag, the names it takes)
        ("zero", "--zero", ZERO_STAGES),
        ("schedule", "--schedule", tuple(SCHEDULES)),
        ("recompute", "--recompute", RECOMPUTE + PLANNED_RECOMPUTE),
        ("attention", "--attention", ATTENTION),
        ("fp8_scaling", "--fp8-scaling", FP8_SCALING),
        ("split", "--pipeline-split", PIPELINE_SPLIT),
        ("loss", "--loss", LOSS_BACKWARD),
        ("grad_accumulation", "--grad-accumulation", GRAD_ACCUMULATION),
        ("param_gather", "--param-gather", PARAM_GATHER),
        ("param_sync", "--param-sync", PARAM_SYNC),
        ("grad_sync", "--grad-sync", GRAD_SYNC),
        ("grad_bucket", "--grad-bucket", GRAD_BUCKETS),
        ("zero3_pipeline", "--zero3-pipeline", ZERO3_PIPELINE),
        ("optimizer_kernel", "--optimizer-kernel", OPTIMIZER_KERNELS),
        ("clip_scale", "--clip-scale", CLIP_SCALING),
        ("recompute_replay", "--recompute-replay", RECOMPUTE_REPLAY),
        ("recompute_scope", "--recompute-scope", RECOMPUTE_SCOPES),
        ("activations", "--activations", ACTIVATION_MEMORY),
        ("grad_reduce", "--grad-reduce", GRAD_REDUCE),
        ("offload", "--offload", OFFLOAD),
        ("stack", "--stack", tuple(STACK_SOFTWARE)),
    )
    for name, flag, allowed in named:
        value = getattr(args, name)
        if value is not None and value not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            raise ParacubeError(f"unknown {flag} {value!r}: choose one of {choices}")
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


def _cluster(args):
    from paracube.planner import hardware as hw
    from paracube.planner.time_model import Cluster

    gpu, key = _gpu(args)
    return Cluster(
        gpu,
        min(args.gpus_per_node, args.gpus),
        hw.interconnect(args.intra or hw.DEFAULT_INTRA[key]),
        hw.interconnect(args.inter or hw.DEFAULT_INTER[key]),
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


def _count_text(value: float) -> str:
    """A count as the user wrote it: 1000000 (not 1e+06); 2.5."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


# --train-tokens' suffixes: thousands to trillions of tokens (B, as budgets are written)
TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def tokens_text(count: float) -> str:
    """A token count as budgets are written: 15T, 300B, 2.5M; below a thousand, plain."""
    for suffix in "TBMK":
        scale = TOKEN_SUFFIXES[suffix]
        if count >= scale:
            return f"{count / scale:,.4g}{suffix}"
    return f"{count:,.0f}"


def token_count(text: str) -> float:
    """``--train-tokens``: a positive count, plain (2e12) or with a suffix (300B, 15T)."""
    import argparse

    scale = TOKEN_SUFFIXES.get(text[-1:].upper(), 1.0)
    digits = text[:-1] if scale != 1.0 else text
    try:
        value = float(digits) * scale
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive token count such as 2e12, 300B or 15T, got {text!r}"
        )
    return value


def epoch_samples(args, cfg) -> float | None:
    """Samples in one epoch for --epochs (--train-samples, or the model's own dataset:
    resnet50's ImageNet-1k), checked before any search; None without --epochs."""
    if args.epochs is None:
        return None
    per_epoch = args.train_samples or getattr(cfg, "dataset_samples", 0)
    if not per_epoch:
        raise ParacubeError(
            f"--epochs {args.epochs:g}: needs --train-samples N (samples per epoch); "
            "resnet50 knows ImageNet-1k's"
        )
    return per_epoch


def training_tokens(args, cfg) -> float | None:
    """The training budget in tokens (a model without tokens: samples) — --epochs ×
    samples per epoch × tokens per sample, or --train-tokens — checked before any search;
    None without either."""
    if args.train_tokens is not None:
        if not isinstance(cfg, ModelConfig):
            raise ParacubeError(
                f"--train-tokens {tokens_text(args.train_tokens)}: {cfg.name} takes "
                "samples, not tokens; give its budget in --epochs"
            )
        return args.train_tokens
    per_epoch = epoch_samples(args, cfg)
    if per_epoch is None:
        return None
    return args.epochs * per_epoch * (cfg.seq_len if isinstance(cfg, ModelConfig) else 1)


def budget_text(args, cfg) -> str:
    """The training budget in words, as the time-to-train line opens."""
    if args.train_tokens is not None:
        return f"Time to train {tokens_text(args.train_tokens)} tokens"
    per_epoch = epoch_samples(args, cfg)
    return (
        f"Time to train {args.epochs:g} epoch{'' if args.epochs == 1 else 's'} of "
        f"{per_epoch:,.0f} samples"
    )


def duration(tokens: float, tokens_per_s: float) -> str:
    """Wall time to see ``tokens`` at ``tokens_per_s``: hours, and days past two."""
    hours = tokens / tokens_per_s / 3600
    return f"{hours:,.2f} h" + (f" ({hours / 24:,.1f} days)" if hours >= 48 else "")


def _generic_zero_reason(model, best, cluster, precision: str) -> str:
    """Why a model described without layers is sharded: its ZeRO stage's states over the
    data-parallel group, and the replicated twin's fit and step (report.without_zero_text)."""
    from paracube.planner.generic import evaluate
    from paracube.planner.report import without_zero_text

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


def _training_seconds(args, cfg, result, baseline) -> dict | None:
    """The training budget's time for --json: tokens, and seconds on the best layout and on
    the baseline (None where there is none); None without a budget."""
    tokens = training_tokens(args, cfg)
    if tokens is None or not result.ranked:
        return None
    return {
        "tokens": tokens,
        "seconds": tokens / result.ranked[0].time.tokens_per_s,
        "baseline_seconds": None if baseline is None else tokens / baseline.best.time.tokens_per_s,
    }


def _time_to_train(args, cfg, best, baseline) -> str:
    """--epochs or --train-tokens: the time to train on the best layout and on the baseline
    (one GPU or node)."""
    from paracube.planner.report import describe

    tokens = training_tokens(args, cfg)
    assert tokens is not None  # called under a training budget
    line = (
        f"{budget_text(args, cfg)}: {duration(tokens, best.time.tokens_per_s)} "
        f"on {best.layout.gpus} GPUs ({describe(best.layout)})"
    )
    if baseline is not None and baseline.gpus < best.layout.gpus:
        line += (
            f", against {duration(tokens, baseline.best.time.tokens_per_s)} on {baseline.gpus} "
            f"GPU{'s' if baseline.gpus > 1 else ''} ({baseline.speedup(best):.2f}× faster)"
        )
    return line + "."


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
    software = {k: v for k, v in _plan_fixed(args, args.gpus).items() if k in SOFTWARE}
    for gpus in _baseline_counts(args.gpus, cluster.gpus_per_node):
        few = Namespace(**{**vars(args), "gpus": gpus, "top": 1})
        ranked = _search(few, cfg, cluster, software).ranked
        if ranked:
            return Baseline(gpus, ranked[0])
    return None


def _print(args, cfg, cluster, result) -> None:
    import json
    from dataclasses import asdict

    from paracube.planner.published import track_record as record_of
    from paracube.planner.report import (
        describe,
        explain,
        scaling,
        table,
        to_json,
        torchrun_command,
        track_record,
    )

    g = cluster.gpu
    baseline = _baseline(args, cfg, cluster) if result.ranked else None
    wanted = args.json or args.explain
    record = record_of(args.stack, args.gpu.lower(), args.precision) if wanted else None
    if args.json:
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
                    "time_to_train": _training_seconds(args, cfg, result, baseline),
                }
            )
        )
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
        print("\n" + _time_to_train(args, cfg, result.ranked[0], baseline))
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
        reasons = "; ".join(
            f"{why} ({n} layout{'s' if n > 1 else ''})"
            for why, n in sorted(result.rejected.items())
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
    raise ParacubeError(
        f"{cfg.name} fits no layout on {args.gpus} × {g.name}{given}: "
        f"the leanest ({describe(result.smallest_misfit.layout)}) "
        f"needs {need / 1e9:.1f} GB per GPU, {need / g.memory_bytes:.1f}× the {g.memory_bytes / 1e9:.0f} GB; "
        f"{drop}use {recompute}{gpus}GPUs with more memory, or a smaller global batch / micro-batch"
    )


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
            ranked = _search(lifted, cfg, cluster, _plan_fixed(lifted, args.gpus)).ranked
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

    if {"dp", "tp", "pp"} <= set(_plan_fixed(args, args.gpus)):  # as --layout gave them
        return None  # the whole layout is fixed: more GPUs cannot run it
    node = args.gpus_per_node  # the cluster of --gpus below a node is one partial node

    def best(count: int):
        more = Namespace(**{**vars(args), "gpus": count, "top": 1})
        try:
            ranked = _search(more, cfg, _cluster(more), _plan_fixed(more, count)).ranked
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
