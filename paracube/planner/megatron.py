"""A planned layout as the Megatron-LM command that runs it (``paracube plan --emit megatron``).

The flags are Megatron-LM's own (``megatron/training/arguments.py``, its 2025 releases):
the model's shape, the parallel sizes, the schedule, the pipeline split, ZeRO, recomputation,
overlap and precision — what the planner timed, and nothing it did not. A layout whose
planned software Megatron-LM cannot run as planned is refused with the reason
(:func:`megatron_refusal`), never emitted as something else:

- ZeRO-2: Megatron-LM shards the optimizer states alone (``--use-distributed-optimizer``,
  ZeRO-1) or everything (``--use-torch-fsdp2``, ZeRO-3; "not currently working with
  Pipeline Parallel", its help says);
- recomputation of the model's first N blocks under a pipeline (paracube's engine):
  ``--recompute-method block`` recomputes the first N of *every* stage's chunks — what the
  planner plans for Megatron-Core (``recompute_scope="stage"``); one stage, N blocks, is the
  same either way;
- bf16 gradients reduced in bf16: Megatron-LM reduces them in fp32 under bf16 ("bfloat16
  requires gradient accumulation and all-reduce to be done in fp32");
- the optimizer offloaded without the distributed optimizer: ``--optimizer-cpu-offload``
  offloads its states (and takes ``--use-precision-aware-optimizer``, as its validate_args
  asserts);
- the pipeline splits, schedules, attention kernels and collectives only paracube's engine
  or the FSDP stacks run (plan with ``--stack megatron-core`` and they are not proposed).

Data: ``--mock-data`` with Megatron's ``NullTokenizer`` at the planned vocabulary (its
``--vocab-size`` one fewer: the tokenizer adds its end-of-document id), so the
command runs as printed, a benchmark of the layout; swap in ``--data-path`` and a tokenizer
to train. Megatron pads the vocabulary to a multiple of 128 × tp
(``--make-vocab-size-divisible-by``), as its runs do.
"""

from __future__ import annotations

import itertools
import math
import shlex

from paracube.choices import RECOMPUTE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.planner.layout import Layout
from paracube.planner.pipeline_layout import is_layout
from paracube.planner.stacks import MEGATRON_SCHEDULES, MEGATRON_ZERO, OFFLOAD_ZERO, STACK_SPLITS

# The layout choices Megatron-LM runs, where it runs fewer than the planner plans, and what
# it runs in words: the one list the command refuses from (a layout's, or the flags'
# before any search: :func:`unrun_choice`); schedules, ZeRO stages and splits are the
# megatron-core stack's (planner.stacks)
MEGATRON_RUNS: dict[str, tuple[tuple, str]] = {
    "zero": (MEGATRON_ZERO, "ZeRO 0, 1 (its distributed optimizer) or 3 (torch FSDP2)"),
    "recompute": (RECOMPUTE, "whole blocks (full) or the attention core (selective)"),
    "schedule": (MEGATRON_SCHEDULES, "1F1B and its interleaved form"),
    "split": (STACK_SPLITS["megatron-core"], "even stages, the embedding and loss optionally "
              "counted as blocks (even, even-ends)"),
    "attention": (("fused", "unfused"), "Transformer Engine's fused attention or its unfused one"),
    "compress": (("none",), "whole gradients"),
    "shard": ((0,), "ZeRO over the whole data-parallel group"),
    "grad_bucket": (("megatron",), "its own buckets, max(40M, 1M × dp) gradient elements"),
    "router": (("top-k",), "its router's top k (at random under "
               "--moe-router-force-load-balancing)"),
    # its optimizer keeps fp32 main parameters beside the 16-bit ones (under its FSDP2 too);
    # its precision-aware optimizer's --main-params-dtype takes fp32 or fp16, never bf16
    "master_weights": (("optimizer",), "fp32 main weights in its optimizer beside 16-bit "
                       "parameters"),
}  # fmt: skip
# the fields whose choice matters only under a pipeline
PIPELINE_FIELDS = ("schedule", "split")


