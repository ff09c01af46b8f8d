"""Step time of a layout, from first principles (pure math).

Every term is derived from the model's shapes and the hardware figures; nothing is
fitted to a published result:

- **compute**: each GEMM of a layer (per GPU: its tensor-parallel shard) takes the roofline
  time max(2·M·N·K / sustained peak, bytes moved / HBM rate), the sustained peak being
  the rate measured at the power limit where one is published (Hopper), else the datasheet
  peak scaled from the boost to the base clock (all a GPU guarantees at full power draw);
  fused attention in 16 bits at FlashAttention-2's published rate (``GPU.attention_rate``; in
  fp32 or TF32 at those units' matmul rate, :func:`at_precision`; FlashAttention
  in Triton and FlashAttention 1 at the FlashAttention-2 paper's comparison,
  :data:`FUSED_SLOWDOWN`), each head at the size its kernel is compiled for
  (:func:`kernel_head_dim`); the
  element-wise work (norms, activation function, rotary, residuals) moves what the layer
  keeps for backward twice through HBM (read + write: the model's own count, or
  Korthikanti's per-layer bytes for Megatron's unfused layer) — eager blocks, one PyTorch
  kernel per op, every op's reads and writes (``Layout.elementwise``,
  :func:`paracube.models.shapes.eager_elementwise_bytes`); every memory-bound byte
  at the HBM rate a streaming kernel was measured to reach (``GPU.memory_rate``), the
  loss's softmax and any metric the trainer computes over the logits among them
  (:func:`logit_metric_bytes`). Backward is twice the forward. The resulting FLOP rate,
  divided by peak, is the *achievable fraction* the planner states. Recompute adds the
  recomputed forward (full; less each block's last matmul where the checkpoint stops early:
  :func:`replay_saving`), the
  attention core (selective), or the matmuls and element-wise work torchtitan's op-level
  policy does not keep (op: :func:`op_recompute_time`).
- **tensor parallel**: per layer and micro-batch, four all-reduces (or all-gather +
  reduce-scatter pairs) of b·s·h 16-bit values in a ring over t ranks on the intra-node
  link: 2(t−1)/t·n/B + 2(t−1)·α each (docs/formulas.md); not overlapped. A pair costs
  the all-reduce on NCCL; on a calibrated gloo link, the measured pair ÷ all-reduce ratio.
  :mod:`paracube.planner.mp_comm` owns these, a mixture's all-to-alls and the pipeline's
  sends.
- **pipeline**: every rank holds the blocks of the engine's own split
  (:mod:`paracube.planner.stages`), the busiest one sets the pace; the bubble adds the
  schedule's idle ÷ busy time at unit costs (the schedule registry): (p−1)/m of the
  stage's work for GPipe and 1F1B, (p−1)/(v·m) interleaved, (p−1)/(3m) for ZB-H1 (its
  (p−1)(F+I−W) idle at F = I = W);
  each micro-batch crosses a stage boundary twice (activation, gradient) on the link
  between stages.
- **data parallel**: what the gradient reduction — and ZeRO's gathers and scatters, hybrid
  sharding's all-reduce across replicas — leaves exposed beside the backward, never less
  than its last bucket, each hidden second slowing the compute it runs beside
  (:mod:`paracube.planner.dp_comm`, on the collectives of
  :mod:`paracube.planner.collectives`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from paracube.choices import ELEMENT_BYTES, FUSED_ATTENTION, HOPPER_ATTENTION, gradient_bytes
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.pipeline.schedules import get_schedule
from paracube.planner.collectives import OVERLAP_SLOWDOWN
from paracube.planner.dp_comm import dp_exposed_time
from paracube.planner.flops import hardware_flops_per_token, model_flops_per_token
from paracube.planner.hardware import GPU, Interconnect
from paracube.planner.layout import Layout, rank_sequence
from paracube.planner.memory import activation_bytes_per_layer
from paracube.planner.mp_comm import (
    blocks_tp_comm,
    ends_tp_comm,
    ep_comm_time,
    overlapped_ep_comm,
    pp_transfer_time,
)
from paracube.planner.stages import (
    RankShare,
    layout_shares,
    recomputed_blocks,
    recomputed_indices,
)


@dataclass(frozen=True)
class Cluster:
    """The machines a layout runs on: one GPU type, ``gpus_per_node`` of them joined by
    ``intra`` (NVLink), nodes joined by ``inter`` (InfiniBand), per GPU.

    >>> from paracube.planner import hardware as hw
    >>> Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr")).gpu.name
    'H100 SXM'
    """

    gpu: GPU
    gpus_per_node: int
    intra: Interconnect
    inter: Interconnect

    def __post_init__(self) -> None:
        # a node's one NIC (Ethernet) is shared by its GPUs: each gets its share
        for name in ("intra", "inter"):
            link = getattr(self, name)
            if link.shared_by_node:
                share = replace(
                    link,
                    name=f"{link.name} ÷ {self.gpus_per_node} GPUs",
                    bandwidth=link.bandwidth / self.gpus_per_node,
                    shared_by_node=False,
                )
                object.__setattr__(self, name, share)


@dataclass(frozen=True)
class StepEstimate:
    """One predicted step, in seconds by part (their sum is :attr:`step_time`), and rates."""

    compute: float
    recompute: float
    tp_comm: float
    pp_comm: float
    bubble: float
    dp_exposed: float
    optimizer: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs (no recomputation) per second per GPU: MFU × peak
    mfu: float  # model FLOPs per second per GPU over the peak of the precision's units
    hardware_tflops_per_gpu: float = 0.0  # FLOPs executed, recomputation included: HFU × peak
    cp_comm: float = 0.0  # the context-parallel ring's keys and values, where not hidden
    ep_comm: float = 0.0  # a mixture's all-to-alls, tokens to their experts and back

    @property
    def mfu_ceiling(self) -> float:
        """The MFU this step would reach if its compute were all it did — no communication,
        bubble, recomputation or optimizer: the compute model's ceiling on MFU, counted in
        MFU's own FLOPs (attention's s×s in full, as the papers' MFU does, although causal
        fused attention executes half of them). ``mfu ≤ mfu_ceiling`` by construction."""
        return self.mfu * self.step_time / self.compute if self.compute else 0.0

    @property
    def step_time(self) -> float:
        """Seconds per optimizer step: the sum of the parts."""
        return (
            self.compute
            + self.recompute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.bubble
            + self.dp_exposed
            + self.optimizer
        )


TILE = (128, 256)  # the largest CTA output tile of cuBLAS/CUTLASS bf16 kernels on Ampere and Hopper


@functools.cache  # the searches ask for the same GEMM shapes many times
def wave_efficiency(m: float, n: float, sms: int) -> float:
    """Fraction of the tensor cores an (m×n)-output GEMM keeps busy (NVIDIA, "Matrix
    Multiplication Background User's Guide": tile and wave quantization). The output is cut
    into 128×256 tiles (either orientation, whichever wastes less), one per SM at a time, so
    ⌈m/128⌉·⌈n/256⌉ tiles run in ⌈tiles/SMs⌉ waves and the last wave's idle SMs and the
    tiles' overhang are lost. 1 when the GPU has no SM count (a calibrated CPU)."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in (TILE, TILE[::-1]):
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        best = max(best, m * n / (math.ceil(tiles / sms) * sms * tm * tn))
    return best


def _gemm(m: float, n: float, k: float, g: GPU, elem: int = 2) -> float:  # elem: bytes per value
    """Roofline time of an (m×k)·(k×n) matmul: the sustained (base-clock) tensor-core rate
    derated by tile and wave quantization, or HBM traffic, whichever is slower."""
    rate = g.peak_flops * g.sustained_fraction * wave_efficiency(m, n, g.sms)
    return max(2 * m * n * k / rate, elem * (m * k + k * n + m * n) / g.memory_rate)


def _linear_units(g: GPU, elem: int, fp8: bool) -> tuple[GPU, int]:
    """The units a block's linear layers run on and their operands' bytes: under FP8
    Transformer Engine's (and torchao's) matmuls on the FP8 units with 1-byte operands, else
    the precision's own (``elem`` bytes)."""
    return (g.fp8_units, 1) if fp8 else (g, elem)


def _gemm_fwd_bwd(m: float, n: float, k: float, g: GPU, elem: int = 2) -> tuple[float, float]:
    """A linear layer's forward (m×k)·(k×n), and its backward: the input gradient (m×n)·(n×k)
    and the weight gradient (k×m)·(m×n) — same FLOPs, other output shapes, so other waves."""
    return _gemm(m, n, k, g, elem), _gemm(m, k, n, g, elem) + _gemm(k, n, m, g, elem)


# How much slower than FlashAttention-2 a fused kernel runs its (forward, backward): 1 for
# FlashAttention-2 itself (PyTorch's SDPA); FlashAttention in Triton (Dao's
# flash_attn_triton, MPT's ``attn_impl: triton``) — "FlashAttention-2 is around 1.3-1.5×
# faster than FlashAttention in Triton in the forward pass and around 2× faster in the
# backward pass" (Dao 2023, FlashAttention-2, §4.1): the middle of the forward's range;
# FlashAttention's own CUDA kernels (flash-attn before 2.0, 2022–mid 2023) — "reaching only
# 25-40% of the theoretical maximum FLOPs/s", which FlashAttention-2's partitioning speeds
# up "around 2×" (ibid., abstract): the bottom of each range, as FLASH2_AMPERE takes
# FlashAttention-2's, 25 % against 50 % in both passes. FlashAttention-3, Hopper's own
# kernels (warp-specialised, asynchronous TMA loads and wgmma: flash-attn's hopper/) —
# "speedup on H100 GPUs by 1.5-2.0×" over FlashAttention-2 (Shah et al. 2024, FlashAttention-
# 3, abstract): the bottom of that range, for both passes.
# One entry per kernel of choices.FUSED_ATTENTION, which owns the names.
FUSED_SLOWDOWN = {
    "fused": (1.0, 1.0),
    "fused-v1": (2.0, 2.0),
    "fused-triton": (1.4, 2.0),
    "fused-v3": (1 / 1.5, 1 / 1.5),
}
assert FUSED_SLOWDOWN.keys() == set(FUSED_ATTENTION), "a fused kernel without its timing"
# The head sizes each fused kernel is compiled for: a head runs on the smallest that holds
# it, its two matmuls over the padding too (the missing columns loaded as zeros), so a head
# of 96 on a kernel of 128 does 128/96 of its work. FlashAttention-2, and PyTorch SDPA's copy
# of it: csrc/flash_attn/src/static_switch.h, HEADDIM_SWITCH. FlashAttention 1:
# csrc/flash_attn/fmha_api.cpp, run_fmha_fwd and run_fmha_bwd (d ≤ 32, 64, 128). Triton's:
# flash_attn_triton.py (and llm-foundry's copy), BLOCK_HEADDIM = max(next power of 2, 16),
# d ≤ 128. FlashAttention-3: hopper/generate_kernels.py's sm90 instantiations
# (flash_fwd_hdim{64,96,128,192,256}_*_sm90.cu). A head wider than a kernel's largest size
# is timed at its own width.
KERNEL_HEAD_DIMS = {
    "fused": (32, 64, 96, 128, 160, 192, 224, 256),
    "fused-v1": (32, 64, 128),
    "fused-triton": (16, 32, 64, 128),
    "fused-v3": (64, 96, 128, 192, 256),
}
assert KERNEL_HEAD_DIMS.keys() == set(FUSED_ATTENTION), "a fused kernel without its head sizes"


def kernel_head_dim(attention: str, head_dim: int) -> int:
    """The head dimension the fused ``attention`` kernel computes a ``head_dim`` head at
    (:data:`KERNEL_HEAD_DIMS`).

    >>> kernel_head_dim("fused", 96), kernel_head_dim("fused-v1", 96), kernel_head_dim("fused", 112)
    (96, 128, 128)
    """
    return next((size for size in KERNEL_HEAD_DIMS[attention] if size >= head_dim), head_dim)


def attention_core(cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2) -> tuple[float, float]:
    """(seconds, FLOPs) of the attention core's forward — softmax(QKᵀ)·V — on one GPU for
    one micro-batch: what selective recomputation re-runs. Its backward takes twice as long
    (four matmuls for two; FlashAttention's five include recomputing QKᵀ: 2.5×, and a
    slower kernel's backward more: :func:`attention_core_backward`). ``cfg`` is the rank's
    view (:func:`rank_sequence`): under context parallelism its s/cp queries attend to all
    s keys — cp × its own s/cp square, the whole s × s over cp ranks."""
    b, s, heads = layout.micro_batch, cfg.seq_len, cfg.n_heads / layout.tp
    # QKᵀ and attention·V over the full s×s (its 1/cp share under context parallelism): 4·d
    # a head and pair of positions, a latent attention's 2·(d + d_r) + 2·d_v
    flops = 2 * b * heads * s * s * (cfg.qk_head_dim + cfg.v_dim) * layout.cp
    rate = g.peak_flops * g.sustained_fraction
    if layout.attention in FUSED_ATTENTION:
        # FlashAttention skips the blocks above the causal diagonal: half the work is done,
        # and the scores never leave on-chip memory; its matmuls run over the kernel's head
        # size, the padding included (kernel_head_dim).
        padded = kernel_head_dim(layout.attention, cfg.qk_head_dim) / cfg.qk_head_dim
        forward = FUSED_SLOWDOWN[layout.attention][0] * padded
        done = flops / 2
        if cfg.local_span:  # a window or chunks: the key tiles the mask reaches (cp 1)
            keys = shapes.local_kernel_keys(s, cfg.attention_window, cfg.attention_chunk)
            done = flops * keys / s
        return forward * done / (g.attention_rate or rate), done
    # Unfused (Megatron before FlashAttention): two batched matmuls that write and read the
    # s×s scores, then scale-mask-softmax and dropout passes over them — Korthikanti's
    # 5·a·s/h bytes per s·b·h (16-bit scores and probabilities, 1-byte mask), read and written.
    matmuls = max(flops / rate, 2 * 2 * b * heads * s * s / g.memory_rate)
    passes = 2 * 5 * b * heads * s * s * (elem / 2) / g.memory_rate
    return matmuls + passes, flops


def attention_core_backward(layout: Layout, forward: float, g: GPU | None = None) -> float:
    """Seconds of the attention core's backward, from its forward's: two matmuls per forward
    one (unfused); FlashAttention's 2.5× the forward's work at its backward's own rate —
    the GPU's measured backward rate where it has one (``GPU.attention_backward_rate``)."""
    if layout.attention not in FUSED_ATTENTION:
        return 2.0 * forward
    slow_forward, slow_backward = FUSED_SLOWDOWN[layout.attention]
    rates = 1.0
    if g is not None and g.attention_backward_rate and g.attention_rate:
        rates = g.attention_rate / g.attention_backward_rate
    return 2.5 * forward * rates * slow_backward / slow_forward


def cp_comm_time(
    cfg: ModelConfig, layout: Layout, cluster: Cluster, elem: int, core_fwd: float
) -> tuple[float, float]:
    """(forward, backward) seconds one block's context-parallel ring adds to one
    micro-batch (``cfg``: the rank's view, :func:`rank_sequence`). Forward: cp − 1 steps,
    each passing this rank's
    keys and values (b · s/cp · kv_heads/tp · (d_qk + d_v) values: 2·d a head, a latent
    attention's d + d_r keys and d_v values) to the next rank while
    the attention core runs on the block it holds — 1/cp of the core's ``core_fwd``
    (Megatron-Core / Transformer Engine's ring attention overlaps the two); backward: the
    keys and values once more and their gradients, twice the bytes, beside the backward's
    core. A step costs max(transfer, compute); what hides slows that compute by
    :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN`. The cp ranks sit next to the
    tensor-parallel ones (Megatron's tp-cp-dp-pp order): on NVLink while tp × cp fits a
    node."""
    if layout.cp == 1:
        return 0.0, 0.0
    cp, b = layout.cp, layout.micro_batch
    link = cluster.intra if layout.tp * layout.cp <= cluster.gpus_per_node else cluster.inter
    kv = b * cfg.seq_len * cfg.n_kv_heads / layout.tp * (cfg.qk_head_dim + cfg.v_dim) * elem
    core_bwd = attention_core_backward(layout, core_fwd, cluster.gpu)

    def ring(volume: float, core: float) -> float:
        transfer, compute = volume / link.bandwidth + link.latency, core / cp
        return (cp - 1) * (max(0.0, transfer - compute) + OVERLAP_SLOWDOWN * min(transfer, compute))

    return ring(kv, core_fwd), ring(2 * kv, core_bwd)


def layer_time(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2, fp8: bool = False
) -> tuple[float, float, float]:
    """(forward seconds, backward seconds, forward FLOPs executed) of one transformer layer
    on one GPU for one micro-batch (``cfg``: the rank's view, :func:`rank_sequence`).
    ``fp8``: the linear layers run as Transformer Engine runs them under FP8
    (:func:`fp8_cast_bytes`); the attention core and everything else stay 16-bit."""
    b, s, t = layout.micro_batch, cfg.seq_len, layout.tp
    M = b * s
    gemms = shapes.block_gemms(cfg, M, t, layout.ep, layout.expert_tp)
    fwd, bwd = block_gemm_time(cfg, layout, g, elem, fp8)
    if fp8:
        cast_fwd, cast_bwd = fp8_cast_bytes(gemms, current=layout.fp8_scaling == "current")
        fwd, bwd = fwd + cast_fwd / g.memory_rate, bwd + cast_bwd / g.memory_rate
    flops = sum(2 * m * n * k for m, n, k in gemms)
    core_time, core_flops = attention_core(cfg, layout, g, elem)
    # element-wise work outside the matmuls (norms, the activation function, rotary
    # positions, residuals): elementwise_times
    elementwise, elementwise_bwd = elementwise_times(cfg, layout, g, elem)
    core_bwd = attention_core_backward(layout, core_time, g)
    if (
        all(g.activation_rates) and cfg.activation != "swiglu"
    ):  # a compute-bound GELU (calibrated CPU)
        elements = M * (cfg.ffn_hidden * shapes.mlp_passes(cfg) + cfg.shared_expert_ffn) / t
        fwd, bwd = fwd + elements / g.activation_rates[0], bwd + elements / g.activation_rates[1]
    return fwd + core_time + elementwise, bwd + core_bwd + elementwise_bwd, flops + core_flops


def elementwise_times(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2
) -> tuple[float, float]:
    """(forward, backward) seconds of one block's element-wise work for one micro-batch.
    Fused (``layout.elementwise``): the forward reads and writes what the block keeps for
    backward (:func:`elementwise_forward`); backward reads it and the incoming gradient and
    writes one — twice that. Eager: every op's reads and writes, op by op
    (:func:`paracube.models.shapes.eager_elementwise_bytes`)."""
    if layout.elementwise == "eager":
        forward, backward = shapes.eager_elementwise_bytes(
            cfg,
            layout.micro_batch * cfg.seq_len,
            elem=elem,
            tp=layout.tp,
            sequence_parallel=layout.sequence_parallel,
        )
        return forward / g.memory_rate, backward / g.memory_rate
    forward_time = elementwise_forward(cfg, layout, g, elem)
    return forward_time, 2 * forward_time


def elementwise_forward(cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2) -> float:
    """Seconds of a fused block's element-wise forward for one micro-batch: what the block
    keeps for backward, read and written. What it keeps: the model's own blocks op by op
    (models/shapes.py — RMSNorm's fp32 copies, SwiGLU's gate and product, rotated q and k),
    or Megatron's 2021 layer (Korthikanti's 34·s·b·h, /t under sequence parallelism) when
    attention is unfused."""
    b, s, h, t = layout.micro_batch, cfg.seq_len, cfg.hidden, layout.tp
    acts: float
    if layout.attention in FUSED_ATTENTION:
        acts = shapes.block_saved_bytes(
            cfg,
            b,
            elem=elem,
            tp=t,
            sequence_parallel=layout.sequence_parallel,
            etp=layout.expert_tp,
        )
    else:
        acts = activation_bytes_per_layer(  # the s×s passes are the core's (attention_core)
            s, b, h, cfg.n_heads, t=t, sequence_parallel=layout.sequence_parallel, attention="fused"
        ) * (elem / 2)
    return 2 * acts / g.memory_rate


def recompute_time(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int, fp8: bool, forward: float
) -> float:
    """Seconds one recomputed block re-runs per micro-batch in backward: its ``forward``
    (full) — all of it when the checkpoint replays the whole function
    (``recompute_replay="whole"``), all but the last matmul under torch's non-reentrant
    checkpoint, which stops once every tensor backward needs is back (``"early-stop"``):
    the MLP's down projection saves its input, which the activation before it recomputed,
    and its output only enters the residual sum (:func:`replay_saving`) —, the attention
    core (selective: under fused attention only the kernel's log-sum-exp is dropped, so
    the planner seldom gains from it), the linears of Megatron-Core's other recompute
    modules (selective: :func:`paracube.models.shapes.selectively_redone_linears`) and the
    element-wise ones' reads and writes (:func:`elementwise_redo_time`), or what
    torchtitan's op-level policy does not keep (op: :func:`op_recompute_time`)."""
    if layout.recompute == "full":
        return forward - replay_saving(cfg, layout, g, elem, fp8)
    if layout.recompute == "selective":
        linear, linear_elem = _linear_units(g, elem, fp8)
        tokens = layout.micro_batch * cfg.seq_len
        core = (
            attention_core(cfg, layout, g, elem)[0]
            if "core_attn" in layout.recompute_modules
            else 0.0
        )
        moe = (
            shapes.moe_layer_gemms(cfg, tokens, layout.tp, layout.ep, layout.expert_tp)
            if "moe" in layout.recompute_modules
            else []
        )
        return (
            core
            + sum(
                _gemm(*shapes.rank_gemm(lin, tokens, layout.tp), linear, linear_elem)
                for lin in shapes.selectively_redone_linears(cfg, layout.recompute_modules)
            )
            + sum(_gemm(m, n, k, linear, linear_elem) for m, n, k in moe)
            + elementwise_redo_time(cfg, layout, g, elem)
        )
    if layout.recompute == "op":
        return op_recompute_time(cfg, layout, g, elem, fp8)
    return 0.0


def elementwise_redo_time(cfg: ModelConfig, layout: Layout, g: GPU, elem: int) -> float:
    """Seconds per block and micro-batch of the element-wise recompute modules, memory-bound:
    the two norms (layernorm: each reads its input and writes its output, h values a token
    of the rank's sequence shard) and the experts' activation (moe_act: SwiGLU reads the
    gate and the up projection and writes one, GELU reads one and writes one, f values
    each, for the k·n/t rows a rank's experts hold)."""
    modules = layout.recompute_modules
    n = layout.micro_batch * cfg.seq_len
    moved = 0.0
    if "layernorm" in modules:
        moved += 2 * 2 * n * cfg.hidden / (layout.tp if layout.sequence_parallel else 1)
    if "moe_act" in modules and cfg.moe:
        passes = 3 if cfg.activation == "swiglu" else 2  # gate and up read, one written
        moved += passes * cfg.experts_per_token * n * cfg.ffn_hidden / layout.tp
    return moved * elem / g.memory_rate


def replay_saving(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2, fp8: bool = False
) -> float:
    """Seconds of one block's forward that an early-stopping checkpoint does not replay per
    micro-batch: its last matmul, the MLP's down projection (on the FP8 units under
    ``fp8``; its cast was made in the forward and is not redone either, nor counted). 0 when
    the whole forward is replayed. tests/test_planner_recompute_replay.py watches paracube's
    own blocks replay on this machine's torch: every matmul but that one."""
    if layout.recompute_replay == "whole":
        return 0.0
    linear, linear_elem = _linear_units(g, elem, fp8)
    tokens = layout.micro_batch * cfg.seq_len
    return sum(
        _gemm(m, n, k, linear, linear_elem)
        for m, n, k in shapes.down_gemms(cfg, tokens, layout.tp, layout.ep, layout.expert_tp)
    )


def op_recompute_time(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2, fp8: bool = False
) -> float:
    """Seconds torchtitan's op-level selective checkpointing re-runs per block and
    micro-batch (``recompute="op"``): the forward of the matmuls whose outputs it does not
    keep (:func:`paracube.models.shapes.op_checkpoint_linears`: k, the output projection,
    SwiGLU's up or a GELU MLP's second) and the block's element-wise forward (norms, rotary,
    the activation, the residual adds); not the attention kernel, whose output it keeps.
    Under ``fp8`` the matmuls at the FP8 rate, their casts not charged again."""
    linear, linear_elem = _linear_units(g, elem, fp8)
    tokens, t = layout.micro_batch * cfg.seq_len, layout.tp
    matmuls = sum(
        _gemm(tokens, lin.out_features / t, lin.in_features, linear, linear_elem)
        if lin.split == "column"
        else _gemm(tokens, lin.out_features, lin.in_features / t, linear, linear_elem)
        for lin, _, redone in shapes.op_checkpoint_linears(cfg)
        if redone
    )
    return matmuls + elementwise_times(cfg, layout, g, elem)[0]


def block_gemm_time(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2, fp8: bool = False
) -> tuple[float, float]:
    """(forward, backward) seconds of one block's matmuls for one micro-batch — on the FP8
    units with 1-byte operands under ``fp8`` — the bulk of :func:`layer_time`, and what
    overlapped tensor-parallel collectives can hide behind (:func:`paracube.planner.mp_comm.overlapped_tp_comm`)."""
    tokens = layout.micro_batch * cfg.seq_len
    return _block_gemms_timed(cfg, tokens, layout.tp, layout.ep, layout.expert_tp, g, elem, fp8)[:2]


def block_weight_grad_time(
    cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2, fp8: bool = False
) -> float:
    """Seconds of one block's weight-gradient matmuls for one micro-batch — each linear
    layer's (k×m)·(m×n), the part of :func:`block_gemm_time`'s backward that a zero-bubble
    schedule defers as its W pass (Qi et al. 2024, §2: "W ... only needs to be performed
    before the optimizer step")."""
    tokens = layout.micro_batch * cfg.seq_len
    return _block_gemms_timed(cfg, tokens, layout.tp, layout.ep, layout.expert_tp, g, elem, fp8)[2]


# a search times the same block shapes for thousands of layouts, and a fine-grained mixture
# has a few hundred GEMMs a block (Qwen3-30B-A3B: 128 experts × 3)
@functools.lru_cache(maxsize=1 << 12)
def _block_gemms_timed(
    cfg: ModelConfig, tokens: int, tp: int, ep: int, etp: int, g: GPU, elem: int, fp8: bool
) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient part of backward) seconds of one block's matmuls
    over ``tokens`` rows (:func:`paracube.models.shapes.block_gemms`)."""
    linear, linear_elem = _linear_units(g, elem, fp8)
    fwd = bwd = weight = 0.0
    for m, n, k in shapes.block_gemms(cfg, tokens, tp, ep, etp):
        f, b = _gemm_fwd_bwd(m, n, k, linear, linear_elem)
        fwd, bwd, weight = fwd + f, bwd + b, weight + _gemm(k, n, m, linear, linear_elem)
    return fwd, bwd, weight


def pass_costs(
    cfg: ModelConfig,
    layout: Layout,
    g: GPU,
    elem: int,
    fp8: bool,
    forward: float,
    backward: float,
    redo: float,
) -> tuple[float, float, float]:
    """One block's (F, I, W) for one micro-batch: its forward, its backward less the
    weight-gradient matmuls (the input-gradient pass, which also reruns a recomputed block),
    and those matmuls. ZB-H1's bubble is (p − 1)(T_F + T_B − T_W) in these (Qi et al. 2024,
    §3.1: T_B the input-gradient pass); the paper's profiles put W near half of the rest of
    the backward (its Table 6: 9.3 ms against 18.1 for the 1.5B model), not the equal
    thirds the unit costs assume."""
    weight = block_weight_grad_time(cfg, layout, g, elem, fp8)
    recomputed = redo * _recomputed_share(cfg, layout) if layout.recompute != "none" else 0.0
    return forward, backward - weight + recomputed, weight


def fp8_cast_bytes(
    gemms: list[tuple[float, float, float]], current: bool = False
) -> tuple[float, float]:
    """(forward, backward) HBM bytes of making one block's FP8 operands, per micro-batch.
    Hopper's FP8 GEMMs take one layout only, both operands K-major (cuBLAS documentation,
    ``cublasLtMatmul``'s FP8 requirements: "A must be transposed and B non-transposed", the
    TN format — why Transformer Engine keeps transposed copies), so each (m × k)·(k × n)
    linear needs its input in FP8 and, for the weight gradient, that input transposed;
    backward the same of its output gradient (m × n). Each is one cast-transpose pass:
    2 bytes read, 1 + 1 written per element; under current scaling the tensor's own amax is
    read first, 2 bytes more (delayed scaling takes the scale from the amax history).
    The weights' own casts happen once per step (cached across micro-batches) and the
    scaling factors' amax reductions are a few values per tensor: neither is counted."""
    per_element = 2 + 1 + 1 + (2 if current else 0)
    return (
        per_element * sum(m * k for m, _, k in gemms),
        per_element * sum(m * n for m, n, _ in gemms),
    )


