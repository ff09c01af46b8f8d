"""The reference GPT's arithmetic — the only place it is written down.

Parameters per layer kind, the matmul shapes of a block (and how tensor parallelism
splits them), FLOPs, and the activation bytes each operation keeps for backward. The
module (:mod:`paracube.models.gpt`), the presets, the pipeline partitioner and every
planner formula ask here, and tests hold these numbers against the real module (counts
of ``numel`` and of saved-tensor bytes). Torch-free: the planner sizes 405B models.

Notation: h hidden, F MLP width, k_v = kv_heads·d (d head size), a heads, V vocabulary,
s sequence, b micro-batch, N = b·s tokens, t tensor-parallel ranks, E bytes per element.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import NamedTuple

from paracube.config import ModelConfig
from paracube.errors import ConfigError


class Linear(NamedTuple):
    """One ``nn.Linear`` of a block: its path, sizes and how tensor parallelism splits it
    (``column``: output features split, bias split; ``row``: input features split, bias
    replicated and added after the reduction — Shoeybi et al. 2019, §3; ``replicated``:
    whole on every rank, each over its own sequence shard under sequence parallelism — a
    latent attention's down projections, Megatron-Core's ``parallel_mode="duplicated"``)."""

    name: str
    in_features: int
    out_features: int
    split: str


def kv_dim(cfg: ModelConfig) -> int:
    return cfg.n_kv_heads * cfg.head_dim


def mlp_in_width(cfg: ModelConfig) -> int:
    """Outputs of the MLP's first projection: F, or 2F for SwiGLU's fused gate | up."""
    return (2 if cfg.activation == "swiglu" else 1) * cfg.ffn_hidden


def one_kind(cfg: ModelConfig) -> ModelConfig:
    """``cfg``, whose blocks must all be alike: a model with dense blocks among its
    mixture's (``dense_layers``) is asked per kind (:meth:`ModelConfig.kind_counts`) —
    every per-block formula here refuses it, so that no caller counts the mixture's block
    L times by mistake."""
    if not cfg.uniform:
        kinds = (
            f"dense blocks {list(cfg.dense_layers)} among the mixture's"
            if cfg.dense_layers
            else f"one block in {cfg.full_attention_every} attending fully, the others locally"
        )
        raise ConfigError(
            f"{cfg.name}: its blocks are of more than one kind ({kinds}): a per-block figure "
            "is asked per kind (ModelConfig.kind_counts)"
        )
    return cfg


def block_linears(cfg: ModelConfig) -> list[Linear]:
    """The block's linears: the attention's (:func:`attention_linears`), then the MLP's up
    and down projections (:func:`mlp_linears`)."""
    return attention_linears(cfg) + mlp_linears(cfg)


def attention_linears(cfg: ModelConfig) -> list[Linear]:
    """The attention's linears, the output projection last: the fused q | k | v and the
    output; or a latent attention's (DeepSeek-V2 §2.1.2, as Megatron-Core's
    MLASelfAttention holds them) — the queries' down projection h → q_lora_rank (or, without
    one, h → a·(d + d_r) directly), their up projection to every head's d + d_r, the keys'
    and values' down projection h → kv_lora_rank + d_r (the latent and the rotary key every
    head shares), their up projection to every head's key d and value d_v, and the output
    from a·d_v. The down projections are replicated over the tensor-parallel ranks."""
    h, q = one_kind(cfg).hidden, cfg.q_dim  # q = h unless the head size is decoupled
    if not cfg.mla:
        return [
            Linear("attn.qkv_proj", h, q + 2 * kv_dim(cfg), "column"),  # fused q | k | v
            Linear("attn.o_proj", q, h, "row"),
        ]
    a, rope = cfg.n_heads, cfg.rope_head_dim
    queries = [
        Linear("attn.q_down_proj", h, cfg.q_lora_rank, "replicated"),
        Linear("attn.q_up_proj", cfg.q_lora_rank, a * cfg.qk_head_dim, "column"),
    ]
    return [
        *(
            queries
            if cfg.q_lora_rank
            else [Linear("attn.q_proj", h, a * cfg.qk_head_dim, "column")]
        ),
        Linear("attn.kv_down_proj", h, cfg.kv_lora_rank + rope, "replicated"),
        Linear("attn.kv_up_proj", cfg.kv_lora_rank, a * (cfg.head_dim + cfg.v_dim), "column"),
        Linear("attn.o_proj", a * cfg.v_dim, h, "row"),
    ]


def mlp_linears(cfg: ModelConfig) -> list[Linear]:
    """The MLP's up projection (SwiGLU's fused gate | up) and down projection."""
    h = one_kind(cfg).hidden
    return [
        Linear("mlp.up_proj", h, mlp_in_width(cfg), "column"),
        Linear("mlp.down_proj", cfg.ffn_hidden, h, "row"),
    ]


def latent_norm_params(cfg: ModelConfig) -> int:
    """A latent attention's RMSNorms over its q and kv latents (replicated); 0 otherwise."""
    return cfg.q_lora_rank + cfg.kv_lora_rank if cfg.mla else 0


def op_checkpoint_linears(cfg: ModelConfig) -> list[tuple[Linear, bool, bool]]:
    """The block's linears as torchtitan's Llama calls them — separate q, k and v
    projections, the output projection, then SwiGLU's w1 (gate), w3 (up) and w2 (down), or a
    GELU MLP's two — each as (linear, kept, redone): whether torchtitan's op-level selective
    checkpointing keeps its output, and whether backward recomputes it. "Saves output of
    all compute ops, except every second mm" (torchtitan's ``_apply_op_sac``, counting the
    block's matmuls from 1: the 2nd, 4th, 6th are not kept); PyTorch's non-reentrant
    checkpoint stops recomputing once backward has all it needs (``early_stop``), so the
    block's last matmul, whose output only enters the residual sum, is never redone (a GELU
    MLP's second). tests/test_planner_op_checkpoint.py runs the policy on torch's ops and
    watches what the forward keeps and which matmuls the backward redoes."""
    if cfg.mla:
        raise ConfigError(
            "torchtitan's op-level checkpointing is not counted for a latent attention"
        )
    h, q, kv, f = one_kind(cfg).hidden, cfg.q_dim, kv_dim(cfg), cfg.ffn_hidden
    calls = [
        Linear("attn.wq", h, q, "column"),
        Linear("attn.wk", h, kv, "column"),
        Linear("attn.wv", h, kv, "column"),
        Linear("attn.wo", q, h, "row"),
    ]
    if cfg.activation == "swiglu":
        calls += [
            Linear("mlp.w1", h, f, "column"),
            Linear("mlp.w3", h, f, "column"),
            Linear("mlp.w2", f, h, "row"),
        ]
    else:
        calls += [Linear("mlp.fc1", h, f, "column"), Linear("mlp.fc2", f, h, "row")]
    last = len(calls) - 1
    return [(lin, i % 2 == 0, i % 2 == 1 and i < last) for i, lin in enumerate(calls)]