def unrun_choice(field: str, value) -> str | None:
    """What Megatron-LM runs instead, in words, when it does not run ``value`` of the layout
    field ``field`` (:data:`MEGATRON_RUNS`); None when it does — an explicit pipeline layout
    is its own grammar (--pipeline-model-parallel-layout)."""
    if field == "split" and is_layout(value):
        return None
    runs, words = MEGATRON_RUNS.get(field, ((value,), ""))
    return None if value in runs else words


# the flags that ask for the pipeline splits Megatron-LM cuts (stacks.STACK_SPLITS)
SPLIT_FLAGS = {
    "even": [],
    "even-ends": [
        "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split",
    ],
}
# Megatron-Core's token dispatchers by how the planner dispatches (Layout.ep_dispatch)
DISPATCHERS = {
    "alltoall": "--moe-token-dispatcher-type alltoall",
    "deepep": "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep",
}
# Transformer Engine's FP8 recipes by how the planner scales (Layout.fp8_scaling)
FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise"}


def megatron_refusal(layout: Layout, cfg: ModelConfig, precision: str) -> str | None:
    """Why Megatron-LM cannot run ``layout`` as it was planned — one line naming the choice
    and what it would take — or None when it can."""
    L = layout
    for field in MEGATRON_RUNS:
        value = getattr(L, field)
        words = unrun_choice(field, value)
        if words and (L.pp > 1 or field not in PIPELINE_FIELDS):
            return f"{field} {value}: Megatron-LM runs {words}"
    if L.zero == 3 and L.pp > 1:
        return "ZeRO-3 under a pipeline: Megatron-LM's FSDP2 does not run with pipeline parallelism"
    if L.moments == "bf16" and L.zero != 1:
        return (
            f"bf16 moments under ZeRO-{L.zero}: Megatron-LM's precision-aware optimizer runs "
            "only under its distributed optimizer (ZeRO-1)"
        )
    partial = L.recompute != "none" and L.recompute_blocks is not None
    if partial and L.pp > 1 and L.recompute_scope != "stage":
        return (
            f"recomputation of the model's first {L.recompute_blocks} block"
            f"{'s' if L.recompute_blocks != 1 else ''} under a pipeline: "
            "Megatron-LM's --recompute-method block recomputes the first N of every stage's "
            "blocks"
        )
    # over one data-parallel rank every stage is the distributed optimizer's whole state
    if L.offload and L.zero not in OFFLOAD_ZERO["megatron-core"] and L.grad_group > 1:
        return (
            f"the optimizer offloaded under ZeRO-{L.zero}: Megatron-LM offloads its distributed "
            "optimizer's states (ZeRO-1)"
        )
    if L.param_sync != "all-gather" or (L.zero == 1 and L.grad_sync == "all-reduce"):
        return (
            "the distributed optimizer's collectives as planned: Megatron-LM reduce-scatters "
            "gradients and all-gathers parameters"
        )
    if precision in ("bf16", "fp8") and L.grad_reduce != "fp32":
        return "gradients reduced in bf16: Megatron-LM reduces bf16 gradients in fp32"
    if precision == "tf32":
        return "tf32: plan Megatron-LM in bf16, fp16, fp8 or fp32"
    return None


def moe_layer_freq(cfg: ModelConfig) -> str:
    """Megatron-Core's --moe-layer-freq pattern for ``cfg``'s blocks, 1 a mixture's block,
    0 a dense one, as the Python list expression it evaluates
    (megatron/training/arguments.py, ``moe_freq_type``): runs of equal blocks.

    >>> cfg = ModelConfig(n_layers=8, hidden=64, n_heads=4, vocab_size=100, seq_len=32,
    ...                   experts=8, experts_per_token=2, dense_layers=(0, 1, 2))
    >>> moe_layer_freq(cfg)
    '([0]*3+[1]*5)'
    """
    kinds = [0 if i in cfg.dense_layers else 1 for i in range(cfg.n_layers)]
    runs = [f"[{kind}]*{len(list(run))}" for kind, run in itertools.groupby(kinds)]
    return f"({'+'.join(runs)})"