def accumulation_time(layout: Layout, g: GPU, params: float, embedding: float, elem: int) -> float:
    """Seconds per step of the passes over this rank's ``params`` weight gradients outside
    the GEMMs (bytes read + written per parameter, at the memory rate): bringing each
    micro-batch's gradients (``elem`` bytes, as autograd produces them) into the buffer they
    are reduced from (fp32, or ``elem`` bytes under ``grad_reduce="compute"``), and, before
    each reduction over more than one rank, averaging that buffer (a read and a write of
    it: paracube's ``buffer.div_(world)`` in ``FlatDataParallel._launch_ready``, Megatron's
    gradient scaling, DeepSpeed's and FSDP's pre-divide) — once per step, or under ZeRO-2/3,
    which reduce-scatter every micro-batch, once per micro-batch:

    - ``buffer`` (paracube's engine, :meth:`paracube.data_parallel.flat.FlatUnit.absorb`):
      the window's first micro-batch copies its gradient in (elem + buffer), each later one
      adds (elem + 2 × buffer; where the dtypes agree ``.grad`` is a view of the buffer and
      autograd's in-place add moves the same bytes). Megatron's DDP hook adds every
      micro-batch into a zeroed main_grad (``param.main_grad.add_(param.grad.data)``,
      megatron/core/distributed/distributed_data_parallel.py) — the same pass. Under
      ZeRO-2/3 each micro-batch starts a new window: a copy.
    - ``fused`` (Megatron-Core's gradient_accumulation_fusion): the weight-gradient GEMM
      accumulates into main_grad in its epilogue — no pass, but for the ``embedding``
      parameters (no GEMM computes the embedding's gradient: its hook adds it).
    - ``bf16-optimizer`` (DeepSpeed's BF16_Optimizer, ``update_hp_grads`` after every
      micro-batch's backward): ``hp_grad.add_(lp.grad.to(fp32))`` — the cast writes an
      fp32 temporary (elem + 4), the add reads it and the fp32 gradient and writes that
      (3 × 4): every micro-batch, the fp32 gradients zeroed after the step.
    - ``side-stream`` (PyTorch FSDP, FSDP1 and FSDP2): the unsharded gradient cast to the
      reduce dtype (a copy) and pre-divided before its reduce-scatter
      (torch/distributed/fsdp/_runtime_utils.py ``_reduce_grad``: ``_div_if_needed(
      padded_unsharded_grad, ...)``) on FSDP's post-backward stream, beside the next
      unit's backward: hidden, slowing that compute by :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN` of its
      seconds, as the communication hidden there does.

    Paracube's passes run in the backward hooks, on the compute stream: on the step.

    ZeRO-3 kept gathered through a pipelined step (``Layout.zero3_per_step``) reduces once,
    after the last backward; until then FSDP2 brings each micro-batch's unsharded gradient
    into an unsharded one in the reduce dtype (``to_accumulated_grad_if_needed``: a cast,
    then adds) in its post-backward, on the compute stream — the ``buffer`` passes — and
    pre-divides it beside the compute before the one reduce-scatter.
    """
    m = layout.microbatches
    buffer = gradient_bytes(elem, layout.grad_reduce)
    copy, add = elem + buffer, elem + 2 * buffer
    reductions = m if layout.zero >= 2 and not layout.zero3_per_step else 1
    average = reductions * 2 * buffer if layout.grad_group > 1 else 0
    kind = layout.grad_accumulation
    if layout.zero3_per_step:
        on_step = params * (copy + (m - 1) * add)
        beside = params * average
        if kind != "side-stream":
            on_step, beside = on_step + beside, 0.0
        return (on_step + OVERLAP_SLOWDOWN * beside) / g.memory_rate
    if kind == "bf16-optimizer":
        moved = params * (m * (elem + 4 + 3 * 4) + average)
    elif kind == "fused":
        moved = embedding * (copy + (m - 1) * add) + params * average
    else:
        absorbed = m * copy if layout.zero >= 2 else copy + (m - 1) * add
        moved = params * (absorbed + average)
    seconds = moved / g.memory_rate
    return OVERLAP_SLOWDOWN * seconds if kind == "side-stream" else seconds


