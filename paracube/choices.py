"""Every option a user picks by name, and the bytes per element of each precision.

One owner per fact: the config dataclasses, the engines, the planner and the command
line all read these tuples, so a new choice is added here once. Pipeline schedules are
the exception: their names are the keys of the schedule registry
(:data:`paracube.pipeline.schedules.SCHEDULES`), which owns everything about a schedule.
Torch-free.
"""

from __future__ import annotations

AXES = ("pp", "dp", "tp")  # mesh axes, outermost to innermost (docs/ARCHITECTURE.md)
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
# how rotary frequencies are stretched for a longer context than pre-training's (ModelConfig
# rope_scaling): none; linear (every frequency ÷ factor, Chen et al. 2023, position
# interpolation); llama3 (Llama 3.1's: low frequencies ÷ factor, high ones kept, a smooth
# blend between, by wavelength against the original context)
ROPE_SCALINGS = ("none", "linear", "llama3")
# how a mixture's router scores the experts (ModelConfig.router_score)
ROUTER_SCORES = ("softmax", "sigmoid")
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
# paracube train --compile: the blocks run eager (none), torch.compile'd with inductor, or
# with inductor's decompositions and partitioner but no code generation (partition: what a
# compiled block keeps for backward, at eager speed — torch's aot_eager_decomp_partition)
COMPILE = ("none", "inductor", "partition")
COMPILE_BACKENDS = {"inductor": "inductor", "partition": "aot_eager_decomp_partition"}
# planner: torchtitan's op-level selective checkpointing (its activation_checkpoint
# selective_ac_option "op"): every matmul's and the attention kernel's output kept but every
# second matmul's, the rest of the block recomputed — planned for the stacks that run it,
# not run by paracube train
PLANNED_RECOMPUTE = ("op",)
# planner: what a selective recomputation recomputes — Megatron-Core's --recompute-modules
# (megatron/core/transformer/transformer_config.py, recompute_modules; default core_attn):
# the attention core (core_attn: paracube train's selective), a latent attention's up
# projections, whose per-head queries, keys and values are dropped once the core has run
# and made again for its backward (mla_up_proj: MultiLatentAttention's up-projection
# checkpoint), a dense block's MLP checkpointed whole, its input kept (mlp: not a
# mixture's MoE layer, which Megatron recomputes as "moe"), and the element-wise work whose
# output the next linear keeps as its saved input — the experts' activation (moe_act) and
# the two norms (layernorm) —, dropped once that linear has run and made again for its
# backward (Megatron's CheckpointWithoutOutput: under FP8 the linear keeps its own FP8
# copy, so nothing is dropped); and a mixture's whole MoE layer (moe: MoELayer's reentrant
# checkpoint — router, the dispatch's all-to-alls, the experts, the shared experts — run
# again in backward, its input kept) or its shared experts alone (shared_experts)
RECOMPUTE_MODULES = (
    "core_attn",
    "mla_up_proj",
    "mlp",
    "moe_act",
    "layernorm",
    "moe",
    "shared_experts",
)
# planner: how a fully recomputed block's forward is replayed in backward — torch's
# non-reentrant checkpoint stops as soon as every tensor backward needs is back (early-stop:
# the default since PyTorch 2.1, pytorch/pytorch#96866 — so the block's last matmul, whose
# output only enters the residual sum, is never redone: paracube train, PyTorch FSDP's
# checkpoint_wrapper, torchtitan) or the whole forward runs again (whole: Megatron's and
# DeepSpeed's checkpoint functions, torch's reentrant checkpoint, any checkpoint before 2.1)
RECOMPUTE_REPLAY = ("early-stop", "whole")
PRECISIONS = ("fp32", "bf16", "fp16")
OFFLOAD = ("none", "optimizer")  # what lives and steps in host memory instead of the GPU's
COMPRESSORS = ("none", "fp16", "bf16", "topk", "powersgd")  # --compress KIND[:VALUE]
# --dp-mode KIND[:N]: how replicas agree
DP_MODES = ("sync", "local-sgd", "diloco", "stale", "ps")
GRAD_REDUCE = ("fp32", "compute")  # dtype of gradient accumulation/reduction under bf16/fp16
BALANCE = ("params", "flops", "memory", "time", "speed")  # how pipeline stages are cut
MEASURED_BALANCE = ("time", "speed")  # measured on the ranks' real layers (built whole)
# planner: FlashAttention-2 (SDPA), FlashAttention (v1, CUDA), FlashAttention in Triton,
# FlashAttention-3 (Hopper), or s×s scores materialized
ATTENTION = ("fused", "fused-v1", "fused-triton", "fused-v3", "unfused")
# kernels that never store the s×s scores
FUSED_ATTENTION = ("fused", "fused-v1", "fused-triton", "fused-v3")
# the fused kernels that run on Hopper's tensor cores alone, in 16-bit (or FP8) operands
HOPPER_ATTENTION = ("fused-v3",)
# fp8 (planner): each tensor's scale from the amax history (Transformer Engine's delayed
# scaling) or from its own amax, read just before the cast (current scaling)
FP8_SCALING = ("delayed", "current")
# planner: what a block keeps for backward — paracube's own blocks, Megatron-Core's with
# Transformer Engine (planner.memory.te_block_bytes), or paracube's blocks under
# torch.compile (models.shapes.block_saved_bytes, compiled: torchtitan's and OLMo-core's
# compiled blocks)
ACTIVATION_MEMORY = ("paracube", "megatron", "compiled")
# planner: how a block's element-wise ops (norms, rotary, activation, residual adds) reach
# HBM — fused (Transformer Engine's and FlashAttention's fused kernels, torch.compile: what
# the block keeps for backward, read and written) or eager (one PyTorch kernel per op, each
# reading its inputs and writing its output: models.shapes.eager_elementwise_bytes)
ELEMENTWISE = ("fused", "eager")
# planner: how the blocks are cut into pipeline stages — paracube train's cut by --balance
# (engine), or the same count of blocks per virtual stage, the embedding and the head on
# top of the first's and the last's (even: Megatron-Core's default, Megatron-DeepSpeed's
# partition_method="type:transformer"), or with the embedding and the loss each counted as
# one block (even-ends: Megatron-Core's --account-for-embedding/loss-in-pipeline-split), or
# torchtitan's: the embedding and the norm + head one layer each, the layers dealt over the
# stages as evenly as they go, the first stages taking what does not divide (torchtitan);
# beside these names, an explicit layout in Megatron-Core's grammar
# (paracube.planner.pipeline_layout)
PIPELINE_SPLIT = ("engine", "even", "even-ends", "torchtitan")
# which blocks a partial recomputation (--recompute-blocks N) takes: the model's first N
# (model: paracube's engine), or the first N of every pipeline stage's chunk of blocks (stage:
# Megatron's --recompute-method block, megatron/core/transformer/transformer_block.py)
RECOMPUTE_SCOPES = ("model", "stage")
# the splits that count the embedding and the loss (the norm + head) as a layer each, so a
# pipeline may have as many stages as blocks + 2
ENDS_AS_LAYERS = ("even-ends", "torchtitan")
# planner: the loss's backward — paracube's (two fp32 gradients of the logits' shape) or one
# computed in place (Megatron's vocabulary-parallel cross-entropy, llm-foundry's fused one)
LOSS_BACKWARD = ("torch", "fused")
# planner: how each micro-batch's weight gradients reach the buffer they are reduced from —
# a pass outside the GEMMs (buffer: paracube's FlatUnit.absorb, Megatron's DDP hook
# main_grad.add_, FSDP's cast for its reduce-scatter), none (fused: Megatron-Core's
# gradient_accumulation_fusion, the weight-gradient GEMM accumulating into main_grad), or
# a cast to fp32 and then an add (bf16-optimizer: DeepSpeed's BF16_Optimizer.update_hp_grads),
# or FSDP's cast and pre-divide on its post-backward stream, beside the compute (side-stream)
GRAD_ACCUMULATION = ("buffer", "fused", "bf16-optimizer", "side-stream")
# ZeRO-3's gathered parameters: used where the all-gather wrote them (flat: paracube's units,
# FSDP1's FlatParameter, DeepSpeed's partitions — parameters are views of the gathered buffer)
# or copied out of it into each parameter's own tensor (per-parameter: FSDP2's DTensor
# shards, whose gathered buffer holds every rank's shard of every parameter in turn)
PARAM_GATHER = ("flat", "per-parameter")
# planner: how ZeRO-1/2 bring every rank's updated slice back into the full parameters after
# the step — one all-gather (all-gather: paracube, Megatron's distributed optimizer,
# DeepSpeed) or one broadcast from each rank of the ZeRO group that owns parameters, in turn
# (broadcast: InternLM's HybridZeroOptimizer.broadcast_params), which pays a ring's latency
# once per owner
PARAM_SYNC = ("all-gather", "broadcast")
# planner: how ZeRO-1 reduces the gradients before each rank steps its slice — an all-reduce
# of the whole buffer, of which each rank then steps its slice (all-reduce: paracube's
# engine, InternLM, PyTorch's ZeroRedundancyOptimizer over DDP, DeepSpeed's BF16_Optimizer)
# or a reduce-scatter that leaves each rank only its slice reduced (reduce-scatter:
# Megatron-Core's distributed optimizer, ``_ParamAndGradBucketGroup.start_grad_sync``), half
# the ring's traffic. ZeRO-0 always all-reduces, ZeRO-2/3 always reduce-scatter.
GRAD_SYNC = ("all-reduce", "reduce-scatter")
# planner: how the data-parallel gradients are bucketed for a reduction overlapped with the
# backward — the last bucket fills only when the backward ends, so its reduction is always
# waited for (dp_comm.last_bucket_time): 25 MiB of gradients (ddp: paracube train's
# --bucket-mb default, as PyTorch DDP's bucket_cap_mb), max(40M, 1M × dp) elements
# (megatron: Megatron-Core's DistributedDataParallelConfig bucket_size default, grown with the
# group) or 512 × 1024 × 1024 elements (internlm: its configs' hybrid_zero_optimizer
# reduce_bucket_size)
GRAD_BUCKETS = ("ddp", "megatron", "internlm")
# planner: how ZeRO-3 runs under a pipeline — not at all (none: paracube's engine, which would
# re-gather each stage's parameters every micro-batch, refuses it) or with each stage's
# parameters gathered once a step and kept, its gradients accumulated unsharded and
# reduce-scattered after its last backward (per-step: FSDP2 under PyTorch's pipelining as
# torchtitan runs it — reshard_after_forward off when pipelining, torchtitan's apply_fsdp;
# no gradient sync nor reshard until the last backward, torch/distributed/pipelining/
# stage.py backward_maybe_with_nosync)
ZERO3_PIPELINE = ("none", "per-step")
# planner: where the fp32 main weights of mixed-precision training live — in the optimizer,
# beside 16-bit parameters (optimizer: paracube's engine, Megatron's and DeepSpeed's mixed
# precision, ZeRO's 2 + 2 + 12 bytes) or in the fp32 parameters themselves, cast to the
# compute dtype only when used (parameters: PyTorch FSDP's mixed precision — FSDP1's
# MixedPrecision(param_dtype), FSDP2's MixedPrecisionPolicy — whose shards are the fp32
# parameters and whose all-gathers cast them: torch/distributed/fsdp/_fully_shard/
# _fsdp_param.py). Under ZeRO-3 the latter keeps no 16-bit shard: its 16-bit copy exists only
# gathered (layout_memory._gathered_bytes). Or nowhere (none): pure 16-bit training — the
# parameters, their gradients and the optimizer's two moments all in the compute dtype, 2 +
# 2 + 4 bytes, no fp32 copy at all. NeMo AutoModel's own models are cast to bf16 when their
# weights are initialised (initialize_weights(dtype=torch.bfloat16) → cast_model_to_dtype,
# nemo_automodel/components/models/*/model.py) and stepped by torch.optim.Adam, whose moments
# take the parameter's dtype (torch.zeros_like(p), torch/optim/adam.py); FSDP2 reduces in
# fp32 (MixedPrecisionPolicy's reduce_dtype) but keeps each sharded gradient in the sharded
# parameter's dtype
MASTER_WEIGHTS = ("optimizer", "parameters", "none")
# planner: the dtype of Adam's two moments (exp_avg, exp_avg_sq) beside the main weights —
# fp32 (paracube's engine, torch's Adam under mixed precision: ZeRO's K = 12) or bf16, as
# DeepSeek-V3 trained ("we adopt the BF16 data format instead of FP32 to track the first and
# second moments in the AdamW optimizer", DeepSeek-AI 2024, §3.3.3) and Megatron-Core's
# precision-aware optimizer keeps them (--use-precision-aware-optimizer --exp-avg-dtype bf16
# --exp-avg-sq-dtype bf16: Transformer Engine's FusedAdam; Megatron-Bridge's DeepSeek-V3
# recipe): 4 + 2 + 2 optimizer bytes a parameter under 16-bit training, 2 + 2 + 2 in bf16
# (the main weight's int16 remainder: state_bytes_per_parameter)
MOMENTS = ("fp32", "bf16")
# planner: how a mixture's token dispatcher sends a rank's tokens to the experts' ranks — a
# row for each token and each of its k experts (alltoall: Megatron-Core's
# MoEAlltoAllTokenDispatcher, --moe-token-dispatcher-type alltoall, paracube's default), or
# each token once to every rank holding any of its experts, which copies it to them there
# (deepep: DeepEP's dispatch — deep_ep/buffer.py, get_dispatch_layout's
# is_token_in_rank[tokens, ranks] —, Megatron-Core's flex dispatcher, NeMo AutoModel's
# "TE + DeepEP"); the combine mirrors it
EP_DISPATCH = ("alltoall", "deepep")
# planner: which experts a token's router picks, as far as the dispatch's traffic is
# concerned: its top k, counted as k of the E experts drawn at random — balanced on average,
# as an auxiliary loss keeps them (top-k; Megatron-Core's --moe-router-force-load-balancing
# draws them at random) — or experts i·k … i·k + k − 1 mod E for the i-th token (round-robin:
# NeMo AutoModel's FakeBalancedGate, nemo_automodel/components/moe/layers.py, which its
# benchmarks run: fake_balanced_gate true)
ROUTERS = ("top-k", "round-robin")
# planner: the AdamW step's kernels over fp32 weights, gradients, m and v — one fused kernel
# (fused: paracube's, apex's and Transformer Engine's FusedAdam, torch's fused=True) or an
# op per pass over the states (multi-op: torch.optim.AdamW's default multi-tensor path,
# Composer's DecoupledAdamW; time_model.OPTIMIZER_BYTES)
OPTIMIZER_KERNELS = ("fused", "multi-op")
# planner: whether clipping rescales the gradients only when their norm is over the limit
# (when-clipped: paracube's and Megatron's, which read the norm on the host first) or always,
# by the clamped coefficient, to spare that host sync (always: torch.nn.utils.clip_grad_norm_,
# FSDP1's FullyShardedDataParallel.clip_grad_norm_)
CLIP_SCALING = ("when-clipped", "always")
ON_NAN = ("stop", "skip", "continue")  # a non-finite loss or gradient norm: what then
METRICS_MODES = ("new", "append", "overwrite")  # an existing --metrics file: refuse, add, replace