# -- a mixture of experts (ModelConfig.experts; planned, not built) ------------------------
#
# Each block's MLP is E experts of the MLP's shape and a router, an h × E matrix that every
# token passes (Megatron-Core's TopKRouter; replicated across tensor-parallel ranks), which
# sends the token to k of them (experts_per_token). A token's path through a block is the
# attention, the router and k experts' MLPs: parameters count the E experts, FLOPs the k.
# Under expert parallelism (``ep``) a rank holds E/ep of the experts, each split by tensor
# parallelism as a dense MLP is (Megatron-Core's experts with expert_tensor_parallel_size =
# tp), and processes, with tokens balanced over the experts — Megatron-Core's
# moe_pad_expert_input_to_capacity at capacity factor 1 makes them so —, the k·N tokens its
# own N tokens send: ep·k·N/E rows for each of its experts. Folded (Megatron-Core's parallel
# folding) at an expert-tensor-parallel size ``etp`` below tp, each expert is split over
# etp ranks only and every rank dispatches its own N/tp sequence shard: an expert takes
# ep·etp·k·N/(tp·E) rows — the same k·N rows × f/tp columns of work on each rank.


def mlp_copies(cfg: ModelConfig) -> int:
    """How many MLPs of the configured shape a block holds: E experts, or the one."""
    return cfg.experts if cfg.moe else 1


def mlp_passes(cfg: ModelConfig) -> int:
    """How many MLPs a token passes in a block: k of the experts, or the one."""
    return cfg.experts_per_token if cfg.moe else 1


def router_params(cfg: ModelConfig) -> int:
    """The router's h × E weights (no bias); 0 for a dense MLP."""
    return cfg.hidden * cfg.experts if cfg.moe else 0


def _mlp_matrix_params(cfg: ModelConfig) -> int:
    return sum(lin.in_features * lin.out_features for lin in mlp_linears(cfg))


# A mixture's shared experts (ModelConfig.shared_expert_ffn): one MLP every token passes
# beside its k routed experts — Megatron-Core's SharedExpertMLP, split by tensor parallelism
# as a dense MLP (its own all-gather and reduce-scatter under sequence parallelism),
# replicated over the expert-parallel ranks and reduced over the whole data-parallel group
# with the attention's weights; no dispatch. Qwen2-MoE's sigmoid gate on it (h weights) is
# not counted.


def shared_linears(cfg: ModelConfig) -> list[Linear]:
    """The shared experts' up and down projections (of the experts' activation: SwiGLU's
    fused gate | up, or one), none without shared experts."""
    if not cfg.shared_expert_ffn:
        return []
    f = cfg.shared_expert_ffn
    width = (2 if cfg.activation == "swiglu" else 1) * f
    return [
        Linear("mlp.shared.up_proj", cfg.hidden, width, "column"),
        Linear("mlp.shared.down_proj", f, cfg.hidden, "row"),
    ]


def _shared_matrix_params(cfg: ModelConfig) -> int:
    return sum(lin.in_features * lin.out_features for lin in shared_linears(cfg))


def shared_expert_params(cfg: ModelConfig, tp: int = 1) -> float:
    """The shared experts' parameters on one tensor-parallel rank: matrices and the column
    bias split, the row bias replicated (0 without shared experts)."""
    linears = shared_linears(cfg)
    if not linears:
        return 0.0
    bias = 1 if cfg.bias else 0
    up, down = linears
    return (_shared_matrix_params(cfg) + bias * up.out_features) / tp + bias * down.out_features


def block_matrix_dims(cfg: ModelConfig, tp: int = 1) -> list[tuple[int, int]]:
    """(out, in) of each linear of a block as one tensor-parallel rank holds it: a
    column-parallel layer's outputs and a row-parallel layer's inputs divided by tp."""
    return [
        (
            lin.out_features // tp if lin.split == "column" else lin.out_features,
            lin.in_features // tp if lin.split == "row" else lin.in_features,
        )
        for lin in block_linears(cfg)
    ]