# Megatron-LM's defaults for what rope_args and the norm's epsilon set (megatron/training/
# arguments.py: --rotary-base 10000, --norm-epsilon 1e-5): a model at them needs no flag
MEGATRON_ROTARY_BASE = 10000
MEGATRON_NORM_EPS = 1e-5
# Llama 3.1's stretch as Megatron-Core builds it (RotaryEmbedding._apply_scaling): only its
# factor is an argument, the low and high frequency factors and the original context fixed
LLAMA3_FIXED_STRETCH = (1.0, 4.0, 8192)


def rope_refusal(cfg: ModelConfig) -> str:
    """Why :func:`rope_args` cannot state ``cfg``'s rotary positions ("" if it can): a base
    that is not a whole number (Megatron's --rotary-base is an int), a linear stretch by a
    fraction (--rotary-seq-len-interpolation-factor is an int) or a Llama 3.1 stretch whose
    frequency factors or original context are not the fixed ones."""
    if cfg.position != "rope":
        return ""
    if cfg.rope_theta != int(cfg.rope_theta):
        return (
            f"{cfg.name}'s rotary base {cfg.rope_theta:g} is not a whole number, which "
            "Megatron's --rotary-base takes; plan it without --emit megatron"
        )
    if cfg.rope_scaling == "linear" and cfg.rope_factor != int(cfg.rope_factor):
        return (
            f"{cfg.name}'s linear rotary stretch by {cfg.rope_factor:g} is not a whole number, "
            "which Megatron's --rotary-seq-len-interpolation-factor takes; plan it without "
            "--emit megatron"
        )
    stretch = (cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_context)
    if cfg.rope_scaling == "llama3" and stretch != LLAMA3_FIXED_STRETCH:
        low, high, context = LLAMA3_FIXED_STRETCH
        return (
            f"{cfg.name}'s Llama 3.1 rotary stretch (frequency factors {stretch[0]:g} and "
            f"{stretch[1]:g}, original context {stretch[2]:,}) is not the one Megatron-Core "
            f"builds ({low:g}, {high:g}, {context:,}: only --rope-scaling-factor is an "
            "argument); plan it without --emit megatron"
        )
    return ""


def rope_args(cfg: ModelConfig) -> list[str]:
    """Megatron-LM's flags for ``cfg``'s rotary positions beyond its defaults: plain rotary
    positions for a latent attention (--rope-type rope), the base θ (--rotary-base), Llama
    3.1's stretch (--use-rope-scaling --rope-scaling-factor f) or a linear one
    (--rotary-seq-len-interpolation-factor f: positions divided by f, as dividing every
    frequency by f). Without them the command would train other positions than the
    planned model's (Llama 3's θ = 500,000 against Megatron's 10,000).

    >>> from paracube.models.presets import preset
    >>> rope_args(preset("llama3-8b")), rope_args(preset("gpt3-1.3b"))
    (['--rotary-base 500000'], [])
    """
    if cfg.position != "rope":
        return []
    # a latent attention takes YaRN's stretch unless told (--rope-type: "MLA takes yarn by
    # default"); paracube plans no YaRN
    args = ["--rope-type rope"] if cfg.mla else []
    if cfg.rope_theta != MEGATRON_ROTARY_BASE:
        args.append(f"--rotary-base {int(cfg.rope_theta)}")
    if cfg.rope_scaling == "llama3":
        args.append(f"--use-rope-scaling --rope-scaling-factor {cfg.rope_factor:g}")
    elif cfg.rope_scaling == "linear":
        args.append(f"--rotary-seq-len-interpolation-factor {int(cfg.rope_factor)}")
    return args


