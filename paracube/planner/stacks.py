"""The software of the stacks the planner describes, as layout facts (pure data).

A published run is timed with the software it ran (``paracube.planner.published``), and a
user planning for another stack names it once (``paracube plan --stack``) instead of each
fact: the attention kernel, the loss, what a block keeps, how gradients are accumulated and
reduced, the pipeline split, ZeRO-3's prefetching. Each fact is a :class:`~paracube.planner.
layout.Layout` field; paracube's own software is every field at its default (the
``paracube`` stack). Explicit choices override a stack's. A stack also narrows what the
search proposes to what it can run (:data:`STACK_CHOICES`: its schedules, ZeRO stages,
recomputation, model parallelism).

>>> stack("megatron-core")["grad_accumulation"]
'fused'
>>> from paracube.models.presets import preset
>>> from paracube.planner import hardware as hw
>>> from paracube.planner.search import search
>>> from paracube.planner.time_model import Cluster
>>> h100 = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
>>> best = search(preset("llama3-8b"), h100, gpus=8, global_batch=128, top=1,
...               fixed=stack("nemo") | {"zero": 1}).ranked[0]
>>> best.layout.activations, best.layout.tp_comm_overlap, best.layout.zero
('megatron', True, 1)
"""

from __future__ import annotations

from typing import TypedDict

from paracube.errors import ConfigError