def gather_copy_time(layout: Layout, g: GPU, params: float, root: float, elem: int) -> float:
    """Seconds per micro-batch of copying ZeRO-3's gathered parameters out of the
    all-gather's output into each parameter's own tensor, under per-parameter sharding
    (FSDP2: "foreach_all_gather (copy-in/all-gather collective) and
    foreach_all_gather_copy_out (copy-out)", pytorch/pytorch#117950 — the output holds rank
    0's shard of every parameter, then rank 1's…, so no parameter is a view of it,
    #117203). A read and a write of ``elem``-byte values for the rank's ``params`` gathered
    for forward and again, all but the ``root`` unit's (which stays gathered), for backward
    (:func:`~paracube.planner.dp_comm.zero3_collectives`) — on the compute stream: FSDP2 copies out in
    ``wait_for_unshard``, before the unit computes, overlapping only the collectives
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py). 0 for flat units (paracube,
    FSDP1, DeepSpeed: the parameters are views of the gathered buffer), below ZeRO-3 or
    without a group to gather from."""
    if layout.zero != 3 or layout.param_gather != "per-parameter" or layout.shard_group == 1:
        return 0.0
    if layout.zero3_per_step:  # gathered once a step, for the first forward: per micro-batch
        return 2 * elem * params / g.memory_rate / layout.microbatches
    return 2 * elem * (2 * params - root) / g.memory_rate


