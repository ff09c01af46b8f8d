"""FLOPs and training-time formulas for GPT-style decoders (docs/formulas.md)."""

from __future__ import annotations

import functools

from paracube.models import shapes


def narayanan_params(l: int, h: int, V: int, s: int) -> float:
    """Narayanan et al. 2021 (SC21), Eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def flops_with_full_recompute(B: int, s: int, l: int, h: int, V: int) -> float:
    """SC21 Eq. 3, FLOPs per iteration with full activation recomputation:
    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def model_flops(B: int, s: int, L: int, h: int, v: int) -> float:
    """Korthikanti et al. 2022, Eq. 7 — model FLOPs per iteration, no recomputation:
    72·B·L·s·h²·(1 + s/(6h) + v/(12·h·L)). MFU = model FLOPs / (time × peak)."""
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def hardware_flops_selective(B: int, s: int, L: int, h: int, v: int) -> float:
    """Korthikanti et al. 2022: with selective recompute, 72·B·L·s·h²·(1 + s/(3h) + v/(12·h·L))."""
    return 72 * B * L * s * h * h * (1 + s / (3 * h) + v / (12 * h * L))


def forward_flops_per_token(cfg, *, layers: bool = True, head: bool = True) -> float:
    """Forward matmul FLOPs per token for a model's actual shapes: 2·(block matrices) per
    layer, the attention core 4·s·(a·d) per layer (QKᵀ and scores·V, counted over the full
    s×s as the published formulas do), the head 2·h·V. For GPT shapes (4h MLP, MHA) three
    times this is Korthikanti's Eq. 7 per token exactly (tested). A model with dense blocks
    among its mixture's: each kind's blocks at their own count; multi-token prediction
    modules, whole (:func:`mtp_flops_per_token`)."""
    blocks = per_block(cfg, shapes.block_forward_flops_per_token)
    head_flops = 2 * cfg.hidden * cfg.vocab_size
    return (blocks if layers else 0.0) + (head_flops if head else 0.0) + mtp_flops_per_token(cfg)


def mtp_flops_per_token(cfg) -> float:
    """Forward FLOPs per token of the multi-token prediction modules (0 without them): each
    one's 2h → h projection, its block (the last block's kind) and the shared head again —
    counted in the model's FLOPs, as Megatron-Core counts them."""
    last = cfg.block_kind(cfg.n_layers - 1)
    one = 2 * 2 * cfg.hidden * cfg.hidden + shapes.block_forward_flops_per_token(last)
    return cfg.mtp_layers * (one + 2 * cfg.hidden * cfg.vocab_size)


def per_block(cfg, figure) -> float:
    """``figure`` (a function of a uniform model: one block's) summed over the model's
    blocks, each at its own kind (:meth:`~paracube.config.ModelConfig.kind_counts`)."""
    return sum(n * figure(kind) for kind, n in cfg.kind_counts())


def model_flops_per_token(cfg) -> float:
    """Model FLOPs per token trained (forward + backward = 3 × forward): MFU's numerator."""
    return 3 * forward_flops_per_token(cfg)


@functools.lru_cache(maxsize=1 << 12)  # the search asks for it for every candidate layout
def hardware_flops_per_token(
    cfg,
    recompute: str,
    share: float = 1.0,
    replay: str = "whole",
    modules: tuple[str, ...] = ("core_attn",),
) -> float:
    """FLOPs the GPUs execute per token: the model FLOPs plus the recomputed forward — every
    block under full recomputation (SC21 Eq. 3 for GPT shapes; less each block's last
    matmul, the MLP's down projection, when the checkpoint stops early: ``replay``
    "early-stop", choices.RECOMPUTE_REPLAY), what a selective recomputation's ``modules``
    run again (the attention core, the linears of Megatron's other modules), the matmuls
    torchtitan's op-level checkpointing does not keep (op); ``share`` of the blocks under
    --recompute-blocks. HFU's numerator."""
    if recompute == "selective":
        return model_flops_per_token(cfg) + share * _selective_flops(cfg, modules)
    return model_flops_per_token(cfg) + share * RECOMPUTED_FORWARD[recompute](cfg, replay)


def _selective_flops(cfg, modules: tuple[str, ...]) -> float:
    """Forward FLOPs per token a selective recomputation of ``modules`` runs again."""
    core = (
        cfg.n_layers * shapes.attention_core_flops_per_token(cfg) if "core_attn" in modules else 0
    )
    return core + per_block(
        cfg,
        lambda kind: (
            sum(
                2 * lin.in_features * lin.out_features
                for lin in shapes.selectively_redone_linears(kind, modules)
            )
            + (2 * shapes.moe_layer_active_params(kind) if "moe" in modules else 0)
        ),
    )


def _full_replay_flops(cfg, replay: str) -> float:
    """Every block's forward again — less, per block, the down projection a checkpoint that
    stops early does not replay (a token passes k experts' down projections, and the shared
    experts')."""

    def unreplayed(kind) -> float:
        down = shapes.block_linears(kind)[-1]
        shared_down = shapes.shared_linears(kind)[1:]
        return 2 * down.in_features * down.out_features * shapes.mlp_passes(kind) + sum(
            2 * lin.in_features * lin.out_features for lin in shared_down
        )

    skipped = per_block(cfg, unreplayed) if replay == "early-stop" else 0.0
    return per_block(cfg, shapes.block_forward_flops_per_token) - skipped


def _op_redone_flops(cfg) -> float:
    """One block's forward FLOPs per token of the matmuls torchtitan's op-level
    checkpointing runs again (those whose outputs it does not keep)."""
    return 2 * sum(
        lin.in_features * lin.out_features
        for lin, _, redone in shapes.op_checkpoint_linears(cfg)
        if redone
    )


# the forward FLOPs per token each recomputation runs again, (cfg, replay) → FLOPs (a
# selective one's by its modules: _selective_flops)
RECOMPUTED_FORWARD = {
    "none": lambda cfg, replay: 0.0,
    "full": _full_replay_flops,
    "op": lambda cfg, replay: per_block(cfg, _op_redone_flops),
}


def training_days(tokens: float, params: float, gpus: int, flops_per_gpu: float) -> float:
    """SC21 Eq. 4: end-to-end time ≈ 8·T·P / (n·X) seconds (with recomputation), in days."""
    return 8 * tokens * params / (gpus * flops_per_gpu) / 86400