def router_args(cfg: ModelConfig) -> list[str]:
    """Megatron-LM's flags for how ``cfg``'s router weighs a token's experts beyond its
    default (a softmax over the top k logits): sigmoid scores
    (--moe-router-score-function sigmoid, renormalised over the k as Megatron-Core always
    does for k > 1), a softmax over every expert kept unrenormalised
    (--moe-router-pre-softmax), the expert bias that only chooses
    (--moe-router-enable-expert-bias) and the weights' scale
    (--moe-router-topk-scaling-factor).

    >>> from paracube.models.presets import preset
    >>> router_args(preset("deepseek-v3"))  # doctest: +NORMALIZE_WHITESPACE
    ['--moe-router-score-function sigmoid', '--moe-router-enable-expert-bias',
     '--moe-router-topk-scaling-factor 2.5']
    >>> router_args(preset("qwen2-57b-a14b")), router_args(preset("mixtral-8x7b"))
    (['--moe-router-pre-softmax'], [])
    """
    args = []
    if cfg.router_score == "sigmoid":
        args.append("--moe-router-score-function sigmoid")
    elif not cfg.router_renorm:
        args.append("--moe-router-pre-softmax")
    if cfg.router_expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if cfg.router_scale != 1:
        args.append(f"--moe-router-topk-scaling-factor {cfg.router_scale:g}")
    return args


def router_refusal(cfg: ModelConfig) -> str:
    """Why :func:`router_args` cannot state ``cfg``'s router ("" if it can): sigmoid scores
    kept unrenormalised over k > 1 experts (Megatron-Core renormalises them), or an expert
    bias beside softmax scores (Megatron-Core's TransformerConfig refuses it)."""
    if not cfg.moe:
        return ""
    k = cfg.experts_per_token
    if cfg.router_score == "sigmoid" and not cfg.router_renorm and k > 1:
        return (
            f"{cfg.name}'s router keeps its {k} sigmoid scores unrenormalised, which "
            "Megatron-Core renormalises for k > 1; plan it without --emit megatron"
        )
    if cfg.router_expert_bias and cfg.router_score != "sigmoid":
        return (
            f"{cfg.name}'s expert bias beside softmax scores: Megatron-Core takes the bias "
            "with sigmoid scores only; plan it without --emit megatron"
        )
    return ""


def model_refusal(cfg: ModelConfig) -> str:
    """Why Megatron-LM's command cannot train ``cfg`` as planned ("" if it can): Gemma's
    post-norms, Gemma 2's logit soft-capping, chunked attention shorter than the sequence
    (Llama 4's), and rotary positions or a router its arguments cannot state
    (:func:`rope_refusal`, :func:`router_refusal`),
    which no argument paracube emits expresses — a command without them would train
    another model."""
    if cfg.post_norms:
        return (
            f"{cfg.name}'s post-norms (four norms a block, Gemma's) have no pretrain_gpt.py "
            "argument; plan it without --emit megatron"
        )
    if cfg.attention_softcap or cfg.logit_softcap:
        return (
            f"{cfg.name}'s logit soft-capping (Gemma 2's) has no pretrain_gpt.py argument; "
            "plan it without --emit megatron"
        )
    if cfg.local_span and cfg.attention_chunk:
        return (
            f"{cfg.name}'s chunked attention (attention_chunk={cfg.attention_chunk}) has no "
            "Megatron-Core argument paracube emits; plan it without --emit megatron, or at "
            f"--seq {cfg.attention_chunk} or less, where one chunk is the whole sequence"
        )
    return rope_refusal(cfg) or router_refusal(cfg)