# Bytes per parameter an AdamW step moves over fp32 weights w, gradients g and moments m, v
# (choices.OPTIMIZER_KERNELS). Fused: one kernel reads w, g, m, v and writes w, m, v — 7 × 4.
# Multi-op: each op a pass of its own, 20 fp32 reads and writes — torch.optim.AdamW's default
# multi-tensor path (torch/optim/adam.py, _multi_tensor_adam: the decoupled decay
# _foreach_mul_ on w 2, _foreach_lerp_ of m toward g 3, _foreach_mul_ of v 2,
# _foreach_addcmul_ of g² into v 3, _foreach_sqrt of v 2, _foreach_div_ by the bias
# correction 2, _foreach_add_ of eps 2, _foreach_addcdiv_ into w 4), and Composer's
# DecoupledAdamW as llm-foundry's yamls run it (weight_decay 0: no decay pass; per parameter
# exp_avg.mul_().add_() 5, exp_avg_sq.mul_().addcmul_() 5, sqrt, / and add_ 6, addcdiv_ 4).
OPTIMIZER_BYTES = {"fused": 7 * 4, "multi-op": 20 * 4}
# Of the fused step's seven passes, the four over the moments (m and v each read and written):
# 2 bytes each rather than 4 when they are kept in bf16 (Layout.moments)
MOMENT_PASSES = 4


