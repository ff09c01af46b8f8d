"""One parallel layout, as the planner evaluates it and as ``paracube train`` runs it.

:class:`Layout` is the planner's flat view of a job's layout; the engine's own view is
:class:`~paracube.config.TrainConfig` (with its ``ParallelConfig``). The two are
translated in exactly one place each way: :meth:`Layout.from_config` (a run → what the
planner predicts for it) and :meth:`Layout.to_args` (a planned layout → the ``paracube
train`` flags that run it). Vocabulary: the pipeline's *micro-batches per step* m is
``microbatches`` here and ``grad_accum`` in ``TrainConfig`` — the same number: the
engine accumulates gradients over the m micro-batches whether or not it pipelines them.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection
from dataclasses import dataclass, fields

from paracube.choices import (
    ACTIVATION_MEMORY,
    ATTENTION,
    CLIP_SCALING,
    ELEMENTWISE,
    EP_DISPATCH,
    FP8_SCALING,
    FUSED_ATTENTION,
    GRAD_ACCUMULATION,
    GRAD_BUCKETS,
    GRAD_SYNC,
    LOSS_BACKWARD,
    MASTER_WEIGHTS,
    MOMENTS,
    OPTIMIZER_KERNELS,
    PARAM_GATHER,
    PARAM_SYNC,
    PLANNED_RECOMPUTE,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    RECOMPUTE_REPLAY,
    RECOMPUTE_SCOPES,
    ROUTERS,
    ZERO3_PIPELINE,
    ZERO_STAGES,
)
from paracube.config import ModelConfig, ParallelConfig, TrainConfig, compile_refusal
from paracube.errors import ConfigError
from paracube.pipeline.schedules import SCHEDULES
from paracube.planner.pipeline_layout import is_layout, layout_refusal, stages_of

# Facts about the training software a layout may state to describe another stack — each
# field's default is what paracube train runs (Layout.from_config leaves them so): fused
# attention, gradient reduction overlapped with the backward, ZeRO-3's backward gathers
# prefetched, paracube's loss and blocks, no userbuffers overlap, a fused AdamW whose
# gradients are rescaled only when clipped, no metric computed over the logits, a recomputed
# block replayed only until backward has what it needs.
OTHER_SOFTWARE = (
    "attention",
    "overlap_grad_reduce",
    "backward_prefetch",
    "loss",
    "activations",
    "elementwise",
    "tp_comm_overlap",
    "ep_comm_overlap",
    "ep_dispatch",
    "router",
    "master_weights",
    "moments",
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
    "recompute_modules",
)


# The software facts above that paracube train also runs, beside its defaults: its blocks
# under torch.compile (--compile), and its eager blocks counted op by op
PARACUBE_SOFTWARE = frozenset({("activations", "compiled"), ("elementwise", "eager")})


# Each choice a Layout names and the values it takes (paracube.choices owns them), checked
# at construction so that a misspelt one in the API or a fixed search choice cannot match
# nothing silently.
NAMED_CHOICES: tuple[tuple[str, tuple | dict], ...] = (
    ("zero", ZERO_STAGES),
    ("recompute", RECOMPUTE + PLANNED_RECOMPUTE),
    ("schedule", SCHEDULES),
    ("attention", ATTENTION),
    ("activations", ACTIVATION_MEMORY),
    ("elementwise", ELEMENTWISE),
    ("fp8_scaling", FP8_SCALING),
    ("recompute_scope", RECOMPUTE_SCOPES),
    ("grad_accumulation", GRAD_ACCUMULATION),
    ("param_gather", PARAM_GATHER),
    ("optimizer_kernel", OPTIMIZER_KERNELS),
    ("clip_scale", CLIP_SCALING),
    ("recompute_replay", RECOMPUTE_REPLAY),
    ("param_sync", PARAM_SYNC),
    ("grad_sync", GRAD_SYNC),
    ("grad_bucket", GRAD_BUCKETS),
    ("zero3_pipeline", ZERO3_PIPELINE),
    ("loss", LOSS_BACKWARD),
    ("ep_dispatch", EP_DISPATCH),
    ("router", ROUTERS),
    ("master_weights", MASTER_WEIGHTS),
    ("moments", MOMENTS),
)


def choices_text(allowed: tuple | dict) -> str:
    """The values a choice takes, as an error names them: "a or b", or "one of a, b, c".

    >>> choices_text(("fused", "multi-op")), choices_text((0, 1, 2, 3))
    ('fused or multi-op', 'one of 0, 1, 2, 3')
    """
    names = [str(a) for a in allowed]
    return " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)


def expert_refusal(ep: int, etp: int, tp: int, dp: int, cp: int = 1, *, brief: bool = False) -> str:
    """Why ``ep`` expert-parallel ranks at expert-tensor-parallel size ``etp`` cannot be
    formed from a stage's tp × cp × dp ranks ("" if they can; :attr:`Layout.etp`). Unfolded
    (etp 0), each expert is split over the tensor-parallel ranks as the dense MLP is and the
    expert groups lie within the data-parallel ranks: ep divides dp. Folded (Megatron-Core's
    parallel folding, Liu et al. 2025, "MoE Parallel Folding"), the experts' own groups
    etp × ep × edp cover the stage's tp × cp × dp ranks: ep × etp divides them, and etp is 1
    or tp — an expert split over some of the tensor-parallel ranks, or replicated across
    them (ep × etp < tp), is not planned. ``brief``: the search's reason, listed once per
    shape it rejects."""
    if etp == 0:
        if dp % ep == 0:
            return ""
        if brief:
            return f"ep={ep} does not divide dp={dp} (fold the experts with etp=1)"
        return (
            f"ep={ep} does not divide dp={dp}: expert parallelism spreads the experts over "
            "data-parallel ranks; choose an ep that divides dp, or fold them over the "
            "tensor-parallel ranks too with etp=1 (Megatron-Core's --expert-tensor-parallel-size 1)"
        )
    if etp not in (1, tp):
        return (
            f"etp={etp} with tp={tp}: experts split over some of the tensor-parallel ranks "
            "are not planned; choose etp=1 or etp=tp"
        )
    ranks = tp * cp * dp
    if ranks % (ep * etp):
        return (
            f"ep={ep} × etp={etp} does not divide tp × cp × dp = {ranks}: the folded expert "
            "groups cover a stage's ranks; choose an ep that divides them"
        )
    if ep * etp < tp:
        return (
            f"ep={ep} × etp={etp} is below tp={tp}: experts replicated across tensor-parallel "
            "ranks are not planned; choose ep ≥ tp"
        )
    return ""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """dp × tp × pp (× cp), micro-batch b and m micro-batches per step, the pipeline schedule
    and its chunks, ZeRO stage, recomputation, sequence parallelism, and facts about the
    training software (the attention kernel; gradient reduction overlapped with backward;
    the dtype gradients are reduced in and how they are accumulated; ZeRO-3's backward
    gathers prefetched; the loss; what a block keeps; the pipeline split) — paracube's at the
    defaults, another stack's planned only (:data:`OTHER_SOFTWARE`).

    >>> Layout(dp=8, tp=8, pp=4, micro_batch=1, microbatches=32, zero=1).gpus
    256
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    zero: int = 0
    recompute: str = "none"
    # recomputation in the model's first N blocks only (the engine's --recompute-blocks;
    # None: every block) — the memory-for-time trade between none and full
    recompute_blocks: int | None = None
    # which N blocks: the model's first N (model) or each stage's chunk's first N (stage:
    # Megatron-Core), choices.RECOMPUTE_SCOPES
    recompute_scope: str = "model"
    # what a selective recomputation (recompute="selective") makes again: the attention
    # core (paracube train's), or Megatron-Core's other --recompute-modules the planner
    # counts (choices.RECOMPUTE_MODULES: a latent attention's up projections, a dense
    # block's MLP, the experts' activation, the norms); ignored under the other
    # recomputations
    recompute_modules: tuple[str, ...] = ("core_attn",)
    sequence_parallel: bool = False
    attention: str = "fused"  # "unfused": s×s scores materialized (Megatron before FlashAttention)
    # gradients all-reduced bucket by bucket during the last backward (paracube, PyTorch DDP,
    # Megatron-Core --overlap-grad-reduce) or only after it (Megatron-LM 2021, DeepSpeed's pipeline engine)
    overlap_grad_reduce: bool = True
    # dtype gradients are accumulated and reduced in under bf16/fp16 (the engine's
    # --grad-reduce): fp32 (its default, Megatron's for bf16) or the compute dtype
    grad_reduce: str = "fp32"
    # ZeRO-3: each unit's parameters all-gathered for backward before the backward of the
    # unit after it (paracube, FSDP2, FSDP1's BACKWARD_PRE), hidden behind that compute; or
    # only once that backward is done (FSDP1's BACKWARD_POST, Composer's default), so every
    # backward waits for its own gather
    backward_prefetch: bool = True
    # fp32 master weights and optimizer states in host memory, stepped by the CPU (ZeRO-Offload)
    offload: bool = False
    # gradient compression of the data-parallel reduction (--compress): none, fp16, bf16,
    # topk:RATIO, powersgd:RANK
    compress: str = "none"
    # how the engine cuts the pipeline stages (--balance): params (its default), flops or
    # memory; the measured ones (time, speed) are planned with their FLOPs estimate
    balance: str = "params"
    # the loss's backward: "torch" (paracube's — torch's cross-entropy, or its vocabulary-
    # parallel loss — two fp32 gradients of the logits' shape alive as backward begins,
    # shapes.loss_backward_transient_bytes) or "fused" (computed in place: Megatron's
    # vocabulary-parallel cross-entropy; llm-foundry's default fused_crossentropy)
    loss: str = "torch"
    # context parallelism (Megatron-Core's --context-parallel-size): each sequence's tokens
    # split over cp ranks, attention run as a ring passing keys and values (Liu et al. 2023,
    # "Ring Attention"; causal work balanced by cutting the sequence into 2·cp chunks, rank
    # i holding chunks i and 2cp−1−i). Planned, to evaluate published runs that use it:
    # ``paracube train`` does not run it (:meth:`to_args` refuses).
    cp: int = 1
    # what a block keeps for backward, in the memory model: "paracube" (the engine's own
    # blocks, op by op: shapes.block_saved_bytes), "megatron" (Megatron-Core with
    # Transformer Engine: memory.te_block_bytes — inputs sharded under sequence parallelism,
    # FP8 copies under fp8; published Megatron-Core runs are planned with it) or "compiled"
    # (the engine's blocks under torch.compile, whose partitioner recomputes the norms' and
    # the activation's element-wise intermediates in backward: torchtitan's and OLMo-core's
    # compiled blocks)
    activations: str = "paracube"
    # the blocks' element-wise ops in the time model (choices.ELEMENTWISE): fused kernels
    # moving what a block keeps for backward, or eager PyTorch ops, one kernel each, counted
    # op by op (torchtitan without torch.compile). Planned as fused by default, paracube's
    # own eager blocks too: on a GPU, torch's rms_norm runs one kernel (aten::_fused_rms_norm,
    # which this CPU build only decomposes) where the eager count has eight, and no GPU
    # measurement of paracube's blocks says what the rest costs
    elementwise: str = "fused"
    # tensor-parallel collectives overlapped with the matmuls they feed (Megatron-Core's
    # --tp-comm-overlap, NeMo's ub_tp_comm_overlap: Transformer Engine's userbuffers);
    # paracube's own tensor parallel waits for them (False)
    tp_comm_overlap: bool = False
    # a mixture's all-to-alls overlapped with another micro-batch's compute (Megatron-Core's
    # --overlap-moe-expert-parallel-comm: its combined 1F1B pairs micro-batch i + 1's forward
    # with micro-batch i's backward layer by layer, each one's dispatch and combine beside the
    # other's attention and experts — DeepSeek-V3's overlap, its technical report §3.2.1), hosted
    # without a pipeline or by the interleaved schedule; paracube plans its mixtures' all-to-
    # alls waited for (False). :func:`paracube.planner.mp_comm.overlapped_ep_comm`
    ep_comm_overlap: bool = False
    # how the token dispatcher sends tokens to the experts' ranks (choices.EP_DISPATCH): a row
    # per token and expert (alltoall: Megatron-Core's, paracube's default) or a token once per
    # rank (deepep: DeepEP, Megatron-Core's flex dispatcher) — with which experts a token's
    # router picks (choices.ROUTERS), the bytes each all-to-all sends a peer:
    # :func:`paracube.planner.mp_comm.dispatched_rows`
    ep_dispatch: str = "alltoall"
    router: str = "top-k"
    # where mixed precision's fp32 main weights live (choices.MASTER_WEIGHTS): in the
    # optimizer beside 16-bit parameters (paracube's, Megatron's) or as the parameters
    # themselves (PyTorch FSDP), which under ZeRO-3 keeps no 16-bit shard at rest
    master_weights: str = "optimizer"
    # the dtype of Adam's two moments (choices.MOMENTS): fp32, or bf16 as Megatron-Core's
    # precision-aware optimizer keeps them (DeepSeek-V3's recipe); planned only
    moments: str = "fp32"
    # under --precision fp8, how each tensor's scale is found (choices.FP8_SCALING): from the
    # amax history (delayed, Transformer Engine's DelayedScaling) or from the tensor itself
    # (current: Megatron-Bridge's FP8-CS, torchao's dynamic float8) — one more pass over it
    fp8_scaling: str = "delayed"
    # how the blocks are cut into pipeline stages (choices.PIPELINE_SPLIT): the engine's own
    # cut by ``balance`` (engine), Megatron's equal count of blocks per virtual stage (even,
    # even-ends: :func:`paracube.planner.stages.even_shares`), torchtitan's
    # (:func:`paracube.planner.stages.torchtitan_shares`) or an explicit layout in
    # Megatron-Core's grammar, e.g. "Et|(tt|)*30mL" (:mod:`paracube.planner.pipeline_layout`);
    # planned, to evaluate published runs: ``paracube train`` cuts by --balance
    # (:meth:`to_args` refuses the others)
    split: str = "engine"
    # how each micro-batch's weight gradients are accumulated (choices.GRAD_ACCUMULATION):
    # added into the flat buffer they are reduced from (buffer: paracube's engine), by the
    # GEMM itself (fused: Megatron-Core), cast to fp32 then added (bf16-optimizer:
    # DeepSpeed's BF16_Optimizer), or cast and pre-divided on a stream of its own beside the
    # compute (side-stream: PyTorch FSDP); :func:`paracube.planner.time_model.accumulation_time`
    grad_accumulation: str = "buffer"
    # ZeRO-3's gathered parameters used in place (flat: paracube, FSDP1, DeepSpeed) or copied
    # out into each parameter (per-parameter: FSDP2); choices.PARAM_GATHER,
    # :func:`paracube.planner.time_model.gather_copy_time`
    param_gather: str = "flat"
    # ZeRO-1/2's updated slices brought back by one all-gather (paracube, Megatron, DeepSpeed)
    # or by a broadcast from each rank of the ZeRO group (InternLM); choices.PARAM_SYNC,
    # :func:`paracube.planner.dp_comm.param_sync_time`
    param_sync: str = "all-gather"
    # ZeRO-1's gradient reduction before the sharded step: an all-reduce of the whole buffer
    # (paracube, InternLM) or a reduce-scatter into each rank's slice (Megatron-Core's
    # distributed optimizer); choices.GRAD_SYNC, :func:`paracube.planner.time_model.
    # reduction_time`
    grad_sync: str = "all-reduce"
    # the gradient buckets of a reduction overlapped with the backward: bucket_mb MiB (ddp:
    # paracube train's, PyTorch DDP's), Megatron-Core's max(40M, 1M × dp) elements or
    # InternLM's 512M; choices.GRAD_BUCKETS, :func:`paracube.planner.time_model.
    # bucket_elements`
    grad_bucket: str = "ddp"
    # under grad_bucket "ddp", a bucket's size in MiB of gradients: paracube train's
    # --bucket-mb (ParallelConfig owns its default), which Layout.from_config carries
    bucket_mb: float = ParallelConfig.bucket_mb
    # ZeRO-3 under a pipeline (pp > 1): refused (none: paracube's engine) or each stage's
    # parameters gathered once a step and kept, its gradients accumulated unsharded and
    # reduce-scattered after its last backward (per-step: torchtitan's FSDP2 under PyTorch's
    # pipelining); choices.ZERO3_PIPELINE, :attr:`zero3_per_step`
    zero3_pipeline: str = "none"
    # hybrid sharding: ZeRO within groups of ``shard`` consecutive data-parallel ranks, the
    # groups replicas of each other; 0: over the whole group. ZeRO-3 (HSDP: PyTorch FSDP's
    # HYBRID_SHARD, FSDP2 over a 2-D mesh, Composer's HYBRID_SHARD): the sharded gradients
    # are all-reduced across the replicas (Zhao et al. 2023, "PyTorch FSDP", §3.2.2). ZeRO-1
    # (InternLM's ``zero1=dict(size=8)``, "the world size of zero is a subset of dp world
    # size"): the optimizer states are sharded within the group while the gradients are
    # still all-reduced over every data-parallel rank, so only the parameter sync after the
    # step stays inside the group. Planned, to evaluate the stacks that run it: ``paracube
    # train`` does not (:meth:`to_args`)
    shard: int = 0
    # the AdamW step as one fused kernel (paracube, Megatron) or an op per pass over the
    # states (multi-op: torch.optim.AdamW's default, Composer's DecoupledAdamW) — on the GPU:
    # an offloaded step is the host's own loop; choices.OPTIMIZER_KERNELS,
    # :func:`paracube.planner.time_model.optimizer_time`
    optimizer_kernel: str = "fused"
    # clipping's rescale of the gradients: only when their norm is over the limit
    # (paracube, Megatron) or always (torch's and FSDP1's clip_grad_norm_); choices.CLIP_SCALING
    clip_scale: str = "when-clipped"
    # cross-entropy metrics the trainer computes over every micro-batch's logits beside the
    # loss (Composer's training metrics: llm-foundry's MPT logs LanguageCrossEntropy and
    # LanguagePerplexity, each a full torch cross-entropy); paracube train logs the loss
    # only (0); :func:`paracube.planner.time_model.logit_metric_bytes`
    logit_metrics: int = 0
    # a fully recomputed block replayed until backward has what it needs (early-stop: torch's
    # non-reentrant checkpoint since PyTorch 2.1, paracube train's; the block's last matmul
    # is not redone) or whole (Megatron, DeepSpeed, reentrant or older torch checkpoints);
    # choices.RECOMPUTE_REPLAY, :func:`paracube.planner.time_model.recompute_time`
    recompute_replay: str = "early-stop"
    # expert parallelism for a mixture of experts (Megatron-Core's
    # --expert-model-parallel-size, as its 2024 releases formed it: out of the data-parallel
    # ranks): each block's E experts spread over ep of the dp ranks, E/ep on each, every token
    # sent to the ranks of its experts and back by all-to-alls; the attention, the router and
    # the rest stay data parallel over dp. An expert's gradients are reduced, and ZeRO
    # shards its states, over the dp × cp ÷ ep ranks that hold it (:attr:`expert_grad_group`).
    # Planned, to evaluate published mixture-of-experts runs: paracube train builds dense
    # models only (:meth:`to_args` refuses).
    ep: int = 1
    # the experts' tensor-parallel size under Megatron-Core's parallel folding
    # (--expert-tensor-parallel-size; Liu et al. 2025, "MoE Parallel Folding"): 0, unfolded
    # (the 2024 formation above: each expert split over the tp ranks, ep within dp); 1 or tp,
    # folded — the MoE layer's ranks regrouped as etp × ep × edp over the stage's
    # tp × cp × dp, expert-parallel ranks consecutive, at etp 1 each expert whole on its rank
    # and the tokens dispatched straight from each rank's sequence shard. Planned only.
    etp: int = 0

    def __post_init__(self) -> None:
        self._check_fields(_FIELD_NAMES)

    def _check_fields(self, names: Collection[str]) -> None:
        """Each of the fields ``names`` checked alone, then every combination (a twin made by
        :meth:`replace` checks only the fields it changed: the others were checked already)."""
        # the planned-only choices, which no engine config checks first: a misspelt one
        # would otherwise fall back to the default count silently
        if "cp" in names and self.cp < 1:
            raise ConfigError(f"cp={self.cp}: context parallelism must be a positive integer")
        # type(x) is int: an int and not a bool, in one call (a search makes many layouts)
        if "ep" in names and not (type(self.ep) is int and self.ep >= 1):
            raise ConfigError(f"ep={self.ep!r}: expert parallelism must be a positive integer")
        if "etp" in names and not (type(self.etp) is int and self.etp >= 0):
            raise ConfigError(
                f"etp={self.etp!r}: the experts' tensor-parallel size (0: unfolded, split as tp)"
            )
        if "recompute_modules" in names and isinstance(self.recompute_modules, list):
            # a layout read back from JSON: its list as the tuple a layout holds (hashable)
            self.__dict__["recompute_modules"] = tuple(self.recompute_modules)
        if (
            "recompute_modules" in names
            and self.recompute_modules != _CORE_ATTN
            and (
                not isinstance(self.recompute_modules, tuple)
                or not self.recompute_modules
                or len(set(self.recompute_modules)) != len(self.recompute_modules)
                or not set(self.recompute_modules) <= set(RECOMPUTE_MODULES)
            )
        ):
            raise ConfigError(
                f"recompute_modules={self.recompute_modules!r}: a tuple of distinct modules "
                f"among {', '.join(RECOMPUTE_MODULES)}"
            )
        if "split" in names and is_layout(self.split):  # Megatron's grammar: checked whole
            stages_of(self.split)
        values = _choice_values(self) if names is _FIELD_NAMES else None
        if values is not None and _hashable(values):  # a new layout: each set checked once
            if values not in _CHECKED_CHOICES:
                for name, value in zip(_CHOICE_NAMES, values):
                    if value not in _CHOICES[name]:
                        raise ConfigError(
                            f"{name}={value!r}: choose {choices_text(_CHOICES[name])}"
                        )
                if len(_CHECKED_CHOICES) > 1 << 12:
                    _CHECKED_CHOICES.clear()
                _CHECKED_CHOICES.add(values)
        else:  # a twin, the choices it changed; or a value of the wrong type, named below
            for name in names:
                allowed = _CHOICES.get(name)
                if allowed is not None and (value := getattr(self, name)) not in allowed:
                    raise ConfigError(f"{name}={value!r}: choose {choices_text(allowed)}")
        if "logit_metrics" in names and not (
            type(self.logit_metrics) is int and self.logit_metrics >= 0
        ):
            raise ConfigError(
                f"logit_metrics={self.logit_metrics!r}: a count of cross-entropy metrics (0: none)"
            )
        if "shard" in names and not (type(self.shard) is int and self.shard >= 0):
            raise ConfigError(f"shard={self.shard!r}: a shard group of ranks (0: all of them)")
        if "bucket_mb" in names and (
            isinstance(self.bucket_mb, bool)
            or not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0)
        ):
            raise ConfigError(f"bucket_mb={self.bucket_mb!r}: a bucket size in MiB, > 0")
        # the engine's counts too, for layouts made in the API rather than from a job
        for name in _COUNTS:
            if name in names:
                value = getattr(self, name)
                if not (type(value) is int and value >= 1):
                    raise ConfigError(f"{name}={value!r}: must be a positive integer")
        if any(name in names for name in _EXPERT_SHAPE):
            refusal = expert_refusal(self.ep, self.etp, self.tp, self.dp, self.cp)
            if refusal:
                raise ConfigError(refusal)
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Choices that each hold alone but not together."""
        if self.shard and self.zero not in (1, 3):
            raise ConfigError(
                f"shard={self.shard}: hybrid sharding shards ZeRO-1's optimizer states or "
                f"ZeRO-3's states (zero=1 or 3), not ZeRO-{self.zero}'s"
            )
        if self.grad_bucket != "ddp" and self.bucket_mb != ParallelConfig.bucket_mb:
            raise ConfigError(
                f"bucket_mb={self.bucket_mb:g} with grad_bucket={self.grad_bucket!r}: the size is "
                "that of ddp buckets (paracube train's --bucket-mb); the others have their own"
            )
        if self.zero3_per_step and self.shard:
            raise ConfigError(
                f"shard={self.shard} with zero=3 and pp={self.pp}: hybrid sharding under a "
                "pipeline is not planned; plan the stage sharded over the whole group"
            )
        if self.grad_sync == "reduce-scatter" and self.zero == 1 and self.shard:
            raise ConfigError(
                f"grad_sync='reduce-scatter' with shard={self.shard}: ZeRO-1 in groups all-reduces "
                "the gradients over every data-parallel rank (InternLM's zero1 size); plan "
                "the reduce-scatter over the whole group, without a shard group"
            )
        if self.activations == "compiled" and self.recompute == "selective":
            raise ConfigError(
                "activations='compiled' with recompute='selective': a compiled block is counted "
                "kept whole or fully recomputed (as paracube train --compile runs it); plan "
                "recompute none, full or op"
            )
        if self.elementwise == "eager" and self.activations == "compiled":
            raise ConfigError(
                "elementwise='eager' with activations='compiled': torch.compile fuses the "
                "blocks' element-wise ops; plan compiled blocks with elementwise='fused'"
            )
        if self.moments != "fp32" and (
            self.master_weights == "none" or self.optimizer_kernel != "fused"
        ):
            raise ConfigError(
                f"moments={self.moments!r} with master_weights={self.master_weights!r} and "
                f"optimizer_kernel={self.optimizer_kernel!r}: bf16 moments are planned as "
                "Megatron-Core's precision-aware optimizer keeps them, beside fp32 main weights "
                "in a fused step (master_weights optimizer or parameters, optimizer_kernel fused)"
            )
        if self.recompute == "op" and self.attention not in FUSED_ATTENTION:
            raise ConfigError(
                "recompute=op keeps the fused attention kernel's output (torchtitan's "
                f"policy); attention={self.attention!r} has none: plan it with fused attention"
            )

    def replace(self, **changes: object) -> Layout:
        """This layout with ``changes``, checked as a new one is — what
        :func:`dataclasses.replace` does, without its walk over the fields on every call (a
        search makes a few hundred thousand twins).

        >>> Layout(dp=8).replace(tp=2).gpus
        16
        """
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Layout has no field {', '.join(sorted(unknown))}")
        twin = object.__new__(type(self))
        # a layout holds its fields alone (frozen: set once, here), so its dict is the twin's
        twin.__dict__.update(self.__dict__, **changes)
        twin._check_fields(changes.keys())
        return twin

    def model_refusal(self, cfg: ModelConfig) -> str:
        """Why ``cfg`` cannot take this layout ("" if it can): expert parallelism needs a
        mixture of experts and divides its experts; local attention (a window or chunks) is
        not planned under context parallelism, the scores' soft cap outside
        FlashAttention-2's and -3's kernels; a mixture is not planned under
        torchtitan's op-level checkpointing, compressed gradients, unfused attention,
        InternLM's broadcasts or hybrid sharding (their models are of the dense block's
        matrices), nor under tensor parallelism without sequence parallelism, which
        Megatron-Core requires of it."""
        if self.ep > 1 and not cfg.moe:
            return (
                f"ep={self.ep}: expert parallelism needs a mixture of experts ({cfg.name} is dense)"
            )
        if self.etp and not cfg.moe:
            return f"etp={self.etp}: the experts' tensor parallelism needs a mixture of experts"
        for name in ("ep_dispatch", "router"):
            value = getattr(self, name)
            if value != _DEFAULTS[name] and not cfg.moe:
                return f"{name}={value}: the token dispatch needs a mixture of experts"
        if cfg.moe and cfg.experts % self.ep:
            return f"ep={self.ep} does not divide the {cfg.experts} experts"
        if cfg.moe and self.recompute == "op":
            return "recompute=op is not planned for a mixture of experts"
        if cfg.moe and self.compress != "none":
            return f"compress={self.compress} is not planned for a mixture of experts"
        if cfg.moe and self.attention not in FUSED_ATTENTION:
            return f"attention={self.attention} is not planned for a mixture of experts"
        if cfg.moe and self.tp > 1 and not self.sequence_parallel:
            return (
                f"tp={self.tp} without sequence parallelism: Megatron-Core runs a mixture of "
                "experts under tensor parallelism with it (add --sequence-parallel)"
            )
        if cfg.moe and self.param_sync == "broadcast":
            return "param_sync=broadcast (InternLM's) is not planned for a mixture of experts"
        if cfg.moe and self.shard:
            return f"shard={self.shard}: hybrid sharding is not planned for a mixture of experts"
        refusal = self.recompute_modules_refusal(cfg)
        if refusal:
            return refusal
        if is_layout(self.split):
            stages = stages_of(self.split)
            if len(stages) != self.pp * self.chunks:
                return (
                    f"split={self.split}: the layout names {len(stages)} stages and pp × chunks "
                    f"= {self.pp * self.chunks}"
                )
            refusal = layout_refusal(stages, cfg.n_layers, cfg.mtp_layers)
            if refusal:
                return f"split={self.split}: {refusal}"
        if cfg.mla:
            refusal = self._latent_attention_refusal()
            if refusal:
                return refusal
        if cfg.local_span and self.cp > 1:
            return (
                f"cp={self.cp} with {local_words(cfg)}: context parallelism over local "
                "attention is not planned (its ring passes every rank's keys round, which a "
                "window or chunk does not read); use cp 1"
            )
        if cfg.attention_softcap and self.attention not in ("fused", "fused-v3"):
            return (
                f"attention={self.attention} with attention_softcap={cfg.attention_softcap:g}: "
                "the scores' soft cap is planned inside FlashAttention-2's or -3's kernel (their "
                "softcap; attention=fused or fused-v3) alone"
            )
        if self.ep_comm_overlap and self.pp > 1 and self.schedule != "interleaved-1f1b":
            return (
                "ep_comm_overlap under a pipeline: Megatron-Core's combined 1F1B pairs "
                "micro-batches without one or under interleaved-1f1b only"
            )
        return ""

    def recompute_modules_refusal(self, cfg: ModelConfig) -> str:
        """Why ``cfg`` cannot take this layout's recompute modules ("" if it can): each needs
        its part in the model, and all but the attention core are counted as Megatron-Core
        keeps a block (``activations="megatron"``)."""
        modules = self.recompute_modules if self.recompute == "selective" else ()
        if "mla_up_proj" in modules and not cfg.mla:
            return "recompute module mla_up_proj: the model has no latent attention"
        if "mlp" in modules and cfg.moe and not cfg.dense_layers:
            return (
                "recompute module mlp: every block is a mixture of experts (Megatron-Core "
                "recomputes a dense block's MLP under mlp)"
            )
        for module in ("moe_act", "moe"):
            if module in modules and not cfg.moe:
                return f"recompute module {module}: the model has no experts"
        if "shared_experts" in modules and not cfg.shared_expert_ffn:
            return "recompute module shared_experts: the model has no shared experts"
        if set(modules) - {"core_attn"} and self.activations != "megatron":
            return (
                f"recompute modules {', '.join(modules)}: planned as Megatron-Core keeps its "
                "blocks (activations megatron, the megatron stacks)"
            )
        return ""

    def _latent_attention_refusal(self) -> str:
        """Why a latent attention cannot take this layout ("" if it can): it is planned as
        Megatron-Core runs it — fused attention, sequence parallelism under tensor
        parallelism (its down projections take each rank's sequence shard) — and not under
        torchtitan's op-level checkpointing or eager element-wise kernels."""
        if self.tp > 1 and not self.sequence_parallel:
            return (
                f"tp={self.tp} without sequence parallelism: a latent attention is planned as "
                "Megatron-Core runs it under tensor parallelism, with it (add --sequence-parallel)"
            )
        if self.attention not in FUSED_ATTENTION:
            return f"attention={self.attention} is not planned for a latent attention"
        if self.recompute == "op":
            return "recompute=op is not planned for a latent attention"
        if self.elementwise == "eager":
            return "elementwise=eager is not planned for a latent attention"
        return ""

    @property
    def zero3_per_step(self) -> bool:
        """ZeRO-3 under a pipeline, each stage's parameters gathered once a step and kept
        through its micro-batches, its gradients reduce-scattered once (``zero3_pipeline``
        "per-step"): the communication of ZeRO-1 with a reduce-scatter, and ZeRO-1's memory
        while the step runs. Otherwise ZeRO-3 under a pipeline re-gathers every micro-batch,
        as the time model charges any ZeRO-3 — what paracube's engine refuses to run
        (config.ZERO3_WITH_PIPELINE), so its search never proposes it."""
        return self.zero == 3 and self.pp > 1 and self.zero3_pipeline == "per-step"

    @property
    def gpus(self) -> int:
        """GPUs (ranks) the layout occupies: dp × cp × tp × pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def grad_group(self) -> int:
        """Ranks a gradient is reduced over and ZeRO shards the states over: dp × cp — the
        context-parallel ranks hold the same weights and see other tokens, so they join the
        reduction (Megatron-Core's data-parallel group "with context parallel")."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Ranks each expert is split over: tp unfolded (:attr:`etp` 0), else etp."""
        return self.etp or self.tp

    @property
    def folded(self) -> bool:
        """The experts laid out by Megatron-Core's parallel folding (:attr:`etp` given)."""
        return self.etp > 0

    @property
    def expert_grad_group(self) -> int:
        """Ranks holding the same experts, over which their gradients are reduced and ZeRO
        shards their states: the stage's tp × cp × dp ranks ÷ (ep × the experts' tp) — dp × cp
        ÷ ep unfolded (the whole gradient group without experts)."""
        return self.tp * self.grad_group // (self.ep * self.expert_tp)

    @property
    def shard_group(self) -> int:
        """Ranks ZeRO shards the states over: the whole gradient group, or under hybrid
        sharding its shard groups of ``shard`` ranks, which must divide it."""
        if not self.shard:
            return self.grad_group
        if self.grad_group % self.shard:
            raise ConfigError(
                f"shard={self.shard} does not divide the data-parallel group (dp × cp = "
                f"{self.grad_group}): choose a shard group that does"
            )
        return self.shard

    @property
    def replicas(self) -> int:
        """Shard groups holding the same states (1 without hybrid sharding)."""
        return self.grad_group // self.shard_group

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> Layout:
        """The layout a ``paracube train`` job runs (paracube: fused attention, overlapped
        gradient reduction)."""
        par = cfg.parallel
        return cls(
            dp=par.dp,
            tp=par.tp,
            pp=par.pp,
            micro_batch=cfg.micro_batch,
            microbatches=cfg.grad_accum,
            schedule=par.schedule,
            chunks=par.chunks,
            sequence_parallel=par.sequence_parallel,
            zero=cfg.zero,
            recompute=cfg.recompute,
            recompute_blocks=cfg.recompute_blocks,
            activations="compiled" if cfg.compile != "none" else "paracube",
            grad_reduce=cfg.grad_reduce,
            offload=cfg.offload == "optimizer",
            compress=cfg.compress,
            balance=par.balance,
            bucket_mb=par.bucket_mb,
        )

    def check_paracube_software(self) -> None:
        """Refuse the software facts paracube train does not run (:data:`OTHER_SOFTWARE`
        away from their defaults): they describe another stack, to time its runs."""
        others = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name in OTHER_SOFTWARE
            and getattr(self, f.name) != f.default
            and (f.name, getattr(self, f.name)) not in PARACUBE_SOFTWARE
        ]
        if others:
            raise ConfigError(
                f"{', '.join(others)}: another stack's software (planned to evaluate published "
                "runs), not what paracube train runs; plan without it for a command it runs"
            )

    def to_args(self, precision: str = "bf16", gpus_per_node: int | None = None) -> list[str]:
        """The ``paracube train`` flags that run this layout."""
        if precision not in PRECISIONS:
            raise ConfigError(
                f"precision {precision}: paracube train runs {', '.join(PRECISIONS)} "
                "(tf32 and fp8 are planned only)"
            )
        if self.cp > 1:
            raise ConfigError(
                f"cp={self.cp}: paracube train does not run context parallelism (it is planned "
                "to evaluate Megatron-Core runs); plan with cp=1 for a layout it runs"
            )
        if self.ep > 1 or self.etp:
            raise ConfigError(
                f"ep={self.ep}: paracube train builds dense models and runs no expert "
                "parallelism (it is planned to evaluate mixture-of-experts runs)"
            )
        if self.shard:
            raise ConfigError(
                f"shard={self.shard}: paracube train shards ZeRO over the whole "
                "data-parallel group (hybrid sharding is planned to evaluate the FSDP and "
                "InternLM stacks that run it); plan without it for a layout it runs"
            )
        if self.recompute in PLANNED_RECOMPUTE:
            raise ConfigError(
                f"recompute={self.recompute}: paracube train recomputes none, selective "
                "(the attention core) or full blocks (op-level checkpointing is planned to "
                "evaluate torchtitan's runs); plan with one of those for a layout it runs"
            )
        if self.split != "engine" and self.pp > 1:
            raise ConfigError(
                f"split={self.split}: paracube train cuts its stages by --balance (the split "
                "is planned to evaluate Megatron runs); plan with the engine split for a layout "
                "it runs"
            )
        self.check_paracube_software()
        compiled = self.activations == "compiled"
        refusal = compile_refusal("inductor" if compiled else "none", recompute=self.recompute)
        if refusal:
            raise ConfigError(
                f"activations=compiled with {refusal}: paracube train does not compile that "
                "layout; plan without --activations compiled for it"
            )
        args = [
            f"--dp {self.dp}",
            f"--tp {self.tp}",
            f"--pp {self.pp}",
            f"--micro-batch {self.micro_batch}",
            f"--microbatches {self.microbatches}",
        ]
        if gpus_per_node is not None:
            args.append(f"--gpus-per-node {gpus_per_node}")
        if self.pp > 1:
            args.append(
                f"--schedule {self.schedule}"
                + (f" --chunks {self.chunks}" if self.chunks > 1 else "")
                + (f" --balance {self.balance}" if self.balance != "params" else "")
            )
        if self.sequence_parallel:
            args.append("--sequence-parallel")
        if self.zero:
            args.append(f"--zero {self.zero}")
        if self.recompute != "none":
            args.append(f"--recompute {self.recompute}")
        if self.recompute != "none" and self.recompute_blocks is not None:
            args.append(f"--recompute-blocks {self.recompute_blocks}")
        if compiled:
            args.append("--compile inductor")
        if self.offload:
            args.append("--offload optimizer")
        if self.compress != "none":
            args.append(f"--compress {self.compress}")
        if self.bucket_mb != ParallelConfig.bucket_mb:
            args.append(f"--bucket-mb {self.bucket_mb:g}")
        if precision != "fp32":
            args.append(f"--precision {precision}")
            if self.grad_reduce != "fp32":
                args.append(f"--grad-reduce {self.grad_reduce}")
        return args


_FIELD_NAMES = frozenset(f.name for f in fields(Layout))
# a search makes a few hundred thousand layouts whose named choices repeat: each set of
# values is checked once (operator.attrgetter reads them all in one call)
_CHOICE_NAMES = tuple(name for name, _ in NAMED_CHOICES)
_choice_values = operator.attrgetter(*_CHOICE_NAMES)
_CHECKED_CHOICES: set[tuple] = set()
_CORE_ATTN = ("core_attn",)


def _hashable(values: tuple) -> bool:
    try:
        hash(values)
    except TypeError:  # a list where a name belongs: the field-by-field check names it
        return False
    return True


_CHOICES: dict[str, tuple | dict] = dict(NAMED_CHOICES)
_COUNTS = ("dp", "tp", "pp", "micro_batch", "microbatches", "chunks")
# the fields expert parallelism's ranks are formed from (expert_refusal)
_EXPERT_SHAPE = frozenset(("ep", "etp", "tp", "dp", "cp"))
_DEFAULTS = {f.name: f.default for f in fields(Layout)}


def rank_sequence(cfg: ModelConfig, layout: Layout) -> ModelConfig:
    """The model as one rank sees it: under context parallelism each rank holds s/cp tokens
    of every sequence, so its matmuls, element-wise work, tensor-parallel collectives,
    pipeline transfers and saved activations are those of an s/cp sequence — all but the
    attention core (``time_model.attention_core``) and the ring that feeds it
    (``time_model.cp_comm_time``). ``cfg`` itself when cp = 1."""
    if layout.cp == 1:
        return cfg
    if cfg.seq_len % (2 * layout.cp):
        raise ConfigError(
            f"cp={layout.cp}: context parallelism cuts each sequence into 2·cp equal chunks, "
            f"and {cfg.seq_len} tokens do not divide by {2 * layout.cp}; choose a cp that does"
        )
    return _with_sequence(cfg, cfg.seq_len // layout.cp)


@functools.lru_cache(maxsize=256)  # a search asks for the same few on every layout
def _with_sequence(cfg: ModelConfig, seq_len: int) -> ModelConfig:
    return cfg.replace(seq_len=seq_len)


def local_words(cfg: ModelConfig) -> str:
    """A model's local attention in words: its sliding window or its chunks."""
    if cfg.attention_window:
        return f"a sliding window of {cfg.attention_window:,} tokens"
    return f"chunks of {cfg.attention_chunk:,} tokens"