# Megatron's vocabulary-parallel cross-entropy computes its gradient in the saved softmax's
# own buffer (megatron/core/tensor_parallel/cross_entropy.py, backward: grad_input = softmax,
# then in-place updates), not in two new fp32 tensors as paracube's loss does
MEGATRON_LOSS: dict[str, object] = dict(loss="fused")
# Megatron's pipeline split: the same number of blocks in every (virtual) stage, the embedding
# and the head on top of the first's and the last's (Megatron-LM's get_num_layers,
# Megatron-Core's get_num_layers_to_build; Megatron-DeepSpeed's GPTModelPipe:
# partition_method="type:transformer"), not paracube's cut by parameters (stages.even_shares)
MEGATRON_SPLIT: dict[str, object] = dict(split="even", **MEGATRON_LOSS)
# Megatron's full recomputation replays each checkpointed chunk whole: its own
# CheckpointFunction (megatron/core/tensor_parallel/random.py, a torch.autograd.Function
# whose backward reruns the forward under enable_grad, as torch's reentrant checkpoint
# does) — and so do DeepSpeed's (deepspeed/runtime/activation_checkpointing, its own
# reentrant CheckpointFunction) and InternLM's (below)
WHOLE_REPLAY: dict[str, object] = dict(recompute_replay="whole")
# Megatron-Core with Transformer Engine (its README's runs, NeMo, Megatron-Bridge): the fused
# loss, blocks that keep what TE's modules keep (memory.te_block_bytes), weight gradients
# accumulated by the GEMMs themselves (--gradient-accumulation-fusion, on unless
# --no-gradient-accumulation-fusion: megatron/training/arguments.py), and under its
# distributed optimizer (ZeRO-1) each gradient bucket reduce-scattered rather than
# all-reduced (megatron/core/distributed/param_and_grad_buffer.py, start_grad_sync: a
# reduce-scatter when ddp_config.use_distributed_optimizer, else an all-reduce); a partial
# recomputation is its --recompute-method block: the first N layers of every model chunk,
# on every pipeline stage (megatron/core/transformer/transformer_block.py, _checkpointed_
# forward: layer l < recompute_num_layers of the chunk), not the model's first N; and its
# gradient buckets are DistributedDataParallelConfig's default size (dp_comm.bucket_elements)
MEGATRON_CORE: dict[str, object] = dict(
    activations="megatron",
    recompute_scope="stage",
    grad_accumulation="fused",
    grad_sync="reduce-scatter",
    grad_bucket="megatron",
    **MEGATRON_SPLIT,
    **WHOLE_REPLAY,
)
# Megatron-LM 2021 and DeepSpeed's pipeline engine: unfused attention, no sequence parallelism,
# gradients all-reduced after the last backward
MEGATRON_2021: dict[str, object] = dict(
    attention="unfused",
    sequence_parallel=False,
    overlap_grad_reduce=False,
    **MEGATRON_SPLIT,
    **WHOLE_REPLAY,
)
# The dtype gradients are reduced in (the planner's default: fp32). Megatron-LM under fp16
# reduces fp16 gradients unless asked (--accumulate-allreduce-grads-in-fp32 defaults off);
# under bf16 it forces fp32 ("bfloat16 requires gradient accumulation and all-reduce to be
# done in fp32", megatron/training/arguments.py) — MT-NLG's Megatron-DeepSpeed and
# Megatron-Core alike. Llama 3: "we use FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32 across
# data parallel workers in FSDP" (§3.3.4). Composer: the sweep's FSDP mixed_precision
# DEFAULT (reduce_dtype float32); torchtitan: mixed_precision_reduce "float32".
MEGATRON_FP16: dict[str, object] = dict(grad_reduce="compute")
# Composer's FSDP (FSDP1) gathers a unit's parameters for backward only after the backward
# before it: FSDPConfig's backward_prefetch defaults to BACKWARD_POST (composer.utils.
# FSDPConfig), which the sweep leaves as is (submit_benchmarks.py sets it only when asked;
# the mpt-*.yaml fsdp_config does not). torchtitan's FSDP2 prefetches (the planner's default).
# Its MPT loss is llm-foundry's default fused_crossentropy (ComposerMPTCausalLM's loss_fn
# default, llmfoundry/models/mpt/modeling_mpt.py: flash-attn's xentropy kernel). PyTorch
# FSDP (1 and 2) casts and pre-divides each unit's gradient on its post-backward stream, and
# its stacks clip with FSDP1's clip_grad_norm_ or torch.nn.utils.clip_grad_norm_ (FSDP2's
# DTensors), which rescale every gradient whatever the norm: "multiplying by the clamped coef
# is redundant when the coef is clamped to 1, but doing so avoids a `if clip_coef < 1:`
# conditional which can require a CPU <=> device synchronization" (torch/nn/utils/clip_grad.py).
# Its mixed precision keeps the fp32 parameters as the main weights, cast to bf16 as they are
# gathered (MixedPrecision's param_dtype, MixedPrecisionPolicy's), no 16-bit shard at rest.
PYTORCH_FSDP: dict[str, object] = dict(
    grad_accumulation="side-stream", clip_scale="always", master_weights="parameters"
)
# FSDP2 (fully_shard: torchtitan, NeMo AutoModel, today's PyTorch FSDP) shards each parameter
# on its own and copies every gathered unit out into its parameters (the planner's
# per-parameter gather); FSDP1's FlatParameter is a view of what the all-gather wrote
FSDP2: dict[str, object] = dict(param_gather="per-parameter", **PYTORCH_FSDP)
# torchtitan pipelines FSDP2 stages: with pipeline parallelism on, its apply_fsdp leaves
# reshard_after_forward off ("For PP, by default do not reshard after forward to avoid
# per-microbatch all-gathers", torchtitan/models/llama3/infra/parallelize.py), and PyTorch's
# schedules keep each stage unsharded with no gradient sync until its last backward
# (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync): gathered once a step;
# its stages are cut by its own split (stages.torchtitan_shares); its blocks run eager unless
# compiled (its train configs' compile = false; norm_type "rmsnorm", torch's composite), their
# element-wise ops counted op by op — under --activations compiled, fused
TORCHTITAN: dict[str, object] = dict(
    zero3_pipeline="per-step", split="torchtitan", elementwise="eager", **FSDP2
)
# llm-foundry's yamls step Composer's DecoupledAdamW (optimizer name decoupled_adamw:
# composer/optim/decoupled_weight_decay.py, a loop over the parameters, op by op). Composer's
# trainer updates the model's training metrics after every micro-batch's backward
# (Trainer._train_microbatch → _eval_train_metrics, on the logits the forward returned), and
# its train_metrics are set from the model's get_metrics(is_train=True) whatever the run: for
# llm-foundry's ComposerMPTCausalLM (and mosaicml/examples' ComposerMosaicGPT before it)
# LanguageCrossEntropy and LanguagePerplexity, whose update is LanguageCrossEntropy's — each
# a torch.nn.CrossEntropyLoss over the whole (b·s, V) logits (composer/metrics/nlp.py).
COMPOSER_FSDP: dict[str, object] = dict(
    backward_prefetch=False,
    loss="fused",
    optimizer_kernel="multi-op",
    logit_metrics=2,
    **PYTORCH_FSDP,
)