def optimizer_time(layout: Layout, g: GPU, shard: float, elem: int) -> float:
    """The optimizer step is memory-bound, on this rank's share of the states: the global
    gradient norm reads the fp32 gradients (4 bytes per parameter); clipping rescales them —
    a read and a write more — always under torch's and FSDP1's ``clip_grad_norm_`` (which
    multiply by the clamped coefficient to spare a host sync; ``clip_scale="always"``), only
    when the norm is over the limit under paracube's and Megatron's (not counted: late in
    training it rarely is); AdamW moves :data:`OPTIMIZER_BYTES` (``layout.optimizer_kernel``);
    a 16-bit model whose main weights sit in the optimizer then gets its new weights — the
    main copy read, the compute copy written (4 + elem bytes). No copy is written where the
    parameters are the main weights (an fp32 model's; PyTorch FSDP's fp32 parameters, cast
    only as they are gathered: ``master_weights="parameters"``), and pure 16-bit training
    (``"none"``) steps 16-bit gradients, moments and weights: every pass at elem bytes; bf16
    moments (``layout.moments``, Megatron-Core's precision-aware optimizer) are read and
    written at 2 bytes (:data:`MOMENT_PASSES`). On a
    GPU's HBM; or offloaded: in host memory, the host's own fused step, after the gradient
    slice crossed PCIe to the host and before the new values cross back (paracube copies
    after the reduction: exposed)."""
    stepped = shard / (layout.shard_group if layout.zero >= 1 else 1)
    if not layout.offload:
        state = elem if layout.master_weights == "none" else 4  # bytes of each stepped value
        cast = elem != 4 and layout.master_weights == "optimizer"
        write_back = 4 + elem if cast else 0
        rescale = 2 * state if layout.clip_scale == "always" else 0
        adam = OPTIMIZER_BYTES[layout.optimizer_kernel] * state / 4
        if layout.moments == "bf16":
            adam -= MOMENT_PASSES * (4 - 2)
        return (state + rescale + adam + write_back) * stepped / g.memory_rate
    if not (g.host_link_bandwidth and g.host_memory_bandwidth):
        raise ConfigError(f"--offload: no host link or host memory figures for {g.name}")
    host = (4 + OPTIMIZER_BYTES["fused"]) * stepped / g.host_memory_bandwidth
    return 2 * elem * stepped / g.host_link_bandwidth + host


