"""Activation bytes that paracube's own GPT saves for backward — derived op by op.

Korthikanti et al.'s Table 2 (see :mod:`paracube.planner.memory`) counts Megatron's layer:
16-bit tensors, dropout masks, and an *unfused* attention whose s×s scores, softmax and
dropout mask (5·a·s²·b bytes) dominate at long sequences. paracube's block differs: no
dropout, any dtype, and a fused attention kernel (``scaled_dot_product_attention``) that
keeps only its output and one fp32 log-sum-exp per row and query head — no s×s tensor.
Following the same method (list what each operation keeps for its backward, count each
storage once), with N = b·s tokens, E bytes per element, t tensor-parallel ranks, and
``/t_s`` meaning "divided by t under sequence parallelism":

======================================  ==========================================
kept by                                  bytes
======================================  ==========================================
attn_norm (input x; mean, rstd)          N·h·E/t_s + 2·N·E/t_s (RMSNorm: + x·rstd, fp32
                                         rstd and, below fp32, an fp32 copy of x)
qkv_proj (its input: the norm output)    N·h·E (full: gathered under SP)
attention core (q, k, v views; output;   N·(h + 2·k_v)·E/t + N·h·E/t + 4·N·a/t
log-sum-exp fp32)
rotary positions (rotated q, k; tables)  N·(h + k_v)·E/t + s_max·d·E
grouped-query (k, v expanded to a heads) 2·N·(h − k_v)·E/t (rotary without GQA: a
                                         contiguous copy of v, N·k_v·E/t)
o_proj (its input = the core's output)   — (same storage)
mlp_norm (input x + attn; mean, rstd)    N·h·E/t_s + 8N/t_s
up_proj (its input: the norm output)     N·h·E
activation (GELU: up output;             GELU: 2·N·F·E/t; SwiGLU: 4·N·F·E/t
SwiGLU: gate|up, silu(gate), product)
======================================  ==========================================

k_v = kv_heads·d (d head size), F the MLP width, a the heads. Without rotary positions and
with GELU, LayerNorm and no TP this is N·(16·h·E + 4·E + 4a) bytes: 16·s·b·h at E = 2
against Korthikanti's 34·s·b·h — no dropout masks, fused attention.

Recomputation: *selective* recomputes the attention core from q, k and v, so its
log-sum-exp is not kept (the core's output still is: o_proj needs it); *full* keeps only
the block's input, N·h·E/t_s.
"""

from __future__ import annotations

from paracube.config import ModelConfig

def block_saved_bytes(
    cfg: ModelConfig, b: int, *, elem: int = 4, tp: int = 1, sequence_parallel: bool = False,
    recompute: str = "none", seq: int | None = None,
) -> int:
    """Bytes one of paracube's transformer blocks keeps for backward, per micro-batch of
    ``b`` sequences of ``seq`` (default ``cfg.seq_len``) tokens."""
    s = seq or cfg.seq_len
    n = b * s
    h, d, a = cfg.hidden, cfg.head_dim, cfg.n_heads
    kv = cfg.n_kv_heads * d
    ts = tp if sequence_parallel else 1
    if recompute == "full":
        return n * h * elem // ts
    # Each norm keeps its input and statistics (LayerNorm mean and rstd; RMSNorm rstd and,
    # being composed of elementary ops, also the normalised x before the scale).
    norms = 2 * _norm_bytes(cfg, n, elem) // ts
    norm_outputs = 2 * n * h * elem  # kept by qkv_proj and up_proj (gathered under SP)
    attention = n * (h + 2 * kv) * elem // tp + n * h * elem // tp
    if recompute != "selective":
        attention += 4 * n * a // tp  # the fused kernel's fp32 log-sum-exp
        if kv < h:  # grouped-query: the kernel keeps k and v expanded to every query head
            attention += 2 * n * (h - kv) * elem // tp
        elif cfg.position == "rope":  # contiguous rotated q, k beside a strided v: v is copied
            attention += n * kv * elem // tp
    if cfg.position == "rope":
        attention += n * (h + kv) * elem // tp + cfg.seq_len * d * elem
    f = cfg.ffn_hidden
    mlp = (4 if cfg.activation == "swiglu" else 2) * n * f * elem // tp
    return norms + norm_outputs + attention + mlp


def model_saved_bytes(cfg: ModelConfig, b: int, *, elem: int = 4, recompute: str = "none",
                      recompute_blocks: int | None = None) -> int:
    """The whole (single-stage, tp = 1) model per micro-batch: the blocks, plus token
    indices (int64), the final norm and head inputs, and the log-softmax the loss keeps
    (in fp32) and its targets (int64, assumed a separate tensor from the inputs)."""
    n, h, s = b * cfg.seq_len, cfg.hidden, cfg.seq_len
    chosen = cfg.n_layers if recompute_blocks is None else recompute_blocks
    blocks = chosen * block_saved_bytes(cfg, b, elem=elem, recompute=recompute)
    blocks += (cfg.n_layers - chosen) * block_saved_bytes(cfg, b, elem=elem)
    embed = 8 * n + (8 * s if cfg.position == "learned" else 0)
    head = _norm_bytes(cfg, n, elem) + n * h * elem  # the final norm, and the head's input
    loss = n * cfg.vocab_size * max(elem, 4) + 8 * n + 4  # fp32 log-softmax, targets, total weight
    return blocks + embed + head + loss


def _norm_bytes(cfg: ModelConfig, n: int, elem: int) -> int:
    """What one norm over n tokens keeps: LayerNorm its input and mean/rstd (in the input
    dtype); RMSNorm, composed of elementary ops, its input, the normalised x before the
    scale, an fp32 rstd and, below fp32, the fp32 copy of its input it computes in."""
    h = cfg.hidden
    if cfg.norm == "layernorm":
        return n * h * elem + 2 * n * elem
    return 2 * n * h * elem + 4 * n + (n * h * 4 if elem < 4 else 0)