def megatron_args(layout: Layout, cfg: ModelConfig, precision: str, global_batch: int) -> list[str]:
    """Megatron-LM's flags for ``cfg`` under ``layout`` (refused layouts raise ConfigError:
    :func:`megatron_refusal`)."""
    refusal = megatron_refusal(layout, cfg, precision)
    if refusal:
        raise ConfigError(f"--emit megatron: {refusal}")
    L = layout
    args = [
        f"--num-layers {cfg.n_layers}",
        f"--hidden-size {cfg.hidden}",
        f"--ffn-hidden-size {cfg.dense_ffn or cfg.ffn_hidden}",  # a dense block's MLP
        f"--num-attention-heads {cfg.n_heads}",
        f"--seq-length {cfg.seq_len}",
        f"--max-position-embeddings {cfg.seq_len}",
    ]
    if cfg.mla:  # MLASelfAttention's widths (--q-lora-rank: none without a q latent)
        args.append(
            "--multi-latent-attention"
            + (f" --q-lora-rank {cfg.q_lora_rank}" if cfg.q_lora_rank else "")
            + f" --kv-lora-rank {cfg.kv_lora_rank} --qk-head-dim {cfg.head_dim}"
            f" --qk-pos-emb-head-dim {cfg.rope_head_dim} --v-head-dim {cfg.v_dim}"
        )
    elif cfg.head_size is not None:  # heads not hidden / n_heads wide (Megatron's default)
        args.append(f"--kv-channels {cfg.head_dim}")
    if cfg.n_kv_heads < cfg.n_heads:
        args.append(f"--group-query-attention --num-query-groups {cfg.n_kv_heads}")
    refusal = model_refusal(cfg)
    if refusal:
        raise ConfigError(f"--emit megatron: {refusal}")
    if cfg.local_span and cfg.attention_window:
        # FlashAttention's (left, right) extents: a window of w keys, the query's own among
        # them, reaches w - 1 back and none ahead; every N-th block at full attention
        args.append(f"--window-size {cfg.attention_window - 1},0")
        if cfg.full_attention_every:
            args.append(f"--window-attn-skip-freq {cfg.full_attention_every}")
    if cfg.qk_norm:  # each head's q and k normalised, under --normalization's kind
        args.append("--qk-layernorm")
    if cfg.activation == "swiglu":
        args.append("--swiglu")
    if cfg.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if cfg.norm_eps != MEGATRON_NORM_EPS:
        args.append(f"--norm-epsilon {cfg.norm_eps:g}")
    if cfg.position == "rope":
        args.append("--position-embedding-type rope")
        args += rope_args(cfg)
    if not cfg.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not cfg.bias:
        args.append("--disable-bias-linear")
    if cfg.qkv_bias:  # Qwen2's: q, k and v biased, no other linear
        args.append("--add-qkv-bias")
    if cfg.moe:
        args.append(
            f"--num-experts {cfg.experts} --moe-router-topk {cfg.experts_per_token} "
            + DISPATCHERS[L.ep_dispatch]
        )
        args += router_args(cfg)
        if cfg.shared_expert_ffn:
            args.append(f"--moe-shared-expert-intermediate-size {cfg.shared_expert_ffn}")
        if cfg.route_groups:  # group-limited routing (DeepSeek-V3's node-limited)
            args.append(
                f"--moe-router-num-groups {cfg.route_groups} "
                f"--moe-router-group-topk {cfg.route_group_topk}"
            )
        if cfg.dense_layers:  # dense blocks among the mixture's, each MLP at its own width
            args.append(
                f"--moe-ffn-hidden-size {cfg.ffn_hidden} --moe-layer-freq '{moe_layer_freq(cfg)}'"
            )
    if cfg.mtp_layers:  # multi-token prediction modules, on the last pipeline stage
        args.append(f"--mtp-num-layers {cfg.mtp_layers}")
    args.append("--attention-dropout 0 --hidden-dropout 0")  # the planned model has none
    # the layout
    args.append(f"--tensor-model-parallel-size {L.tp} --pipeline-model-parallel-size {L.pp}")
    if L.cp > 1:
        args.append(f"--context-parallel-size {L.cp}")
    if L.ep > 1:
        args.append(f"--expert-model-parallel-size {L.ep}")
    if L.folded:
        args.append(f"--expert-tensor-parallel-size {L.etp}")
    if L.ep_comm_overlap and L.ep > 1:
        args.append("--overlap-moe-expert-parallel-comm")
    if L.pp > 1 and is_layout(L.split):  # its stage count sets the virtual stages
        args.append(f"--pipeline-model-parallel-layout {shlex.quote(L.split)}")
    elif L.pp > 1:
        if L.schedule == "interleaved-1f1b":
            args.append(f"--num-virtual-stages-per-pipeline-rank {L.chunks}")
        args += SPLIT_FLAGS[L.split]
    if L.sequence_parallel:
        args.append("--sequence-parallel")
    args.append(f"--micro-batch-size {L.micro_batch} --global-batch-size {global_batch}")
    # ZeRO and the overlap of data-parallel communication
    if L.zero == 1 or L.offload:  # its offload is the distributed optimizer's
        args.append("--use-distributed-optimizer")
    if L.zero == 3:
        args.append("--use-torch-fsdp2")
    if L.overlap_grad_reduce and L.dp * L.cp > 1 and L.zero < 3:  # its own DDP's buckets
        args.append("--overlap-grad-reduce")
        if L.zero == 1:
            args.append("--overlap-param-gather")
    if L.offload:  # its hybrid-device optimizer takes the precision-aware path (validate_args)
        args.append("--optimizer-cpu-offload")
    if L.offload or L.moments == "bf16":
        args.append("--use-precision-aware-optimizer")
    if L.moments == "bf16":  # Transformer Engine's FusedAdam keeps them so
        args.append("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    if L.tp_comm_overlap and L.tp > 1:
        args.append("--tp-comm-overlap")
    # recomputation
    if L.recompute == "selective":
        args.append("--recompute-granularity selective")
        if L.recompute_modules != ("core_attn",):  # its default module
            args.append(f"--recompute-modules {' '.join(L.recompute_modules)}")
    elif L.recompute == "full" and L.recompute_blocks is not None:
        args.append(f"--recompute-granularity full --recompute-method block "
                    f"--recompute-num-layers {L.recompute_blocks}")  # fmt: skip
    elif L.recompute == "full":
        args.append(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        )
    if L.attention == "unfused":
        args.append("--attention-backend unfused")
    # precision
    if precision in ("bf16", "fp8"):
        args.append("--bf16")
    elif precision == "fp16":
        args.append("--fp16")
        if L.grad_reduce == "fp32":
            args.append("--accumulate-allreduce-grads-in-fp32")
    if precision == "fp8":
        args.append(f"--fp8-format hybrid --fp8-recipe {FP8_RECIPES[L.fp8_scaling]}")
    # NullTokenizer adds its end-of-document id past the ids it is given (vocab_size + 1,
    # megatron/training/tokenizer/tokenizer.py): one fewer gives the planned vocabulary
    args.append(f"--mock-data --tokenizer-type NullTokenizer --vocab-size {cfg.vocab_size - 1}")
    return args


def megatron_command(
    layout: Layout, cfg: ModelConfig, precision: str, global_batch: int, gpus_per_node: int
) -> str:
    """The torchrun command that runs ``layout`` with Megatron-LM's ``pretrain_gpt.py``, on
    ``ceil(gpus / gpus_per_node)`` nodes (run on each, ``$MASTER`` the first)."""
    nodes = math.ceil(layout.gpus / gpus_per_node)
    per_node = min(layout.gpus, gpus_per_node)
    flags = " ".join(megatron_args(layout, cfg, precision, global_batch))
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint $MASTER:29500 pretrain_gpt.py {flags}"
    )