def logit_metric_bytes(elem: int) -> int:
    """HBM bytes per logit of one cross-entropy metric over ``elem``-byte logits, as torch
    runs ``CrossEntropyLoss`` under autocast (counted from its dispatched kernels in
    tests/test_planner_metrics.py): 16-bit logits cast to fp32 (read 2, write 4 bytes) —
    log_softmax is autocast to fp32 — then the fp32 log-softmax read and written (8); the
    loss itself gathers one log-probability a row. fp32 logits: the log-softmax only."""
    return (elem + 4 if elem < 4 else 0) + 2 * 4


def head_time(cfg: ModelConfig, layout: Layout, g: GPU, elem: int = 2) -> float:
    """Forward + backward seconds of the output head and the loss for one micro-batch, of a
    final soft cap over the logits (``cfg.logit_softcap``) and of the metrics the trainer
    computes over its logits (``layout.logit_metrics``)."""
    t = layout.tp
    logits = layout.micro_batch * cfg.seq_len * cfg.vocab_size / t  # (b, s, V/t)
    head_fwd, head_bwd = _gemm_fwd_bwd(
        layout.micro_batch * cfg.seq_len, cfg.vocab_size / t, cfg.hidden, g, elem
    )
    # the loss: softmax over the logits in fp32 — written, read, and its gradient written
    loss = 3 * logits * 4 / g.memory_rate
    metrics = layout.logit_metrics * logits * logit_metric_bytes(elem) / g.memory_rate
    # a final soft cap (Gemma 2's): its passes over the logits, op by op or fused
    softcap = 0.0
    if cfg.logit_softcap:
        passes = shapes.logit_softcap_bytes(elem, eager=layout.elementwise == "eager")
        softcap = logits * sum(passes) / g.memory_rate
    return head_fwd + head_bwd + loss + metrics + softcap


def kernel_refusal(attention: str, gpu: GPU, precision: str) -> str:
    """Why ``attention``'s kernel cannot run on ``gpu`` in ``precision`` ("" if it can):
    FlashAttention-3's kernels (choices.HOPPER_ATTENTION) are Hopper's — its warpgroup
    matmuls and TMA loads — over 16-bit or FP8 operands."""
    if attention not in HOPPER_ATTENTION:
        return ""
    if not gpu.fp8_flops:  # Hopper's FP8 tensor cores mark its generation
        return (
            f"attention={attention}: FlashAttention-3 runs on Hopper GPUs (H100, H200, H800), "
            f"not {gpu.name}; use attention=fused (FlashAttention-2)"
        )
    if precision not in ("bf16", "fp16", "fp8"):
        return (
            f"attention={attention} with --precision {precision}: FlashAttention-3 takes 16-bit "
            "(or FP8) operands; plan bf16, or attention=fused"
        )
    return ""


def at_precision(cluster: Cluster, precision: str) -> Cluster:
    """``cluster`` with its GPU's peak set to the rate of ``precision``'s matmul units;
    fp8 refused on a GPU without FP8 tensor cores, bf16 on one without bfloat16 tensor
    cores."""
    if precision == "fp8" and not cluster.gpu.fp8_flops:
        raise ConfigError(
            f"--precision fp8: {cluster.gpu.name} has no FP8 tensor cores (Hopper and later); "
            "plan it in bf16"
        )
    if precision == "bf16" and not cluster.gpu.bf16:
        raise ConfigError(
            f"--precision bf16: {cluster.gpu.name} has no bfloat16 tensor cores (Ampere "
            "and later); plan it in fp16"
        )
    rate = cluster.gpu.rate(precision)
    if rate == cluster.gpu.peak_flops:
        return cluster
    # the attention rates are FlashAttention's, whose kernels run 16-bit operands on the
    # tensor cores only (PyTorch's flash backend takes fp16 and bf16); in fp32 or TF32 the
    # fused attention that runs (the memory-efficient kernel) is a matmul on the
    # precision's own units, at their rate
    return replace(
        cluster,
        gpu=replace(cluster.gpu, peak_flops=rate, attention_rate=0.0, attention_backward_rate=0.0),
    )