# Bytes of one model / activation element in each precision.
# tf32: the planner's fp32 run with TF32 tensor-core matmuls (fp32 values everywhere);
# fp8: the planner's bf16 run whose blocks' linear layers compute in FP8 (Transformer
# Engine, as Megatron-Core and NeMo run it): values and weights stay bf16
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


def gradient_bytes(elem: int, grad_reduce: str = "fp32") -> int:
    """Bytes of one gradient element, as it is accumulated and reduced, for ``elem``-byte
    weights: 4 under ``--grad-reduce fp32`` (the default, as Megatron-LM forces for bf16:
    "bfloat16 requires gradient accumulation and all-reduce to be done in fp32",
    megatron/training/arguments.py), else the weights' own."""
    if grad_reduce not in GRAD_REDUCE:
        from paracube.errors import ConfigError

        raise ConfigError(f"unknown grad_reduce {grad_reduce!r}: choose fp32 or compute")
    return 4 if grad_reduce == "fp32" else elem


def state_bytes_per_parameter(
    precision: str,
    grad_reduce: str = "fp32",
    master_weights: str = "optimizer",
    moments: str = "fp32",
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes per parameter under Adam.

    fp32: 4 + 4 + 8 (the two moments). bf16/fp16: 2 + 4 + 12 — 16-bit weights, fp32
    gradients (:func:`gradient_bytes`; 2 under ``--grad-reduce compute``: ZeRO's 2 + 2 + 12),
    fp32 master weights and moments (Rajbhandari et al. 2020, ZeRO's K = 12). Pure 16-bit
    training (``master_weights="none"``, :data:`MASTER_WEIGHTS`): 2 + 2 + 4, every state in
    the compute dtype, whatever the dtype the gradients are reduced in. PyTorch FSDP's fp32
    parameters as the main weights (``master_weights="parameters"``): fp32 gradients whatever
    the dtype they are reduced in, since FSDP casts each reduced gradient to its sharded
    parameter's dtype before accumulating it (FSDP1: ``_cast_grad_to_param_dtype`` in
    torch/distributed/fsdp/_runtime_utils.py; FSDP2: ``foreach_reduce``'s
    ``_to_dtype_if_needed(reduce_output, orig_dtype)`` in _fsdp_collectives.py). Adam's two
    moments in bf16 (``moments``, :data:`MOMENTS`: DeepSeek-V3's, Megatron-Core's
    precision-aware optimizer) take 2 + 2 bytes instead of 4 + 4; and in bf16 training that
    optimizer keeps of each fp32 main weight only the low 16 bits the bf16 parameter lacks
    (Megatron-Core's ``OptimizerConfig.store_param_remainders``, True by default: the
    distributed optimizer's ``master_param`` shard is int16 "if store_param_remainders and
    bf16"; Transformer Engine's FusedAdam joins the halves as it steps): 2 + 2 + 2 bytes.
    Under fp8 the planner keeps the 4-byte main weight: with fp8 parameters gathered
    (``--fp8-param-gather``) Megatron-Core holds it in fp32 itself.

    >>> state_bytes_per_parameter("bf16"), state_bytes_per_parameter("bf16", master_weights="none")
    ((2, 4, 12), (2, 2, 4))
    >>> state_bytes_per_parameter("bf16", "compute", "parameters")
    (2, 4, 12)
    >>> state_bytes_per_parameter("bf16", "compute", moments="bf16")
    (2, 2, 6)
    >>> state_bytes_per_parameter("fp8", "compute", moments="bf16")
    (2, 2, 8)
    """
    elem = ELEMENT_BYTES[precision]
    if master_weights == "none" and elem < 4:
        return (elem, elem, 2 * elem)
    moment_bytes = 2 * (2 if moments == "bf16" else 4)
    if master_weights == "parameters":
        return (elem, 4, moment_bytes + (4 if elem < 4 else 0))
    main = 4 if elem < 4 else 0
    if moments == "bf16" and precision == "bf16":
        main = 2  # the int16 remainder beside the bf16 parameter (store_param_remainders)
    return (elem, gradient_bytes(elem, grad_reduce), moment_bytes + main)