# NeMo and Megatron-Bridge train with Megatron-Core's modules, and their performance
# recipes overlap the tensor-parallel collectives with Transformer Engine's userbuffers
# (NeMo-Framework-Launcher's training yamls, ub_tp_comm_overlap: true — gpt3, nemotron,
# llama3, llama3_1; Megatron-Bridge's CommOverlapConfig(tp_comm_overlap=True)), which
# Megatron-Core leaves off unless --tp-comm-overlap
NEMO: dict[str, object] = dict(tp_comm_overlap=True, **MEGATRON_CORE)

# InternLM's trainer (InternLM/InternLM, the 2023 code its scaling tables ran): its
# HybridZeroOptimizer reduces each 512M-element bucket of gradients (its configs'
# reduce_bucket_size=512 * 1024 * 1024) in the weights' dtype
# (reduce_tensor(dtype=self.dtype), bf16) on a side stream during the last micro-batch's
# backward (earlier ones set skip_grad_reduce), steps torch.optim.AdamW (its default
# multi-tensor path) on its ZeRO-1 slice, always multiplies the gradients by the clipping
# and loss-scale coefficient (_unscale_and_clip_grads), and brings the slices back with one
# dist.broadcast from each rank of the ZeRO group (broadcast_params); its loss is flash-attn's
# CrossEntropyLoss with inplace_backward (FlashGPTLMLoss), its attention flash-attn's —
# FlashAttention's first CUDA kernels, the planner's fused-v1: the code pins
# "Flash-Attention == v1.0.5" (doc/en/install.md: PyTorch 1.13.1, CUDA 11.7, Apex 23.05,
# flash-attention built from the pinned third_party submodule); its activation_checkpoint
# runs reentrant ("activation_checkpiont do not support kwargs when use_reentrant = True",
# internlm/model/modeling_internlm.py), replaying the whole block.
INTERNLM: dict[str, object] = dict(
    attention="fused-v1",
    recompute_replay="whole",
    grad_reduce="compute",
    param_sync="broadcast",
    grad_bucket="internlm",
    optimizer_kernel="multi-op",
    clip_scale="always",
    loss="fused",
)

# The stacks a plan can be asked for by name: paracube's own (every fact at its default) and
# the ones whose facts above were read from their code (torchtitan trains with FSDP2).
STACK_SOFTWARE: dict[str, dict[str, object]] = {
    "paracube": {},
    "megatron-core": MEGATRON_CORE,
    "nemo": NEMO,
    "megatron-bridge": NEMO,
    "megatron-lm-2021": MEGATRON_2021,
    "fsdp": FSDP2,
    "fsdp1": PYTORCH_FSDP,
    "torchtitan": TORCHTITAN,
    "composer": COMPOSER_FSDP,
    "internlm": INTERNLM,
}