def estimate(
    cfg: ModelConfig, layout: Layout, cluster: Cluster, precision: str = "bf16"
) -> StepEstimate:
    """Predict one optimizer step of ``layout`` on ``cluster``: its time by part, tokens/s,
    TFLOP/s per GPU and MFU. The busiest pipeline rank sets the pace.

    >>> from paracube.models.presets import preset
    >>> from paracube.planner import hardware as hw
    >>> cluster = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"),
    ...                   hw.interconnect("ib-hdr"))
    >>> est = estimate(preset("gpt3-1.3b"), Layout(dp=8, micro_batch=4, microbatches=4), cluster)
    >>> 0 < est.mfu < 1 and est.step_time > est.compute
    True
    """
    refusal = layout.model_refusal(cfg) or kernel_refusal(layout.attention, cluster.gpu, precision)
    if refusal:
        raise ConfigError(refusal)
    # the matmul units this precision runs on (fp32: CUDA cores, tf32/bf16/fp16: tensor
    # cores) set every compute rate below, and MFU is measured against their peak
    cluster = at_precision(cluster, precision)
    g, p, m = cluster.gpu, layout.pp, layout.microbatches
    elem = ELEMENT_BYTES[precision]
    fp8 = precision == "fp8"
    local = rank_sequence(cfg, layout)  # the s/cp tokens a rank holds under context parallelism
    # one block of each kind (a mixture's and its dense blocks', each attending locally or
    # fully), timed once
    costs = {
        kind.kind_key: block_costs(kind, layout, cluster, elem, fp8)
        for kind, _ in local.kind_counts()
    }
    # every pipeline rank with the blocks the engine's split gives it; the slowest sets the pace
    ranks = [
        _rank_step(local, layout, cluster, share, elem, costs)
        for share in layout_shares(cfg, layout)
    ]
    busiest = max(ranks, key=lambda r: r.compute + r.recompute + r.tp_comm + r.cp_comm + r.ep_comm)
    compute, recompute, tp_comm = busiest.compute, busiest.recompute, busiest.tp_comm
    cp_comm, ep_comm = busiest.cp_comm, busiest.ep_comm
    pp_comm = pp_transfer_time(local, layout, cluster, elem)
    # the schedule's unit costs: a block's passes, over the kinds as the model holds them
    F, I, W = (
        sum(n * costs[kind.kind_key].passes[part] for kind, n in local.kind_counts()) / cfg.n_layers
        for part in range(3)
    )
    overhead = get_schedule(layout.schedule).idle_over_busy(p, m, layout.chunks, F, I, W)
    busy = compute + recompute + tp_comm + cp_comm + ep_comm
    bubble = overhead * busy if p > 1 else 0.0
    # each rank's own gradient reduction and optimizer step after its last backward
    dp_exposed, optimizer = max(
        ((r.dp_exposed, r.optimizer) for r in ranks), key=lambda pair: sum(pair)
    )
    step = busy + pp_comm + bubble + dp_exposed + optimizer
    tokens = layout.dp * layout.micro_batch * m * cfg.seq_len
    tflops = tokens * model_flops_per_token(cfg) / (step * layout.gpus) / 1e12
    hardware = (
        tokens
        * hardware_flops_per_token(
            cfg,
            layout.recompute,
            _recomputed_share(cfg, layout),
            layout.recompute_replay,
            layout.recompute_modules,
        )
        / (step * layout.gpus)
        / 1e12
    )
    return StepEstimate(
        compute=compute,
        recompute=recompute,
        tp_comm=tp_comm,
        pp_comm=pp_comm,
        bubble=bubble,
        dp_exposed=dp_exposed,
        optimizer=optimizer,
        tokens_per_s=tokens / step,
        tflops_per_gpu=tflops,
        # under fp8 against the FP8 peak (llm-foundry's FP8 table does the same): never above 1
        mfu=tflops * 1e12 / (g.fp8_flops if fp8 else g.peak_flops),
        hardware_tflops_per_gpu=hardware,
        cp_comm=cp_comm,
        ep_comm=ep_comm,
    )


@dataclass(frozen=True)
class _RankTime:
    compute: float
    recompute: float
    tp_comm: float
    dp_exposed: float
    optimizer: float
    cp_comm: float = 0.0
    ep_comm: float = 0.0


@dataclass(frozen=True)
class BlockCosts:
    """One block's seconds per micro-batch, for one kind of block (``cfg``: a uniform
    model, the rank's view): its forward + backward (``block``), what recomputing it re-runs
    (``redo``), its context-parallel ring (forward, backward), its matmuls (what overlapped
    tensor-parallel collectives hide behind), its all-to-alls, and its (F, I, W) passes for
    the schedule's unit costs (:func:`pass_costs`)."""

    block: float
    redo: float
    ring: tuple[float, float]
    gemms: float
    to_experts: float
    passes: tuple[float, float, float]


def block_costs(
    cfg: ModelConfig, layout: Layout, cluster: Cluster, elem: int, fp8: bool
) -> BlockCosts:
    """:class:`BlockCosts` of ``cfg``'s block (a uniform model: one kind of block)."""
    g = cluster.gpu
    fwd, bwd, _ = layer_time(cfg, layout, g, elem, fp8)
    core = attention_core(cfg, layout, g, elem)[0]  # the context-parallel ring hides behind it
    redo = recompute_time(cfg, layout, g, elem, fp8, fwd)
    to_experts = ep_comm_time(cfg, layout, cluster)
    if layout.recompute == "selective" and "moe" in layout.recompute_modules:
        redo += to_experts / 2  # the replayed layer's dispatch and combine, again
    return BlockCosts(
        block=fwd + bwd,
        redo=redo,
        ring=cp_comm_time(cfg, layout, cluster, elem, core),
        gemms=sum(block_gemm_time(cfg, layout, g, elem, fp8)),
        to_experts=to_experts,
        passes=pass_costs(cfg, layout, g, elem, fp8, fwd, bwd, redo),
    )


