"""Reference decoder-only transformer. Knows nothing about parallelism.

Pre-norm blocks (Radford et al. 2019), causal self-attention and an MLP, with the
options the GPT-3 and LLaMA families need: LayerNorm or RMSNorm, GELU or SwiGLU,
learned or rotary positions, grouped-query attention, tied or separate embeddings.

Written for the later parallel passes:
- every projection is an ``nn.Linear`` with a stable module path
  (``blocks.3.attn.qkv_proj``), so a tensor-parallel plan can name it and split it
  (fused projections split section by section);
- the model is an ordered chain ``embed → blocks[0..L) → norm → head``, so a pipeline
  pass can cut it into stages (see :meth:`GPT.layers`).

Shapes: B batch, T sequence, H hidden, n heads, d head size, V vocabulary.
"""

from __future__ import annotations

import functools
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from paracube.choices import RECOMPUTE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.memory.activations import note_saved


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)


def rotary_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's cos/sin tables of RoFormer (Su et al. 2021), each (T, d/2): pair i of a
    head turns by t·ω_i at position t, ω_i = θ^(−2i/d) at the model's base θ, stretched as
    its ``rope_scaling`` says (:func:`rotary_frequencies`). The one owner of the tables: the
    GPT builds them, and so does the materializer for a model built on the meta device."""
    omega = rotary_frequencies(cfg)  # (d/2,)
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), omega)
    return angles.cos(), angles.sin()


def rotary_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """ω_i = θ^(−2i/d), i < d/2, in float32 (as Meta's and Hugging Face's Llama compute
    them), then stretched for a long context:

    - ``linear`` (position interpolation, Chen et al. 2023): every ω_i ÷ factor;
    - ``llama3`` (Llama 3.1, Dubey et al. 2024 §3.1.2's long-context stage; its reference
      code's ``apply_scaling``): by wavelength λ_i = 2π/ω_i against the original context
      C — λ_i > C/low (slow pairs) ÷ factor, λ_i < C/high (fast pairs) kept, and between
      them the blend (1 − s)·ω_i/factor + s·ω_i with s = (C/λ_i − low) / (high − low).
    """
    d = cfg.head_dim
    omega = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    if cfg.rope_scaling == "linear":
        return omega / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        context, low, high = (
            cfg.rope_original_context,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
        )
        wavelength = 2 * math.pi / omega
        blend = (context / wavelength - low) / (high - low)  # 0 at C/low, 1 at C/high
        stretched = (1 - blend) * omega / cfg.rope_factor + blend * omega
        slow, fast = wavelength > context / low, wavelength < context / high
        return torch.where(slow, omega / cfg.rope_factor, torch.where(fast, omega, stretched))
    return omega


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x: (B, n, T, d) by the position angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, n, T, d/2)
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def _attention_core(q, k, v, gqa: bool, kept=()) -> torch.Tensor:
    """softmax(q·kᵀ/√d + causal mask)·v: (B, n, T, d) each → (B, n, T, d).

    ``kept`` is unused by the computation: under recomputation it carries the
    ``note_saved`` tokens, so that ``checkpoint`` holds them exactly as long as it holds
    q, k, v — the activation counter then sees the kept inputs freed when they are."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


class CausalSelfAttention(nn.Module):
    cos: torch.Tensor  # (T, d/2) rotary tables, buffers when positions are rotary
    sin: torch.Tensor
    """Multi-head (or grouped-query) causal self-attention with one fused q/k/v projection,
    as Megatron's GPT: one matmul for the three, and under tensor parallelism one input
    collective for the three."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        # Output columns: [q (n·d) | k (n_kv·d) | v (n_kv·d)]; n·d is the hidden size unless
        # the head size is decoupled from it (cfg.head_size)
        self.qkv_proj = nn.Linear(cfg.hidden, cfg.q_dim + 2 * kv_dim, bias=cfg.attention_biased)
        self.o_proj = nn.Linear(cfg.q_dim, cfg.hidden, bias=cfg.bias)
        # Qwen3's and OLMo 2's per-head q and k norms: an RMSNorm over each head's d values,
        # before the rotary positions; a d-wide weight shared by every head (under tensor
        # parallelism each rank's heads: tensor_parallel.plan.HeadShared)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.recompute_core = False  # selective activation recomputation (set by apply_recompute)
        self.rotary = cfg.position == "rope"
        if self.rotary:
            cos, sin = rotary_tables(cfg)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, H)
        qkv = self.qkv_proj(x)  # (B, T, (n + 2·n_kv)·d), or 1/tp of each part on a TP shard
        B, T, _ = qkv.shape  # (under sequence parallelism x held T/tp tokens, qkv holds T)
        # Head counts come from the width, so a tensor-parallel shard holding n/tp query and
        # n_kv/tp key/value heads runs this code unchanged.
        heads = qkv.shape[-1] // self.head_dim
        q_heads = heads * self.n_heads // (self.n_heads + 2 * self.n_kv_heads)
        kv_heads = (heads - q_heads) // 2
        q, k, v = qkv.split(
            [q_heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim], dim=-1
        )
        q = q.view(B, T, q_heads, self.head_dim)  # (B, T, n, d)
        k = k.view(B, T, kv_heads, self.head_dim)  # (B, T, n_kv, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # over each head's d values
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, n, T, d), (B, n_kv, T, d)
        v = v.view(B, T, kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = (
                apply_rotary(q, self.cos[:T], self.sin[:T]),
                apply_rotary(k, self.cos[:T], self.sin[:T]),
            )
        if self.recompute_core and torch.is_grad_enabled():
            # Selective recomputation (Korthikanti et al. 2022, §4.2): keep only q, k, v and
            # recompute the attention core in backward instead of saving its outputs.
            kept = note_saved(q, k, v)
            y = checkpoint(_attention_core, q, k, v, kv_heads != q_heads, kept, use_reentrant=False)
        else:
            y = _attention_core(q, k, v, kv_heads != q_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, n·d) → (B, T, H)


class MLP(nn.Module):
    """GELU MLP, or SwiGLU (Shazeer 2020) with the gate and up projections fused into one
    ``up_proj`` of 2·F outputs ([gate | up])."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.activation == "swiglu"
        width = 2 * cfg.ffn_hidden if self.swiglu else cfg.ffn_hidden
        self.up_proj = nn.Linear(cfg.hidden, width, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        up = self.up_proj(x)  # (B, T, F) or (B, T, 2F); 1/tp of it on a TP shard
        if self.swiglu:
            gate, up = up.chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.gelu(up, approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.recompute = False  # full activation recomputation (set by apply_recompute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        if self.recompute and torch.is_grad_enabled():
            # Full recomputation (Chen et al. 2016): keep only the block's input and run the
            # block's forward again in backward.
            return checkpoint(self._forward, x, note_saved(x), use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor, kept=()) -> torch.Tensor:
        # ``kept``: the note_saved token of x, held by checkpoint as long as x (see
        # _attention_core); unused by the computation.
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def check_tokens(tokens: torch.Tensor, vocab_size: int, seq_len: int) -> None:
    """Refuse what the embedding would fail on obscurely: not (B, T) integers, more than
    ``seq_len`` positions (the position tables' size), or ids outside the vocabulary
    (checked on CPU only: on a GPU the check would stall the stream every forward)."""
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(
            f"tokens must be a (batch, seq) integer tensor, got {tuple(tokens.shape)} {tokens.dtype}"
        )
    if tokens.shape[1] > seq_len:
        raise ValueError(
            f"{tokens.shape[1]} positions is more than the model's seq_len {seq_len}: "
            "cut the input or build the model with a longer seq_len"
        )
    if tokens.device.type == "cpu" and tokens.numel():
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary 0..{vocab_size - 1}")


class _Table(nn.Embedding):
    """An ``nn.Embedding`` left undrawn: :meth:`GPT.reset_parameters` gives every parameter
    its value. Its own ``normal_`` would be drawn only to be overwritten, and on the meta
    device — where every rank builds the model — that call imports ``torch._dynamo``:
    1.2-1.7 s of CPU per rank, the largest part of a small job's start-up."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Module):
    """Token embedding plus, for learned positions, a position embedding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = _Table(cfg.vocab_size, cfg.hidden)
        self.pos = _Table(cfg.seq_len, cfg.hidden) if cfg.position == "learned" else None
        self.vocab_size, self.seq_len = cfg.vocab_size, cfg.seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) int -> (B, T, H)
        check_tokens(tokens, self.vocab_size, self.seq_len)
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


# A 16-bit GEMM gets the tensor cores' fast kernels only when each matrix's rows start 16
# bytes apart (NVIDIA, "Matrix Multiplication Background User's Guide", Tensor Core
# Requirements). GPT-2's 50,257-token vocabulary makes the logits' rows odd: on an H200 the
# head's products ran at 136 TFLOP/s against 650-790 for the block's (benchmarks/
# gpu_check.sh), a fifth of a GPT-3 1.3B step. Megatron-LM pads the vocabulary itself
# (--make-vocab-size-divisible-by 128), which adds embeddings to the model; the head here
# pads only its products, so the model, its parameters and its outputs stay the serial ones.
VOCAB_ALIGN = 128


class _PaddedHeadProduct(torch.autograd.Function):
    """logits = x·Wᵀ — x (..., H), W (V, H) → (..., V) — computed against W with zero rows
    appended up to a multiple of :data:`VOCAB_ALIGN`, so every product of forward and
    backward has aligned rows; the padded logits are dropped. It keeps x and W, as
    ``F.linear`` does: the padded copies are transient (the saved-activation count and the
    planner's formula stay the same)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        vocab = weight.shape[0]
        padded = F.pad(weight, (0, 0, 0, -vocab % VOCAB_ALIGN))  # (V + pad, H), zero rows
        return F.linear(x, padded)[..., :vocab]  # a view of (..., V + pad): aligned rows

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # grad (..., V)
        x, weight = ctx.saved_tensors
        vocab, pad = weight.shape[0], -weight.shape[0] % VOCAB_ALIGN
        grad_padded = F.pad(grad, (0, pad))  # (..., V + pad): zero beyond V
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_padded @ F.pad(weight, (0, 0, 0, pad))  # (..., H)
        if ctx.needs_input_grad[1]:
            grad_w = (grad_padded.flatten(0, -2).t() @ x.flatten(0, -2))[:vocab]  # (V, H)
        return grad_x, grad_w


class Head(nn.Linear):
    """The output projection (B, T, H) → (B, T, V), without bias: an ``nn.Linear`` whose
    products run over a vocabulary padded to :data:`VOCAB_ALIGN` on a GPU when the
    vocabulary is not a multiple of it (see :class:`_PaddedHeadProduct`)."""

    def __init__(self, hidden: int, vocab: int, **kw):
        super().__init__(hidden, vocab, bias=False, **kw)

    @classmethod
    def padding(cls, linear: nn.Module) -> nn.Module:
        """An output projection (a Hugging Face ``lm_head``) as a Head sharing its weight —
        a tied embedding stays tied — where its vocabulary needs the padding; otherwise
        (aligned, with a bias, not a plain ``nn.Linear``) ``linear`` itself."""
        if (
            type(linear) is not nn.Linear
            or linear.bias is not None
            or linear.out_features % VOCAB_ALIGN == 0
        ):
            return linear
        head = cls(linear.in_features, linear.out_features, device="meta")
        head.weight = linear.weight
        return head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.out_features % VOCAB_ALIGN:
            return _PaddedHeadProduct.apply(x, self.weight)
        return F.linear(x, self.weight)


class GPT(nn.Module):
    """``logits = head(norm(blocks(embed(tokens))))``; tokens (B, T) → logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.moe:
            raise ConfigError(
                f"{cfg.name}: experts={cfg.experts} — mixture-of-experts blocks are planned "
                "(paracube plan), not built: paracube's GPT has dense MLPs (experts=0)"
            )
        if cfg.planned_parts:
            raise ConfigError(
                f"{cfg.name}: {cfg.planned_parts} — planned (paracube plan), not built: "
                "paracube's GPT builds none of them"
            )
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.head = Head(cfg.hidden, cfg.vocab_size)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.tok.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every parameter to its :func:`initial_values` for the seed torch was last given
        (``torch.manual_seed``); nothing on the meta device (see
        :mod:`paracube.materialize`, which fills only a rank's shards)."""
        params = dict(self.named_parameters())
        if next(iter(params.values())).is_meta:
            return
        for name, p in params.items():
            initial_value(self.cfg, torch.initial_seed(), name, out=p)

    def layers(self) -> list[nn.Module]:
        """The model as an ordered chain of layers, for pipeline partitioning."""
        return [self.embed, *self.blocks, self.norm, self.head]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, V)


def parameter_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Every parameter of the serial model, by name, in order (a meta build: no memory)."""
    return dict(_parameter_shapes(cfg))


@functools.lru_cache(maxsize=8)
def _parameter_shapes(cfg: ModelConfig) -> tuple[tuple[str, torch.Size], ...]:
    with torch.device("meta"):
        return tuple((n, p.shape) for n, p in GPT(cfg).named_parameters())


def initial_value(
    cfg: ModelConfig, seed: int, name: str, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The serial model's initial value of parameter ``name`` for ``seed``, drawn into
    ``out`` (its full shape; default a new tensor of the default dtype) — GPT-2
    initialisation: N(0, σ) weights, zero biases, unit norm scales, and the two
    projections that write into the residual stream scaled by 1/sqrt(2L) (Radford et al.
    2019).

    Each parameter has its own generator, seeded from ``(seed, name)``: any rank draws
    any parameter, in any order, without drawing the others first — so a rank keeps only
    its shards, ZeRO-3 fills one unit at a time, and nothing depends on how or in which
    order the modules were built."""
    if out is None:
        out = torch.empty(parameter_shapes(cfg)[name])
    if out.dim() == 1:  # biases and norm scales
        return out.fill_(1.0 if name.endswith("norm.weight") else 0.0)
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little"))
    std = cfg.init_std
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std /= math.sqrt(2 * cfg.n_layers)
    return out.normal_(0.0, std, generator=g)


def initial_values(cfg: ModelConfig, seed: int):
    """``(name, full tensor)`` of every parameter of the serial model, in order."""
    for name, shape in parameter_shapes(cfg).items():
        yield name, initial_value(cfg, seed, name, torch.empty(shape))


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """Softmax statistics in fp32 even when the model computes in bf16/fp16."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy; logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(
        at_least_fp32(logits.flatten(0, 1)), targets.flatten(), reduction=reduction
    )


def apply_recompute(model: nn.Module, mode: str, blocks: int | None = None) -> int:
    """Turn on activation recomputation in the first ``blocks`` transformer blocks found in
    ``model`` (all if None): ``full`` recomputes whole blocks, ``selective`` only the
    attention core. Returns how many blocks were set."""
    if mode not in RECOMPUTE:
        raise ValueError(f"unknown recompute mode {mode!r}: choose one of {', '.join(RECOMPUTE)}")
    found = [m for m in model.modules() if isinstance(m, Block)]
    chosen = found if blocks is None else found[:blocks]
    for b in found:
        b.recompute = mode == "full" and b in chosen
        b.attn.recompute_core = mode == "selective" and b in chosen
    return len(chosen) if mode != "none" else 0