# What each stack can run, where it is narrower than what the planner enumerates: the
# layout field and the values it takes (a plan for the stack proposes nothing else).
# Megatron's pipeline schedules are 1F1B and its interleaved form (megatron/core/
# pipeline_parallel/schedules.py, get_forward_backward_func: no pipelining, without and with
# interleaving; Narayanan et al. 2021 §2.2). Megatron-LM 2021 checkpointed whole layers
# (--checkpoint-activations; selective recomputation is Korthikanti et al. 2022) and sharded
# no optimizer state (its runs are plain data parallel; the distributed optimizer came in
# 2022). PyTorch FSDP stacks checkpoint whole modules (torch.utils.checkpoint around a block:
# FSDP's apply_activation_checkpointing, llm-foundry's activation_checkpointing, torchtitan's
# "full" and "selective layer" — every N-th block, recompute_blocks here; its "selective op"
# policy is the planner's recompute "op", not its selective recomputation of the attention
# core: OP_RECOMPUTE_STACKS). llm-foundry's
# Composer runs trained MPT with FSDP alone (no tensor or pipeline parallelism: its
# NO_SHARD, SHARD_GRAD_OP and FULL_SHARD are ZeRO 0, 2 and 3). InternLM pipelines with 1F1B
# or, when a model has num_chunks > 1, its interleaved scheduler (configs/7B_sft.py), shards
# with ZeRO-1 only (parallel.zero1: "if zero1 == 1, zero is not used") and checkpoints a
# fraction of whole blocks (model.checkpoint: True/False/[0-1]). torchtitan shards with FSDP2
# (ZeRO-3) or replicates (data_parallel_replicate_degree, DDP: ZeRO-0) — no ZeRO-1 or 2 —
# pipelined or not.
MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")
WHOLE_BLOCKS = ("none", "full")
# Megatron-Core shards the optimizer states alone (its distributed optimizer: ZeRO-1) or
# everything (torch FSDP2 or Megatron FSDP: ZeRO-3; megatron/training/arguments.py
# --use-distributed-optimizer, --use-torch-fsdp2) — no ZeRO-2
MEGATRON_ZERO = (0, 1, 3)
STACK_CHOICES: dict[str, dict[str, tuple]] = {
    "megatron-core": {"schedule": MEGATRON_SCHEDULES, "zero": MEGATRON_ZERO},
    "nemo": {"schedule": MEGATRON_SCHEDULES, "zero": MEGATRON_ZERO},
    "megatron-bridge": {"schedule": MEGATRON_SCHEDULES, "zero": MEGATRON_ZERO},
    "megatron-lm-2021": {"schedule": MEGATRON_SCHEDULES, "zero": (0,), "recompute": WHOLE_BLOCKS},
    "fsdp": {"recompute": WHOLE_BLOCKS},
    "fsdp1": {"recompute": WHOLE_BLOCKS},
    "torchtitan": {"recompute": (*WHOLE_BLOCKS, "op"), "zero": (0, 3)},
    "composer": {"tp": (1,), "pp": (1,), "zero": (0, 2, 3), "recompute": WHOLE_BLOCKS},
    "internlm": {"schedule": MEGATRON_SCHEDULES, "zero": (0, 1), "recompute": WHOLE_BLOCKS},
}


# The stacks that run context parallelism, which the search then tries too (paracube's engine
# does not): Megatron-Core's --context-parallel-size (ring attention over its cp group),
# NeMo's and Megatron-Bridge's context_parallel_size, torchtitan's context_parallel_degree.
CONTEXT_PARALLEL_STACKS = ("megatron-core", "nemo", "megatron-bridge", "torchtitan")


# The stacks whose pipeline split can also count the embedding and the loss as a block each,
# and the splits the search then tries: Megatron-Core's account_for_embedding_in_pipeline_split
# and account_for_loss_in_pipeline_split (megatron/core/transformer/transformer_config.py;
# NeMo's and Megatron-Bridge's model configs carry them: Megatron-Bridge's Llama 3.1 405B
# recipe runs them) beside its plain even split — so 126 blocks (Llama 3 405B) pipeline over
# 16 stages as Meta's did (:func:`paracube.planner.stages.even_shares`, ``ends``).
STACK_SPLITS: dict[str, tuple[str, ...]] = {
    name: ("even", "even-ends") for name in ("megatron-core", "nemo", "megatron-bridge")
}

