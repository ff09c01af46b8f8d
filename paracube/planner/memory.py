"""Memory per GPU: model states under ZeRO, and activations (pure math, bytes).

Model states (Rajbhandari et al. 2020, "ZeRO", §3 and Figure 1): mixed-precision Adam keeps
``(2 + 2 + K)·Ψ`` bytes — fp16 weights, fp16 gradients, and K = 12 bytes of fp32 master
weights, momentum and variance — split over the data-parallel degree ``N_d`` as:

    stage 0: (2 + 2 + K)·Ψ      stage 1: 4Ψ + K·Ψ/N_d
    stage 2: 2Ψ + (2 + K)·Ψ/N_d stage 3: (2 + 2 + K)·Ψ/N_d

Activations per transformer layer (Korthikanti et al. 2022, Table 2; 16-bit activations,
1-byte dropout masks), s sequence, b micro-batch, h hidden, a heads, t tensor parallel:

    none:                    s·b·h·(34 + 5·a·s/h)
    tensor parallel:         s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP + sequence parallel:  (s·b·h/t)·(34 + 5·a·s/h)
    TP + selective recompute s·b·h·(10 + 24/t)
    TP + SP + selective:     34·s·b·h/t
    full recompute:          2·s·b·h (the layer's input only)
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.choices import ATTENTION, FUSED_ATTENTION, RECOMPUTE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.shapes import moe_routing_bytes


@dataclass(frozen=True)
class ModelStates:
    """Bytes per device of each model state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    params: float,
    zero: int,
    dp: int,
    *,
    weight_bytes: int = 2,
    grad_bytes: int = 2,
    optimizer_bytes: int = 12,
) -> ModelStates:
    """ZeRO's per-device model states for ``params`` parameters (Ψ) at stage ``zero``.

    Defaults are mixed-precision Adam (2 + 2 + 12); fp32 training without master copies is
    ``weight_bytes=4, grad_bytes=4, optimizer_bytes=8``.
    """
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"unknown ZeRO stage {zero}: choose 0, 1, 2 or 3")
    if dp < 1:
        raise ConfigError(f"data-parallel degree must be ≥ 1, got {dp}")
    w, g, o = weight_bytes * params, grad_bytes * params, optimizer_bytes * params
    return ModelStates(
        weights=w / dp if zero >= 3 else w,
        gradients=g / dp if zero >= 2 else g,
        optimizer=o / dp if zero >= 1 else o,
    )