def _rank_step(
    cfg: ModelConfig,
    layout: Layout,
    cluster: Cluster,
    share: RankShare,
    elem: int,
    costs: dict[tuple[bool, int, int], BlockCosts],
) -> _RankTime:
    """One pipeline rank's step parts: its blocks' forward + backward (each kind's
    ``costs``, by :attr:`~paracube.config.ModelConfig.kind_key`: a mixture's blocks and its
    dense ones apart, locally and fully attending ones apart), the head's on the last rank,
    the recomputation of its recomputed blocks, its tensor-parallel collectives, its
    context-parallel ring (its forward's part again in a fully recomputed block), and its
    own gradient reduction and optimizer step over its parameters (``cfg``: the rank's
    view, :func:`rank_sequence`); a mixture's all-to-alls, the forward's half again in a
    fully recomputed block."""
    g, t, m = cluster.gpu, layout.tp, layout.microbatches
    blocks = len(share.blocks)
    held = cfg.kind_counts(share.blocks)
    if cfg.uniform:  # the search's hot path: one kind, its recomputed blocks counted
        redone_of = {cfg.kind_key: recomputed_blocks(share, layout)}
    else:
        redone_of = {k.kind_key: n for k, n in cfg.kind_counts(recomputed_indices(share, layout))}
    full = layout.recompute == "full"
    per_mb = head_time(cfg, layout, g, elem) if share.head else 0.0
    block_params = experts = recompute = cp = ep = tp_comm = 0.0
    for kind, n in held:  # a mixture's blocks, and its dense ones
        cost, redone = costs[kind.kind_key], redone_of.get(kind.kind_key, 0)
        per_mb += n * cost.block
        block_params += n * shapes.block_params(kind, tp=t, ep=layout.ep, etp=layout.expert_tp)
        if kind.moe:
            experts += n * shapes.expert_params(kind, layout.expert_tp, layout.ep)
        recompute += m * redone * cost.redo
        tp_comm += blocks_tp_comm(kind, layout, cluster, n, elem, redone, cost.gemms)
        cp += m * (n * sum(cost.ring) + (redone * cost.ring[0] if full else 0.0))
        waited = (
            overlapped_ep_comm(cost.to_experts, cost.block, layout)
            if layout.ep_comm_overlap
            else cost.to_experts
        )
        ep += m * (n * waited + (redone * cost.to_experts / 2 if full else 0.0))
    params = block_params
    if share.embedding:
        params += shapes.embed_params(cfg, tp=t)
    if share.head:
        params += shapes.norm_params(cfg)
        if not (cfg.tie_embeddings and share.embedding):  # one copy when both are here
            params += shapes.head_params(cfg, tp=t)
    embedding = shapes.embed_params(cfg, tp=t) if share.embedding else 0.0
    if share.head and cfg.mtp_layers:  # multi-token prediction, on the last stage
        mtp = _mtp_step(cfg, layout, cluster, share, elem, costs)
        per_mb += mtp.per_mb
        params += mtp.params
        embedding += mtp.embedding
        experts += mtp.experts
        tp_comm += mtp.tp_comm
        cp += mtp.cp_comm
        ep += mtp.ep_comm
    root = params - block_params  # embedding, final norm, head (and what predicts further)
    return _RankTime(
        # the blocks' and the head's work, ZeRO-3's copy-outs (FSDP2) and bringing their
        # gradients into the buffer
        compute=m * (per_mb + gather_copy_time(layout, g, params, root, elem))
        + accumulation_time(layout, g, params, embedding, elem),
        recompute=recompute,
        tp_comm=tp_comm + ends_tp_comm(cfg, layout, cluster, elem),
        dp_exposed=dp_exposed_time(
            layout,
            cluster,
            reduced_params(layout, params, experts),
            per_mb,
            cfg,
            blocks,
            elem,
            root,
        ),
        # sharded, the experts' states are over their own group (ep times smaller unfolded):
        # counted as many times over among the params optimizer_time divides by the whole one
        optimizer=optimizer_time(
            layout,
            g,
            params + (experts * (expert_share(layout) - 1) if layout.zero else 0.0),
            elem,
        ),
        cp_comm=cp,
        ep_comm=ep,
    )


@dataclass(frozen=True)
class _MtpStep:
    per_mb: float  # forward + backward seconds per micro-batch
    params: float
    embedding: float  # the embedding's copy on the last stage, of params
    experts: float  # a mixture's experts, of params
    tp_comm: float
    cp_comm: float
    ep_comm: float


def _mtp_step(
    cfg: ModelConfig,
    layout: Layout,
    cluster: Cluster,
    share: RankShare,
    elem: int,
    costs: dict[tuple[bool, int, int], BlockCosts],
) -> _MtpStep:
    """What the multi-token prediction modules add to the last pipeline rank (Megatron-Core
    places them there, --mtp-num-layers): per module and micro-batch, its 2h → h projection
    (column-parallel), one block of the last block's kind (never recomputed here) with its
    collectives, and the shared head and loss again; its parameters, and — under a pipeline,
    where the embedding lives on the first rank — a copy of the embedding table, which the
    module reads the next tokens from (Megatron builds the embedding on the MTP stage too)."""
    g, t, m, d = cluster.gpu, layout.tp, layout.microbatches, cfg.mtp_layers
    last = cfg.block_kind(cfg.n_layers - 1)
    cost = costs[last.kind_key]
    tokens = layout.micro_batch * cfg.seq_len
    projection = sum(_gemm_fwd_bwd(tokens, cfg.hidden / t, 2 * cfg.hidden, g, elem))
    waited = (
        overlapped_ep_comm(cost.to_experts, cost.block, layout)
        if layout.ep_comm_overlap
        else cost.to_experts
    )
    copy = shapes.embed_params(cfg, tp=t) if not share.embedding else 0.0
    return _MtpStep(
        per_mb=d * (cost.block + projection + head_time(cfg, layout, g, elem)),
        params=shapes.mtp_params(cfg, t, layout.ep, layout.expert_tp) + copy,
        embedding=copy,
        experts=shapes.mtp_expert_params(cfg, layout.expert_tp, layout.ep),
        tp_comm=d * blocks_tp_comm(last, layout, cluster, 1, elem, 0, cost.gemms),
        cp_comm=m * d * sum(cost.ring),
        ep_comm=m * d * waited,
    )


def expert_share(layout: Layout) -> float:
    """How many times smaller the experts' gradient group is than the whole one: ep
    unfolded; ep × etp ÷ tp folded (:attr:`Layout.expert_grad_group`)."""
    return layout.grad_group / layout.expert_grad_group


def reduced_params(layout: Layout, params: float, experts: float) -> float:
    """The parameters a rank's gradient reduction moves, counted as if all were reduced
    over the data-parallel group (dp × cp) on its link, as :func:`~paracube.planner.dp_comm.dp_exposed_time` times
    them: a mixture's ``experts`` (of ``params``) are reduced over their expert
    data-parallel group instead (``Layout.expert_grad_group``, ep times smaller), whose ring
    moves (n_e − 1)/n_e of their bytes through each rank against the whole group's
    (n − 1)/n — so they count by that ratio (none when each expert has one rank). The ring's
    latency steps and the expert group's own link are not told apart."""
    n, n_e = layout.grad_group, layout.expert_grad_group
    if not experts or n <= 1:
        return params
    share = ((n_e - 1) / n_e) / ((n - 1) / n)
    return params - experts + experts * share


def _recomputed_share(cfg: ModelConfig, layout: Layout) -> float:
    """The model's blocks under recomputation: all, or the first --recompute-blocks."""
    n = layout.recompute_blocks
    return 1.0 if n is None else min(n, cfg.n_layers) / cfg.n_layers