# The stacks that run op-level selective checkpointing, which the search then tries too:
# torchtitan's activation_checkpoint mode "selective" with selective_ac_option "op" (its
# _apply_op_sac: every op output in its save list kept but every second matmul's;
# paracube.models.shapes.op_checkpoint_linears) — the default of its Llama 3 8B config.
OP_RECOMPUTE_STACKS = ("torchtitan",)

# The stacks that run hybrid sharding — ZeRO within a node, replicas across nodes — and the
# ZeRO stage they shard so, which the search then tries too (paracube's engine shards over the
# whole group): ZeRO-3 for PyTorch FSDP's ShardingStrategy.HYBRID_SHARD (FSDP1: "shard
# within a node, replicate across nodes"), FSDP2's fully_shard over a 2-D (replicate, shard)
# DeviceMesh — torchtitan's data_parallel_replicate_degree — and Composer's FSDPConfig
# sharding_strategy HYBRID_SHARD; ZeRO-1 for InternLM's zero1 size ("for smaller models, it
# is usually a better choice to split the parameters within nodes with a setting <= 8",
# configs/7B_sft.py).
HYBRID_SHARD_STACKS: dict[str, int] = {
    "fsdp": 3,
    "fsdp1": 3,
    "torchtitan": 3,
    "composer": 3,
    "internlm": 1,
}


def stack(name: str) -> dict[str, object]:
    """The layout facts of the stack ``name`` (a copy: the caller may add to it)."""
    if name not in STACK_SOFTWARE:
        raise ConfigError(f"unknown stack {name!r}: choose one of {', '.join(STACK_SOFTWARE)}")
    return dict(STACK_SOFTWARE[name])


def stack_choices(name: str | None) -> dict[str, tuple]:
    """What the stack ``name`` can run, field by field (:data:`STACK_CHOICES`; {}: anything
    the planner enumerates)."""
    if name is None:
        return {}
    stack(name)  # a known stack
    return dict(STACK_CHOICES.get(name, {}))


# The stacks that move the optimizer to the host only with a ZeRO stage of theirs, and which:
# Megatron-Core offloads its distributed optimizer's states (--optimizer-cpu-offload, its
# hybrid-device optimizer on the precision-aware path: megatron/training/arguments.py,
# validate_args) — ZeRO-1 only
OFFLOAD_ZERO: dict[str, tuple[int, ...]] = {
    name: (1,) for name in ("megatron-core", "nemo", "megatron-bridge")
}


class SearchOptions(TypedDict):
    """The keyword arguments of :func:`paracube.planner.search.search` a stack decides."""

    allowed: dict[str, tuple]
    context_parallel: bool
    hybrid_shard: int
    op_recompute: bool
    splits: tuple[str, ...]
    offload_zero: tuple[int, ...] | None


def search_options(name: str | None, split_chosen: bool = False) -> SearchOptions:
    """How the search runs for the stack ``name`` (None: paracube's own), as keyword
    arguments of :func:`paracube.planner.search.search`: what the stack can run
    (:data:`STACK_CHOICES`), and what it runs beyond paracube's engine that the search then
    tries too — context parallelism, hybrid sharding, op-level checkpointing, its pipeline
    splits (not where the user chose one: ``split_chosen``).

    >>> search_options("nemo")["splits"], search_options("nemo", split_chosen=True)["splits"]
    (('even', 'even-ends'), ())
    """
    key = name or ""
    return SearchOptions(
        allowed=stack_choices(name),
        context_parallel=key in CONTEXT_PARALLEL_STACKS,
        hybrid_shard=HYBRID_SHARD_STACKS.get(key, 0),
        op_recompute=key in OP_RECOMPUTE_STACKS,
        splits=() if split_chosen else STACK_SPLITS.get(key, ()),
        offload_zero=OFFLOAD_ZERO.get(key),
    )