def smallest_matrix_dim(cfg: ModelConfig, tp: int = 1) -> int:
    """The smallest dimension of any matrix one tensor-parallel rank holds (the block's
    linears — each kind's —, the embedding and head split by vocabulary)."""
    dims = [
        d for kind, _ in cfg.kind_counts() for pair in block_matrix_dims(kind, tp) for d in pair
    ]
    return min([cfg.hidden, -(-cfg.vocab_size // tp), *dims])


def norm_params(cfg: ModelConfig) -> int:
    return (2 if cfg.norm == "layernorm" else 1) * cfg.hidden


def block_matrix_params(cfg: ModelConfig) -> int:
    """Weights of one block's matrices: the attention's, every expert's MLP (the one MLP of
    a dense block), the shared experts' and the router's."""
    attention = sum(lin.in_features * lin.out_features for lin in attention_linears(cfg))
    mlps = mlp_copies(cfg) * _mlp_matrix_params(cfg) + _shared_matrix_params(cfg)
    return attention + mlps + router_params(cfg)


def block_active_matrix_params(cfg: ModelConfig) -> int:
    """The matrix weights a token passes in one block — each does 2 FLOPs per token forward:
    the attention's, the router's, k experts' MLPs and the shared experts' (a dense block:
    all of its matrices)."""
    attention = sum(lin.in_features * lin.out_features for lin in attention_linears(cfg))
    mlps = mlp_passes(cfg) * _mlp_matrix_params(cfg) + _shared_matrix_params(cfg)
    return attention + mlps + router_params(cfg)


@cache  # the planners ask it for every candidate layout
def block_params(cfg: ModelConfig, tp: int = 1, ep: int = 1, etp: int | None = None) -> float:
    """Parameters of one block held by one tensor-parallel rank: matrices and column
    biases split by tp, the norms and the row-parallel biases replicated; of a mixture
    of experts the E/ep experts the rank holds under expert parallelism ``ep``, each split
    over ``etp`` ranks (None: tp), the shared experts split by tp, and the router,
    replicated."""
    experts = expert_params(cfg, tp if etp is None else etp, ep)
    shared = shared_expert_params(cfg, tp)
    return _attention_params(cfg, tp) + experts + shared + router_params(cfg)


def _attention_params(cfg: ModelConfig, tp: int) -> float:
    """The block's attention linears and its norms (two, or four under ``post_norms``) on
    one tensor-parallel rank (and the per-head q and k norms' d weights each, replicated)."""
    # the column-parallel q, k, v biased under bias or qkv_bias (Qwen2's), the output's
    # under bias alone
    column_bias, row_bias = int(cfg.attention_biased), int(cfg.bias)
    linears = attention_linears(cfg)
    columns = [lin for lin in linears if lin.split == "column"]
    o = linears[-1]  # the output projection, row-parallel
    # a latent attention's down projections and its latents' norms, whole on every rank
    replicated = sum(
        lin.in_features * lin.out_features for lin in linears if lin.split == "replicated"
    )
    qk_norms = 2 * cfg.head_dim if cfg.qk_norm else 0
    return (sum(c.in_features * c.out_features for c in columns) + o.in_features * o.out_features
            + column_bias * sum(c.out_features for c in columns)) / tp \
        + cfg.block_norms * norm_params(cfg) + row_bias * o.out_features + qk_norms + replicated \
        + latent_norm_params(cfg)  # fmt: skip


def expert_params(cfg: ModelConfig, tp: int = 1, ep: int = 1) -> float:
    """The MLP parameters of one block on one rank: the dense MLP's shard (its column
    bias split, the row bias replicated), or E/ep experts' — what expert parallelism
    divides, and what a mixture reduces over its expert data-parallel group."""
    bias = 1 if cfg.bias else 0
    up, down = mlp_linears(cfg)
    one = (_mlp_matrix_params(cfg) + bias * up.out_features) / tp + bias * down.out_features
    return mlp_copies(cfg) // ep * one if cfg.moe else one


def embed_params(cfg: ModelConfig, tp: int = 1) -> float:
    """Token table split by vocabulary rows; learned positions replicated."""
    return cfg.vocab_size * cfg.hidden / tp + (
        cfg.seq_len * cfg.hidden if cfg.position == "learned" else 0
    )


def head_params(cfg: ModelConfig, tp: int = 1) -> float:
    """The LM head's matrix (its own copy, also when tied to the embedding)."""
    return cfg.vocab_size * cfg.hidden / tp


def mtp_params(cfg: ModelConfig, tp: int = 1, ep: int = 1, etp: int | None = None) -> float:
    """The multi-token prediction modules' parameters on one rank of the last pipeline
    stage (0 without them): each its two input norms, the 2h → h projection (split by tp
    as a column-parallel layer), a block of the last block's kind and its final norm; the
    embedding and the output head are the model's own, shared."""
    if not cfg.mtp_layers:
        return 0.0
    last = cfg.block_kind(cfg.n_layers - 1)
    one = 3 * norm_params(cfg) + 2 * cfg.hidden * cfg.hidden / tp + block_params(last, tp, ep, etp)
    return cfg.mtp_layers * one


def mtp_expert_params(cfg: ModelConfig, tp: int = 1, ep: int = 1) -> float:
    """Of :func:`mtp_params`, a mixture's experts (reduced over their own group)."""
    last = cfg.block_kind(cfg.n_layers - 1)
    return cfg.mtp_layers * expert_params(last, tp, ep) if last.moe else 0.0


def parameter_count(cfg: ModelConfig) -> int:
    """Exact parameter count of :class:`paracube.models.gpt.GPT` built from ``cfg`` (tested
    against the module's ``numel``); a tied head adds nothing. A model with dense blocks
    among its mixture's (planned, not built): each kind's blocks at their own count; its
    multi-token prediction modules (:func:`mtp_params`) with them."""
    head = 0 if cfg.tie_embeddings else head_params(cfg)
    blocks = sum(n * block_params(kind) for kind, n in cfg.kind_counts()) + mtp_params(cfg)
    return int(blocks + embed_params(cfg) + norm_params(cfg) + head)


def block_gemms(
    cfg: ModelConfig, tokens: int, tp: int = 1, ep: int = 1, etp: int | None = None
) -> list[tuple[float, float, float]]:
    """(m, n, k) of each forward GEMM of one block on one tensor-parallel rank: the
    (tokens × k)·(k × n) products, column-parallel ones with n/tp outputs, row-parallel
    ones with k/tp inputs — the attention's, then the MLP's up and down projections; of a
    mixture of experts, after the router's (tokens × E), an up and a down projection for
    each of the E/ep experts the rank holds, over ep·k·tokens/E rows each (the tokens the
    ep ranks send it, balanced over the experts), one GEMM per expert as Megatron-Core's
    SequentialMLP runs them — split over ``etp`` ranks (None: tp), ep·etp·k·tokens/(tp·E)
    rows each when folded —, then the shared experts' up and down projections over every
    token, split by tp. The last GEMM is always a down projection."""
    etp = tp if etp is None else etp
    mlp = mlp_linears(cfg)
    gemms = [rank_gemm(lin, tokens, tp) for lin in attention_linears(cfg)]
    if not cfg.moe:
        return gemms + [rank_gemm(lin, tokens, tp) for lin in mlp]
    rows = ep * etp * mlp_passes(cfg) * tokens / (tp * cfg.experts)
    gemms.append((tokens, cfg.experts, cfg.hidden))  # the router
    for _ in range(cfg.experts // ep):
        gemms += [rank_gemm(lin, rows, etp) for lin in mlp]
    return gemms + [rank_gemm(lin, tokens, tp) for lin in shared_linears(cfg)]


def moe_layer_gemms(
    cfg: ModelConfig, tokens: int, tp: int = 1, ep: int = 1, etp: int | None = None
) -> list[tuple[float, float, float]]:
    """A mixture's MoE layer among :func:`block_gemms`: the router's, the experts' the rank
    holds and the shared experts' (none for a dense block)."""
    return block_gemms(cfg, tokens, tp, ep, etp)[len(attention_linears(cfg)) :] if cfg.moe else []


def moe_layer_active_params(cfg: ModelConfig) -> int:
    """The MoE layer's weights a token passes: the router's, k experts', the shared ones'."""
    if not cfg.moe:
        return 0
    expert = sum(lin.in_features * lin.out_features for lin in mlp_linears(cfg))
    return router_params(cfg) + cfg.experts_per_token * expert + _shared_matrix_params(cfg)


def rank_gemm(lin: Linear, rows: float, ranks: int) -> tuple[float, float, float]:
    """(m, n, k) of ``lin``'s forward over ``rows`` tokens on one of ``ranks`` tensor-
    parallel ranks: a column-parallel layer's n/ranks outputs, a row-parallel one's k/ranks
    inputs, a replicated one whole over the rank's sequence shard (rows/ranks, under SP)."""
    if lin.split == "column":
        return (rows, lin.out_features / ranks, lin.in_features)
    if lin.split == "replicated":
        return (rows / ranks, lin.out_features, lin.in_features)
    return (rows, lin.out_features, lin.in_features / ranks)


# a latent attention's up projections (and, without a query latent, its query projection):
# what Megatron-Core's mla_up_proj recomputation runs again
LATENT_UP_PROJECTIONS = ("attn.q_up_proj", "attn.q_proj", "attn.kv_up_proj")


def selectively_redone_linears(cfg: ModelConfig, modules: tuple[str, ...]) -> list[Linear]:
    """The linears a selective recomputation of ``modules`` (choices.RECOMPUTE_MODULES)
    runs forward again in one block of ``cfg``'s kind: a latent attention's up projections
    (mla_up_proj), a dense block's MLP whole (mlp: Megatron's checkpoint replays it all),
    the shared experts (shared_experts). The attention core (core_attn) is no linear, and a
    whole MoE layer's experts (moe) are the rank's GEMMs (:func:`moe_layer_gemms`)."""
    redone = []
    if "mla_up_proj" in modules and cfg.mla:
        redone += [lin for lin in attention_linears(cfg) if lin.name in LATENT_UP_PROJECTIONS]
    if "mlp" in modules and not cfg.moe:
        redone += mlp_linears(cfg)
    if "shared_experts" in modules and "moe" not in modules and cfg.moe:
        redone += shared_linears(cfg)  # the whole MoE layer (moe) counts them with it
    return redone


def down_gemms(
    cfg: ModelConfig, tokens: int, tp: int = 1, ep: int = 1, etp: int | None = None
) -> list[tuple[float, float, float]]:
    """The MLP's down projections among :func:`block_gemms`: the block's last matmul, once
    per expert the rank holds and the shared experts' — what a checkpoint that stops early
    does not replay."""
    count = cfg.experts // ep + len(shared_linears(cfg)) // 2 if cfg.moe else 1
    return block_gemms(cfg, tokens, tp, ep, etp)[-2 * count + 1 :: 2]


def block_forward_flops_per_token(cfg: ModelConfig) -> float:
    """Matmul FLOPs of one block's forward per token: 2 per matrix weight it passes (k
    experts' of a mixture), plus the attention core's 4·s·h (QKᵀ and scores·V over the full
    s×s, as the published formulas count them — Narayanan et al. 2021; Korthikanti et al.
    2022)."""
    return 2 * block_active_matrix_params(cfg) + attention_core_flops_per_token(cfg)


def attention_core_flops_per_token(cfg: ModelConfig) -> float:
    """The attention core's forward FLOPs per token over the full s × s: QKᵀ 2·s·a·d_qk and
    scores·V 2·s·a·d_v — 4·s·a·d where queries, keys and values are d wide (a latent
    attention's are d + d_r and d_v). A locally attending block (a window or chunk shorter
    than the sequence, ``ModelConfig.local_span``) counts the keys its mask keeps
    (:attr:`~paracube.config.ModelConfig.attended_keys`), as NeMo's GPT-OSS count does, in
    place of s."""
    keys = cfg.attended_keys if cfg.local_span else cfg.seq_len
    return 2 * keys * cfg.n_heads * (cfg.qk_head_dim + cfg.v_dim)


# FlashAttention runs the score matrix in tiles of queries × keys and skips a tile only when
# the mask empties it: its block sizes are 64 or 128 a side (Dao 2023, FlashAttention-2,
# §3.3), 128 for the 64–128-wide heads of today's models.
ATTENTION_TILE = 128


@lru_cache(maxsize=64)
def local_kernel_keys(seq: int, window: int = 0, chunk: int = 0) -> float:
    """Keys per query a fused kernel computes over ``seq`` tokens under a causal sliding
    window of ``window`` tokens or in chunks of ``chunk``: every 128 × 128 tile
    (:data:`ATTENTION_TILE`) the mask reaches, partly masked or not — for query tile j, the
    key tiles from the one holding its first row's earliest key (j·B − w + 1 under a
    window, the start of its chunk in chunks) up to the diagonal's; the rows after it need
    no earlier key. GPT-OSS's 128-token window computes 256 keys a query (two tiles), twice
    what its mask keeps."""
    tile = ATTENTION_TILE

    def first(j: int) -> int:  # the key tile holding query tile j's earliest key
        if window:
            return max(0, (j * tile - window + 1) // tile)
        return (j * tile // chunk) * chunk // tile

    computed = sum(j - first(j) + 1 for j in range(-(-seq // tile)))
    return computed * tile * tile / seq


# -- the model as a chain of layers (the pipeline's unit) ---------------------------------


def chain_names(cfg: ModelConfig) -> list[str]:
    """``embed, blocks.0 … blocks.L-1, norm, head`` — :meth:`GPT.layers`, by name."""
    return ["embed", *(f"blocks.{i}" for i in range(cfg.n_layers)), "norm", "head"]


def chain_params(cfg: ModelConfig) -> list[float]:
    """Parameters of each chain layer (the head counted even when tied: its stage holds a copy)."""
    return [
        embed_params(cfg),
        *(block_params(cfg.block_kind(i)) for i in range(cfg.n_layers)),
        norm_params(cfg),
        head_params(cfg),
    ]


def chain_train_flops(cfg: ModelConfig, b: int) -> list[float]:
    """Forward + backward FLOPs of each chain layer per micro-batch of b sequences (3× the
    forward): embedding and norm as their element-wise work, the head 2·h·V per token."""
    n, h = b * cfg.seq_len, cfg.hidden
    blocks = (3 * n * block_forward_flops_per_token(cfg.block_kind(i)) for i in range(cfg.n_layers))
    return [3 * n * h, *blocks, 3 * 5 * n * h, 3 * 2 * n * h * cfg.vocab_size]


def chain_saved_bytes(cfg: ModelConfig, b: int, elem: int = 4, compiled: bool = False) -> list[int]:
    """Activation bytes each chain layer keeps per micro-batch (no recomputation; the
    blocks ``compiled`` or eager, the ends eager); their sum is :func:`model_saved_bytes`."""
    n = b * cfg.seq_len
    embed, _ = end_saved_bytes(cfg, b, elem=elem)
    head = n * cfg.hidden * elem + _loss_bytes(cfg, n, elem)
    return [
        embed,
        *(
            block_saved_bytes(cfg.block_kind(i), b, elem=elem, compiled=compiled)
            for i in range(cfg.n_layers)
        ),
        _norm_bytes(cfg, n, elem),
        head,
    ]


def logit_softcap_bytes(elem: int, eager: bool) -> tuple[int, int]:
    """(forward, backward) HBM bytes per logit of Gemma 2's final soft cap c·tanh(x/c) over
    ``elem``-byte logits. Eager (as transformers' Gemma2ForCausalLM runs it): divide, tanh
    and multiply each read and write the logits (6·elem), and backward the multiply's and
    the divide's gradients each read one and write one, the tanh's reads its saved output
    too (7·elem). Fused into one kernel: the logits read and the capped ones written, and
    backward the incoming gradient and the saved tanh read and one gradient written."""
    return (6 * elem, 7 * elem) if eager else (2 * elem, 3 * elem)


def logit_softcap_saved_bytes(cfg: ModelConfig, n: int, elem: int, tp: int = 1) -> int:
    """What the final soft cap keeps for backward over n tokens: its tanh, one tensor of the
    logits' shape (this rank's 1/tp of the vocabulary) — the divide and the multiply by a
    constant keep nothing. 0 without ``logit_softcap``."""
    return n * (cfg.vocab_size // tp) * elem if cfg.logit_softcap else 0


@lru_cache(maxsize=4096)  # the planner's search asks for a few shapes often
def end_saved_bytes(
    cfg: ModelConfig, b: int, *, elem: int = 4, tp: int = 1, sequence_parallel: bool = False
) -> tuple[int, int]:
    """(first, last) pipeline stage's bytes kept outside the blocks per micro-batch: the
    int64 token (and position) indices — under tensor parallelism also a bool per token
    outside this rank's vocabulary shard —; the final norm, the head's input (its sequence
    shard under sequence parallelism), what a final soft cap keeps
    (:func:`logit_softcap_saved_bytes`) and what the loss keeps (:func:`_loss_bytes`)."""
    n, s = b * cfg.seq_len, cfg.seq_len
    first = 8 * n + (8 * s if cfg.position == "learned" else 0) + (n if tp > 1 else 0)
    ts = tp if sequence_parallel else 1
    last = (_norm_bytes(cfg, n, elem) + n * cfg.hidden * elem) // ts + _loss_bytes(cfg, n, elem, tp)
    return first, last + logit_softcap_saved_bytes(cfg, n, elem, tp)


# -- activation bytes kept for backward -------------------------------------------------
#
# Derived op by op for paracube's block (no dropout, any dtype, fused attention that keeps
# its output and one fp32 log-sum-exp per row and query head — no s×s tensor), counting
# each storage once, as the saved-tensor counter does. ``/t_s``: divided by t under
# sequence parallelism.
#
#   attn_norm (input; LayerNorm mean, rstd)        N·h·E/t_s + 2·N·E/t_s  (RMSNorm: below)
#   qkv_proj (its input: the norm output)          N·h·E (gathered under SP)
#   attention core (q, k, v views; output; lse)    N·(q + 2·k_v)·E/t + N·q·E/t + 4·N·a/t
#   rotary positions (rotated q, k; tables)        N·(q + k_v)·E/t + s·d·E
#   with rotary positions, one more tensor of      N·q·E/t, grouped-query or not: the
#   the queries' width                             output projection's input is a copy of
#                                                  the kernel's output, which follows the
#                                                  rotated (head-major) q; without them it
#                                                  is a view (counted: groups of 1–8 heads)
#   per-head q and k norms (Qwen3's and OLMo 2's;  the normalised q and k in fp32 and, below
#   an RMSNorm over each head's d values)          fp32, the fp32 copy of its input (in fp32
#                                                  the input is the q|k|v output, kept
#                                                  already): 4·N·(q + k_v)/t, twice below
#                                                  fp32; and a fp32 rstd a head, 4·N·(a + a_kv)/t;
#                                                  without rotary positions the kernel keeps
#                                                  their outputs: N·(q + k_v)·E/t more
#   mlp_norm, up_proj                              as attn_norm, qkv_proj
#   post-norms (Gemma's post_norms: each           as attn_norm each (their inputs are the
#   sub-layer's output normed before the add)      o_proj and down_proj outputs, kept only
#                                                  by them)
#   activation (GELU: up output; SwiGLU: gate|up,  GELU 2·N·F·E/t; SwiGLU 4·N·F·E/t
#   silu(gate), product)
#
# (q = a·d, the queries' width: h unless the head size is decoupled.)
# With GELU, LayerNorm, learned positions and no TP: N·(16·h·E + 4·E + 4a) bytes, i.e.
# 32·s·b·h bytes at E = 2 against Korthikanti et al.'s 34·s·b·h for Megatron's layer
# (dropout masks, unfused attention). Selective recomputation re-runs the core from q, k, v (its
# log-sum-exp is not kept); full recomputation keeps only the block's input, N·h·E/t_s.
#
# Under torch.compile (``compiled``: the block traced by AOTAutograd and cut into forward
# and backward by its min-cut partitioner, torch/_functorch/partitioners.py
# min_cut_rematerialization_partition — inductor's partition): an op whose output only a
# fusible element-wise backward reads is recomputed there rather than kept, while one a
# matmul or the attention kernel reads in backward is kept (is_materialized_backwards bans
# its recomputation). Counted on paracube's block, that changes two rows:
#
#   RMSNorm                                        its input and fp32 rstd: N·h·E + 4·N
#                                                  (the fp32 copies are recomputed)
#   activation (SwiGLU)                            gate|up and the product: 3·N·F·E/t
#                                                  (silu(gate) is recomputed)
#
# LayerNorm and GELU keep what they keep eager; the per-head q and k norms their fp32 rstd
# alone (their input is the q|k|v output, kept already). A fully recomputed block keeps its input,
# as eager, and per block the rotary tables and the random-number state its checkpoint
# restores — bytes that do not grow with the tokens.


@lru_cache(maxsize=4096)  # the planner's search asks for a few shapes often
def block_saved_bytes(
    cfg: ModelConfig,
    b: int,
    *,
    elem: int = 4,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    seq: int | None = None,
    etp: int | None = None,
    compiled: bool = False,
) -> int:
    """Bytes one block keeps for backward per micro-batch of ``b`` sequences of ``seq``
    (default ``cfg.seq_len``) tokens (a mixture's experts split over ``etp`` ranks; None:
    tp); ``compiled``: the block under torch.compile, kept whole or fully recomputed (the
    table above)."""
    s = seq or one_kind(cfg).seq_len
    n = b * s
    h = cfg.hidden
    ts = tp if sequence_parallel else 1
    if recompute == "full":
        return n * h * elem // ts
    if compiled and recompute != "none":
        raise ConfigError(
            f"recompute={recompute!r} under torch.compile is not counted: a compiled block is "
            "counted kept whole (none) or fully recomputed (full)"
        )
    if recompute == "op":  # torchtitan's op-level policy (op_checkpoint_linears)
        return op_checkpoint_saved_bytes(cfg, n, elem, tp, ts)
    norms = cfg.block_norms * _norm_bytes(cfg, n, elem, compiled) // ts
    norm_outputs = 2 * n * h * elem // ts  # kept by qkv_proj and up_proj (their shards under SP)
    if cfg.mla:  # latent attention: its own count (the rotary parts' copies not told apart)
        attention = latent_attention_saved_bytes(cfg, n, elem, tp, ts, recompute)
    else:
        attention = _attention_saved_bytes(cfg, n, elem, tp, recompute, compiled)
    kept = 2 if cfg.activation != "swiglu" else 3 if compiled else 4  # widths of F (above)
    mlp = kept * n * cfg.ffn_hidden * elem // tp
    if cfg.moe:  # k experts' rows, the routing's, and the shared experts' as a dense MLP's
        mlp = mlp * cfg.experts_per_token + moe_routing_bytes(cfg, n, elem, tp, ts, etp)
        mlp += kept * n * cfg.shared_expert_ffn * elem // tp
    return norms + norm_outputs + attention + mlp


def latent_attention_saved_bytes(
    cfg: ModelConfig,
    n: int,
    elem: int,
    tp: int,
    ts: int,
    recompute: str,
    linear_in: int = 0,
    modules: tuple[str, ...] = ("core_attn",),
) -> int:
    """Bytes a latent attention keeps for backward for ``n`` tokens: the q and kv latents
    — each RMSNorm's input and fp32 rstd, its output the up projection's input
    (``linear_in`` bytes a value; 0: ``elem``), sequence shards under sequence parallelism —
    and the rotary key every head shares; the kernel's q and k (d + d_r a head), v and
    output (d_v), and its fp32 log-sum-exp, this rank's a/tp heads. A selective
    recomputation of ``modules`` (choices.RECOMPUTE_MODULES) drops the log-sum-exp (the
    core's, core_attn) and the kernel's q, k and v (the up projections', mla_up_proj: made
    again from the latents for the core's backward; its output stays, the output
    projection's input). What the down projections keep is the norm's output, counted with
    the block's norms."""
    a, rope = cfg.n_heads, cfg.rope_head_dim
    linear_in = linear_in or elem
    latents = sum(
        n * width * (elem + linear_in) + 4 * n
        for width in (cfg.q_lora_rank, cfg.kv_lora_rank)
        if width
    )
    selective = recompute == "selective"
    up_proj_redone = selective and "mla_up_proj" in modules
    kernel = n * a * ((0 if up_proj_redone else 2 * cfg.qk_head_dim + cfg.v_dim) + cfg.v_dim) * elem
    lse = 0 if selective and "core_attn" in modules else 4 * n * a
    return (latents + n * rope * elem) // ts + (kernel + lse) // tp


def _attention_saved_bytes(
    cfg: ModelConfig, n: int, elem: int, tp: int, recompute: str, compiled: bool
) -> int:
    """Bytes the block's attention keeps for backward for ``n`` tokens (the table above)."""
    a, q, kv = cfg.n_heads, cfg.q_dim, kv_dim(cfg)
    attention = n * (q + 2 * kv) * elem // tp + n * q * elem // tp
    if recompute != "selective":
        attention += 4 * n * a // tp  # the fused kernel's fp32 log-sum-exp
        if cfg.position == "rope":  # one more tensor of the queries' width (table above)
            attention += n * q * elem // tp
    if cfg.position == "rope":
        attention += n * (q + kv) * elem // tp + rotary_table_bytes(cfg, elem)
    if cfg.qk_norm:  # an RMSNorm over each q and k head (table above): a rstd per head
        width = (q + kv) // tp
        if not compiled:  # the normalised values in fp32; below fp32, the input's fp32 copy
            attention += 4 * n * width * (2 if elem < 4 else 1)
        attention += 4 * n * (a + cfg.n_kv_heads) // tp
        if cfg.position != "rope":  # the kernel keeps the norms' outputs, not rotated copies
            attention += n * width * elem
    return attention


def rotary_table_bytes(cfg: ModelConfig, elem: int) -> int:
    """The cos and sin tables (each s × d/2) a rotary block keeps for backward: its own
    buffers, so one storage however many micro-batches the block holds at once (0 without
    rotary positions)."""
    rotated = cfg.rope_head_dim if cfg.mla else cfg.head_dim  # a latent attention's d_r
    return cfg.seq_len * rotated * elem if cfg.position == "rope" else 0


# -- element-wise traffic of a block run as eager PyTorch ops ---------------------------
#
# Eager, every op outside the matmuls and the attention kernel is a kernel of its own that
# reads its inputs from HBM and writes its output back; the bytes below are those reads and
# writes, op by op, for paracube's block as torch's autograd runs it (per token; E the
# element size, F the MLP width; /t: a tensor-parallel shard; rows outside the TP region —
# the norms, the residual adds — are the N/t_s tokens a rank holds under sequence
# parallelism). Measured against torch's dispatcher in tests/test_eager_traffic.py.
#
#   op                        forward                     backward
#   RMSNorm over w (fp32      w·(28 + 2(E+4)) + 24        w·(96 + 2(E+4)) + 36
#   compute, composite: the   (fp32: 28·w + 24)           (fp32: 96·w + 36)
#   upcast, pow, mean, rsqrt,
#   two muls, the downcast)
#   LayerNorm (one kernel)    2·E·h + 2·E                 3·E·h + 2·E
#   rotary over w = q or k_v  9·E·w (4 muls, sub, add,    14·E·w (4 muls, neg, 2 adds,
#                             the pair stack)             2 slice-backwards, their sum)
#                             + the cos/sin tables, 2·s·d·E a call, each way
#   head-major q, k back to   —                           2·E·(q + k_v)  (with rotary;
#   token-major                                           not a rank's single head)
#   q|k|v split               —                           2·E·(q + 2·k_v)  (the grads' cat)
#   residual adds (2)         2 · 3·E·h                   2 · 3·E·h
#   SwiGLU (silu, product)    5·E·F                       13·E·F (2 muls, silu_backward,
#                                                         the gate|up cat)
#   GELU                      2·E·F                       3·E·F
#   biases (their grads:      —                           E·(q + 2·k_v + F_in + 2·h)
#   a sum over the tokens)                                (qkv_bias alone: E·(q + 2·k_v))
#   per-head q, k norms       the RMSNorm rows over d, N·(a + a_kv)/t of them
#
# A fused block (Transformer Engine, FlashAttention's fused kernels, torch.compile) reads
# and writes far less: the time model then charges what the block keeps for backward
# (time_model.elementwise_times).


def _rmsnorm_traffic(rows: int, width: int, elem: int) -> tuple[int, int]:
    """(forward, backward) bytes of an eager RMSNorm over ``rows`` × ``width`` (table above;
    the d-wide weight's reads and its gradient's sum are per call, counted too)."""
    upcast = 2 * (elem + 4) * width if elem < 4 else 0  # the fp32 copy in, the result out
    forward = rows * (28 * width + upcast + 24) + elem * width
    backward = rows * (96 * width + upcast + 36) + (2 * elem + 8 if elem < 4 else 8) * width
    return forward, backward


def eager_elementwise_bytes(
    cfg: ModelConfig, n: int, *, elem: int = 2, tp: int = 1, sequence_parallel: bool = False
) -> tuple[int, int]:
    """(forward, backward) HBM bytes one dense block's element-wise ops move for a
    micro-batch of ``n`` tokens when it runs eager, one kernel per op (the table above)."""
    if one_kind(cfg).moe or cfg.mla:
        raise ConfigError(
            "eager element-wise traffic is counted for dense blocks: a mixture's routing and "
            "permutation are not; plan it with elementwise='fused'"
        )
    E, h, t = elem, cfg.hidden, tp
    ts = tp if sequence_parallel else 1
    rows = n // ts  # tokens outside the tensor-parallel region
    q, kv, F = cfg.q_dim // t, kv_dim(cfg) // t, cfg.ffn_hidden // t
    fwd = bwd = 0
    for _ in range(cfg.block_norms):  # attn_norm, mlp_norm (and the post-norms)
        if cfg.norm == "rmsnorm":
            f, b = _rmsnorm_traffic(rows, h, E)
        else:
            # one kernel each way; its mean and rstd a row; weight and bias read (and in
            # backward their gradients written) once a call
            f, b = rows * (2 * E * h + 2 * E) + 2 * E * h, rows * (3 * E * h + 2 * E) + 4 * E * h
        fwd, bwd = fwd + f, bwd + b
    fwd, bwd = fwd + 2 * rows * 3 * E * h, bwd + 2 * rows * 3 * E * h  # residual adds
    if cfg.qk_norm:  # q_norm over the query heads, k_norm over the key heads
        for width in (q, kv):
            f, b = _rmsnorm_traffic(n * width // cfg.head_dim, cfg.head_dim, E)
            fwd, bwd = fwd + f, bwd + b
    if cfg.position == "rope":
        tables = 2 * 2 * cfg.seq_len * cfg.head_dim * E  # 4 muls a width, q's and k's
        fwd += n * 9 * E * (q + kv) + tables
        bwd += n * 14 * E * (q + kv) + tables
        # the rotated q and k grads, head-major, copied back to token-major — unless a rank
        # holds one head of them (Llama 3 70B's 8 key heads at TP 8), whose transpose is a view
        bwd += n * 2 * E * sum(w for w in (q, kv) if w > cfg.head_dim)
    bwd += n * 2 * E * (q + 2 * kv)  # the q|k|v split's backward: one cat of the grads
    if cfg.activation == "swiglu":
        fwd, bwd = fwd + n * 5 * E * F, bwd + n * 13 * E * F
    else:
        fwd, bwd = fwd + n * 2 * E * F, bwd + n * 3 * E * F
    if cfg.attention_biased:  # each bias's gradient, a sum over the tokens of its output's
        # gradient: q, k and v's, and under bias (not qkv_bias alone) the MLP's column bias
        # and the two row-parallel ones (o and down, over the rows outside the TP region)
        widths = q + 2 * kv + (mlp_in_width(cfg) // t if cfg.bias else 0)
        outer = 2 * h if cfg.bias else 0
        bwd += n * E * widths + rows * E * outer + E * (widths + outer)
    return fwd, bwd


def moe_routing_bytes(
    cfg: ModelConfig,
    n: int,
    elem: int,
    tp: int = 1,
    ts: int = 1,
    etp: int | None = None,
    input_elem: int | None = None,
) -> int:
    """What a mixture's routing keeps for backward for n tokens of a rank, beside its
    experts' activations (k × a dense MLP's: every routed token one MLP's rows). Derived for
    Megatron-Core's MoELayer with the all-to-all token dispatcher
    (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher): the
    router, on the rank's sequence shard (1/ts of the tokens), keeps its input — the norm
    output, already counted as the dense MLP's up projection's — its fp32 softmax over the
    E experts and the boolean routing map; the dispatcher turns the shard into every
    token's 1/tp slice of the hidden vector (all_to_all_sp2hp), sends the k·n slices to
    the experts' ranks and all-gathers them whole (all_gather_last_dim_from_tensor_parallel
    _region): the k·n rows the experts' up projections keep; on the way back the combine
    weighs the k·n slices it receives (1/tp of each vector) by their fp32 probabilities,
    keeping both. Folded at ``etp`` 1 (None: tp), the rank's sequence shard is dispatched
    whole: the experts keep its k·n/tp rows, and the combine weighs as many whole vectors.
    The experts' first linear keeps its input in ``input_elem`` bytes (None: ``elem``; 1
    under FP8, Transformer Engine's saved FP8 copy, as a dense linear's)."""
    k, e, h = cfg.experts_per_token, cfg.experts, cfg.hidden
    router = (n * e * 4 + n * e) // ts
    kept = elem if input_elem is None else input_elem
    inputs = k * n * h * kept * (tp if etp is None else etp) // tp
    return router + inputs + k * n * h * elem // tp + 4 * k * n


def op_checkpoint_saved_bytes(cfg: ModelConfig, n: int, elem: int, tp: int, ts: int) -> int:
    """What a block under torchtitan's op-level selective checkpointing keeps for n tokens:
    its input (the checkpoint's), the outputs of the matmuls it does not redo (each a
    column-parallel shard, or a row-parallel layer's whole partial sum) and the attention
    kernel's — its output and fp32 log-sum-exp. Everything else (the norms, rotary, the
    activation, the redone matmuls, the kernel's q, k and v) is recomputed in backward."""
    saved = n * cfg.hidden * elem // ts  # the block's input
    for lin, kept, _ in op_checkpoint_linears(cfg):
        if kept:
            width = lin.out_features // tp if lin.split == "column" else lin.out_features
            saved += n * width * elem
    return saved + n * cfg.q_dim * elem // tp + 4 * n * cfg.n_heads // tp


def model_saved_bytes(
    cfg: ModelConfig,
    b: int,
    *,
    elem: int = 4,
    recompute: str = "none",
    recompute_blocks: int | None = None,
    compiled: bool = False,
) -> int:
    """The whole single-stage, tp = 1 model per micro-batch: the blocks (the first
    ``recompute_blocks`` of them recomputed; ``compiled``: torch.compile'd), token indices
    (int64), the final norm and the head's input, and what the loss keeps."""
    chosen = cfg.n_layers if recompute_blocks is None else recompute_blocks
    chain = chain_saved_bytes(cfg, b, elem, compiled)
    recomputed = block_saved_bytes(cfg, b, elem=elem, recompute=recompute, compiled=compiled)
    return sum(chain) + chosen * (recomputed - chain[1])


def _loss_bytes(cfg: ModelConfig, n: int, elem: int, tp: int = 1) -> int:
    """The loss keeps an fp32 log-softmax and its int64 targets (a tensor of their own),
    and the total weight; the vocabulary-parallel loss (tp > 1) its fp32 probabilities over
    this rank's 1/tp of the vocabulary, the shard-local int64 targets and a bool per token
    whose target lies outside the shard."""
    kept = n * cfg.vocab_size // tp * max(elem, 4) + 8 * n
    return kept + (4 if tp == 1 else n)


def loss_backward_transient_bytes(cfg: ModelConfig, b: int, tp: int = 1) -> int:
    """Bytes the loss's backward holds beside everything saved, at the step's memory peak
    (the end of forward, every activation still kept): two fp32 tensors of the logits'
    shape while the saved log-softmax (or softmax) is alive — 2·n·V/tp·4 bytes. Serial
    (torch's cross-entropy): the gradient of its nll, then from it the log-softmax's input
    gradient; on an H200 the CUDA allocator's peak of GPT-3 1.3B (micro-batch 8 and 4 ×
    2048, every recompute mode, bf16 and fp32) was the counted states and activations plus
    this, within 67 MiB (cuBLAS's workspace). Vocabulary-parallel (tp > 1,
    :mod:`paracube.tensor_parallel.loss`): the softmax's clone the target is subtracted
    from, then its product with the incoming gradient, each over this rank's shard of the
    vocabulary padded to divide by tp. (Megatron's fused loss computes in place instead.)"""
    shard = -(-cfg.vocab_size // tp)
    return 2 * b * cfg.seq_len * shard * 4


def _norm_bytes(cfg: ModelConfig, n: int, elem: int, compiled: bool = False) -> int:
    """What one norm over n tokens keeps: LayerNorm its input and mean/rstd (input dtype);
    RMSNorm, composed of elementary ops that compute in fp32, the input it computes from
    (below fp32 its fp32 copy, not the input), the normalised x before the scale (fp32) and
    an fp32 rstd — 8·n·h + 4·n bytes in fp32 and below it alike — compiled, its input and
    the rstd alone (the rest is recomputed in backward)."""
    h = cfg.hidden
    if cfg.norm == "layernorm":
        return n * h * elem + 2 * n * elem
    if compiled:
        return n * h * elem + 4 * n
    return 2 * n * h * elem + 4 * n + (n * h * 4 if elem < 4 else 0)