def activation_bytes_per_layer(
    s: int,
    b: int,
    h: int,
    a: int,
    *,
    t: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    attention: str = "unfused",
) -> float:
    """Korthikanti et al. 2022, Table 2 (16-bit activations, with dropout masks).

    ``attention="fused"`` (or ``"fused-triton"``) is a FlashAttention-style kernel (Dao et
    al. 2022; PyTorch's ``scaled_dot_product_attention``, which paracube's model uses): it
    never stores the s×s score, softmax and dropout tensors (5·a·s/h), only a per-row
    log-sum-exp — the same bytes as selective recomputation, which it makes moot."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}: choose one of {', '.join(RECOMPUTE)}")
    if attention not in ATTENTION:
        raise ConfigError(f"unknown attention {attention!r}: choose one of {', '.join(ATTENTION)}")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    if attention in FUSED_ATTENTION:
        recompute = "selective"
    scores = 5 * a * s / h  # the s×s score, softmax and dropout tensors
    if sequence_parallel:
        return sbh / t * (34 + (0 if recompute == "selective" else scores))
    return sbh * (10 + 24 / t + (0 if recompute == "selective" else scores / t))


def te_block_bytes(
    cfg: ModelConfig,
    b: int,
    *,
    t: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    fp8: bool = False,
    etp: int | None = None,
    modules: tuple[str, ...] = ("core_attn",),
) -> float:
    """Bytes one block keeps for backward per micro-batch of ``b`` sequences as Megatron-Core
    keeps them with Transformer Engine's modules (``Layout.activations == "megatron"``) —
    Korthikanti et al. 2022's per-layer accounting (§4, Table 2) for a FlashAttention block of
    any shape, n = b·s tokens, 16-bit values, sharded over the t tensor-parallel ranks:

    - each norm its input and its fp32 statistics per token; each column-parallel linear its
      input, the norm's output — under sequence parallelism both only as this rank's 1/t of
      the sequence (the all-gather is redone in backward, Korthikanti §4.2.2);
    - the attention kernel q, k and v (grouped-query k and v at their own width, never
      expanded), its output and an fp32 log-sum-exp per head and token; the output
      projection's input is that output;
    - the MLP its first projection's output (SwiGLU's gate and up, or GELU's input) and the
      activation's output, the second projection's input;
    - no dropout masks (paracube's models have no dropout; Korthikanti's 34·s·b·h/t counts
      two 1-byte masks: without them a GPT block here is 32·s·b·h/t).

    Under ``fp8`` the linear layers keep their inputs as the FP8 copies their weight
    gradients use (1 byte, Transformer Engine's saved ``inputmat``): the norms' outputs, the
    activation's output, and beside the attention output its FP8 copy. Full recomputation
    keeps the block's input only; selective drops what its ``modules`` make again
    (choices.RECOMPUTE_MODULES): the kernel's log-sum-exp (core_attn: its other tensors are
    the linears' inputs and outputs, kept either way), a latent attention's per-head q, k
    and v (mla_up_proj), a dense block's MLP but its input (mlp), a mixture's MoE layer but
    its input (moe) or its shared experts (shared_experts), and — not under FP8, where the
    linears keep FP8 copies of their own — the experts' activation outputs (moe_act) and
    the norms' outputs (layernorm)."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}: choose one of {', '.join(RECOMPUTE)}")
    n, h, a, f = b * shapes.one_kind(cfg).seq_len, cfg.hidden, cfg.n_heads, cfg.ffn_hidden
    kv = cfg.n_kv_heads * cfg.head_dim
    ts = t if sequence_parallel else 1
    if recompute == "full":
        return 2.0 * n * h / ts
    linear_in = 1 if fp8 else 2  # bytes of a saved linear input
    stats = 8 if cfg.norm == "layernorm" else 4  # fp32 mean and rstd, or rstd alone
    selective = modules if recompute == "selective" else ()
    norms = cfg.block_norms * (2 * n * h + stats * n) / ts  # post-norms: their inputs too
    norm_outputs = 0.0 if "layernorm" in selective and not fp8 else 2 * linear_in * n * h / ts
    if cfg.mla:  # the latents, the kernel's q, k, v and output, its log-sum-exp
        attention = float(
            shapes.latent_attention_saved_bytes(
                cfg, n, 2, t, int(ts), recompute, linear_in, modules
            )
        )
        if fp8:  # the output projection's FP8 input beside the kernel's output
            attention += n * a * cfg.v_dim / t
    else:
        attention = 2 * n * (2 * h + 2 * kv) / t  # q, out; k, v
        if not (recompute == "selective" and "core_attn" in modules):
            attention += 4 * n * a / t
        if fp8:
            attention += n * h / t  # the output projection's FP8 input beside the kernel's output
    gate_up = 2 if cfg.activation == "swiglu" else 1
    mlp = 2 * gate_up * n * f / t + linear_in * n * f / t
    if "mlp" in selective and not cfg.moe:
        mlp = 0.0  # checkpointed whole: its input is the norm's output, counted above
    if cfg.moe:  # k experts' MLPs for every token, what the routing keeps, the shared experts
        shared = (
            2 * gate_up * n * cfg.shared_expert_ffn / t + linear_in * n * cfg.shared_expert_ffn / t
        )
        if "moe_act" in selective and not fp8:  # each expert's activation output
            mlp -= linear_in * n * f / t
        mlp = mlp * cfg.experts_per_token + moe_routing_bytes(cfg, n, 2, t, int(ts), etp, linear_in)
        if "moe" in selective:  # the whole layer checkpointed: its input, the norm's output
            mlp = shared = 0.0
        elif "shared_experts" in selective:
            shared = 0.0
        mlp += shared
    return norms + norm_outputs + attention + mlp
