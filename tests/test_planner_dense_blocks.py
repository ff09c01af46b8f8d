"""A mixture with dense blocks among its mixture ones (ModelConfig.dense_layers: DeepSeek-V3's
and GLM-4.5's first blocks, Qwen-MoE's mlp_only_layers), planned as the sum of its two kinds
of block: parameters, FLOPs, step time and memory — each derived here from the two uniform
models, one of every block a mixture's and one of every block dense (pure)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from paracube.cli import main
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.planner import hardware as hw
from paracube.planner.flops import model_flops_per_token
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory, stage_memory
from paracube.planner.time_model import Cluster, estimate

H100 = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))

L, K = 8, 2  # blocks, of them dense (the first two)
MIXED = ModelConfig(
    n_layers=L, hidden=1024, n_heads=16, vocab_size=32000, seq_len=2048, ffn_hidden=512,
    activation="swiglu", norm="rmsnorm", position="rope", bias=False, experts=16,
    experts_per_token=4, shared_expert_ffn=512, dense_layers=tuple(range(K)), dense_ffn=1024,
)  # fmt: skip
MIXTURE = MIXED.mixture_kind  # every block the mixture's
DENSE = MIXED.dense_kind  # every block dense, an MLP of dense_ffn


def between(mixture: float, dense: float) -> float:
    """A figure linear in the blocks, for L − K mixture blocks and K dense ones."""
    return ((L - K) * mixture + K * dense) / L


def test_the_kinds_are_the_model_with_one_kind_of_block():
    assert (MIXTURE.moe, MIXTURE.ffn_hidden, MIXTURE.shared_expert_ffn) == (True, 512, 512)
    assert (DENSE.moe, DENSE.ffn_hidden, DENSE.shared_expert_ffn) == (False, 1024, 0)
    assert [(kind.moe, n) for kind, n in MIXED.kind_counts()] == [(True, L - K), (False, K)]
    assert MIXED.block_kind(0) == DENSE and MIXED.block_kind(K) == MIXTURE
    # a checkpoint's header gives the config back through JSON: the same model
    assert ModelConfig(**json.loads(json.dumps(dataclasses.asdict(MIXED)))) == MIXED
    # PowerSGD's rank bound (--compress) is the smallest matrix of either kind
    assert shapes.smallest_matrix_dim(MIXED, 2) == min(
        shapes.smallest_matrix_dim(MIXTURE, 2), shapes.smallest_matrix_dim(DENSE, 2)
    )
    # a per-block figure of a model of two kinds is asked per kind, never of the whole
    with pytest.raises(ConfigError, match="blocks are of more than one kind"):
        shapes.block_params(MIXED)


def test_parameters_and_flops_are_each_kinds_at_its_count():
    """Everything outside the blocks is alike in the three models, so a figure linear in
    the blocks is the mixed model's at K/L of the way from the mixture to the dense model."""
    for figure in (shapes.parameter_count, model_flops_per_token):
        assert figure(MIXED) == pytest.approx(between(figure(MIXTURE), figure(DENSE)), rel=1e-12)
    # the engine's split weighs each block at its own kind
    params = shapes.chain_params(MIXED)[1:-2]
    assert params == [shapes.block_params(DENSE)] * K + [shapes.block_params(MIXTURE)] * (L - K)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(micro_batch=2, microbatches=4),
        Layout(tp=2, sequence_parallel=True, micro_batch=1, microbatches=8, recompute="full"),
        Layout(micro_batch=4, microbatches=2, zero=1),
    ],
)
def test_one_rank_steps_and_holds_each_kinds_blocks(layout):
    """On one rank (one pipeline stage, no data parallelism) the step — compute,
    recomputation, tensor-parallel collectives, the optimizer — and the memory — model
    states, what the blocks keep, the allowance — are linear in the blocks: the mixed
    model's are K/L of the way from the mixture's to the dense model's."""
    mixed, mixture, dense = (estimate(c, layout, H100) for c in (MIXED, MIXTURE, DENSE))
    for part in ("compute", "recompute", "tp_comm", "optimizer", "step_time"):
        want = between(getattr(mixture, part), getattr(dense, part))
        assert getattr(mixed, part) == pytest.approx(want, rel=1e-9), part
    assert mixture.step_time > mixed.step_time > dense.step_time  # the mixture's blocks cost more
    memory = [peak_memory(c, layout) for c in (MIXED, MIXTURE, DENSE)]
    for part in ("model_states", "activations", "allowance", "total"):
        want = between(getattr(memory[1], part), getattr(memory[2], part))
        assert getattr(memory[0], part) == pytest.approx(want, rel=1e-9), part


def test_a_pipeline_rank_holds_its_own_blocks_kinds():
    """Megatron's even split puts blocks 0–3 on the first rank and 4–7 on the last: the
    first holds the two dense blocks — its states and activations halfway between the
    mixture's first rank's and the dense model's —, the last only mixture blocks, as the
    mixture's last rank; the step is the busiest rank's, the last (the mixture blocks and
    the head), so the dense blocks do not speed it up."""
    layout = Layout(dp=2, pp=2, ep=2, micro_batch=1, microbatches=8, split="even")
    first, last = stage_memory(MIXED, layout)
    # expert parallelism moves no dense block's bytes (no ZeRO here: nothing is sharded)
    mixture = stage_memory(MIXTURE, layout)
    dense = stage_memory(DENSE, dataclasses.replace(layout, ep=1))
    for part in ("model_states", "activations"):
        halfway = (getattr(mixture[0], part) + getattr(dense[0], part)) / 2
        assert getattr(first, part) == pytest.approx(halfway, rel=1e-9)
        assert getattr(last, part) == pytest.approx(getattr(mixture[1], part), rel=1e-9)
    mixed_step, mixture_step = estimate(MIXED, layout, H100), estimate(MIXTURE, layout, H100)
    assert mixed_step.compute == pytest.approx(mixture_step.compute, rel=1e-9)
    # every rank reduces its own gradients: the last rank's are the mixture's last rank's
    assert mixed_step.dp_exposed == pytest.approx(mixture_step.dp_exposed, rel=1e-9)
    # 1F1B idles (p − 1)/m of the busiest rank's work: the same rank, the same bubble
    assert mixed_step.bubble == pytest.approx(mixture_step.bubble, rel=1e-9)


def test_recomputed_blocks_are_counted_at_their_own_kind():
    """--recompute-blocks 3 recomputes blocks 0–2: the two dense ones and one of the
    mixture's — its recomputation is two dense blocks' forward and one mixture block's."""
    base = Layout(micro_batch=1, microbatches=4, recompute="full")
    some = dataclasses.replace(base, recompute_blocks=3)
    per_block = {c.moe: estimate(c, base, H100).recompute / L for c in (MIXTURE, DENSE)}
    assert estimate(MIXED, some, H100).recompute == pytest.approx(
        K * per_block[False] + (3 - K) * per_block[True], rel=1e-9
    )


def test_bad_dense_blocks_are_refused():
    cfg = dict(n_layers=4, hidden=64, n_heads=4, vocab_size=100, seq_len=32)
    moe = dict(cfg, experts=4, experts_per_token=2)
    for fields, message in [
        (dict(cfg, dense_layers=(0,)), "dense_layers without experts"),
        (dict(moe, dense_layers=(4,)), r"dense_layers=\(4,\): give the dense blocks' indices"),
        (dict(moe, dense_layers=(1, 0)), "in increasing order, each once"),
        (dict(moe, dense_layers=(0, 1, 2, 3)), "names all 4 blocks: that is a dense model"),
        (dict(moe, dense_ffn=128), "dense_ffn=128 without dense_layers"),
        (dict(moe, dense_layers=(0,), dense_ffn=-1), "dense_ffn=-1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(**fields)


def test_plan_takes_first_dense_blocks_and_emits_megatrons_layer_pattern(capsys):
    """``--first-dense-blocks K --dense-ffn F`` plans the mixed model; its Megatron command
    gives the dense MLP's width as --ffn-hidden-size, the experts' as --moe-ffn-hidden-size
    and the blocks' kinds as --moe-layer-freq (1 a mixture's block, 0 a dense one);
    ``--mtp-layers 1`` adds a multi-token prediction module, which --explain places."""
    argv = ["plan", "--layers", "8", "--hidden", "1024", "--heads", "16", "--vocab", "32000",
            "--seq", "2048", "--ffn", "512", "--experts", "16", "--experts-per-token", "4",
            "--first-dense-blocks", "2", "--dense-ffn", "1024", "--activation", "swiglu",
            "--norm", "rmsnorm", "--position", "rope", "--gpus", "16", "--gpu", "h100",
            "--global-batch", "64"]  # fmt: skip
    emitted = ["--layout", "dp=4,tp=2,pp=2,ep=2", "--stack", "megatron-core", "--emit", "megatron"]
    assert main([*argv, *emitted, "--mtp-layers", "1", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "--mtp-num-layers 1" in out
    assert (
        "1 multi-token prediction module on the last stage" in out
        and "copy of the embedding" in out
    )
    assert "--ffn-hidden-size 1024" in out and "--moe-ffn-hidden-size 512" in out
    assert "--moe-layer-freq '([0]*2+[1]*6)'" in out
    assert "blocks 0–1 dense (one MLP of 1,024" in out
    # a dense MLP split by tp: its width must divide as the experts' does
    odd = [a if argv[i - 1] != "--dense-ffn" else "1001" for i, a in enumerate(argv)]
    assert main([*odd, "--layout", "tp=2"]) == 2
    assert "heads or MLP size not divisible by tp" in capsys.readouterr().err


# GLM-4.5-Air's and GLM-4.5's shapes as THUDM/slime's Megatron scripts give them
# (scripts/models/glm4.5-106B-A12B.sh, glm4.5-355B-A32B.sh), in transformers' glm4_moe keys
GLM45_AIR = {
    "model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "vocab_size": 151552, "max_position_embeddings": 131072, "hidden_act": "silu",
    "attention_bias": True, "use_qk_norm": False, "tie_word_embeddings": False,
    "rope_theta": 1000000.0, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
    "num_nextn_predict_layers": 0,
}  # fmt: skip
GLM45 = {**GLM45_AIR, "hidden_size": 5120, "intermediate_size": 12288,
         "moe_intermediate_size": 1536, "num_hidden_layers": 92, "n_routed_experts": 160,
         "first_k_dense_replace": 3, "use_qk_norm": True}  # fmt: skip


def test_glm45_configs_are_planned_with_their_dense_first_blocks(tmp_path, capsys):
    """GLM-4.5's model card: "355 billion total parameters and 32 billion active
    parameters", GLM-4.5-Air "106 billion total parameters and 12 billion active" — the
    active count without the embedding and the head, as the blocks pass them. Read from
    their configs (the first 3 and 1 blocks dense) the planner counts them within 1 %
    (total) and to the billion (active), without the multi-token prediction module the
    published configs carry — which, given, adds its block of the mixture's kind, its
    projection and norms; import refuses a mixture."""
    from paracube.models.hf_convert import imported_config
    from paracube.models.sources import hf_model_config, read_hf_config

    for config, total, active, dense in ((GLM45_AIR, 106, 12, 1), (GLM45, 355, 32, 3)):
        (tmp_path / "config.json").write_text(json.dumps(config))
        cfg = hf_model_config(read_hf_config(str(tmp_path)), 4096)
        assert cfg.dense_layers == tuple(range(dense))
        assert cfg.shared_expert_ffn == config["moe_intermediate_size"]
        assert math.isclose(shapes.parameter_count(cfg) / 1e9, total, rel_tol=0.01)
        blocks = sum(
            n * (shapes.block_active_matrix_params(kind) + 2 * shapes.norm_params(kind))
            for kind, n in cfg.kind_counts()
        )
        assert round(blocks / 1e9) == active
    (tmp_path / "config.json").write_text(json.dumps(GLM45_AIR))
    argv = ["plan", "--model", f"hf:{tmp_path}", "--seq", "4096", "--gpus", "64", "--gpu",
            "h100", "--global-batch", "512", "--layout", "pp=4,ep=8", "--micro-batch", "1",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]["layout"]
    assert best["ep"] > 1
    (tmp_path / "config.json").write_text(json.dumps({**GLM45, "num_nextn_predict_layers": 1}))
    with_mtp = hf_model_config(read_hf_config(str(tmp_path)), 4096)
    h, mixture = 5120, with_mtp.mixture_kind
    module = shapes.block_params(mixture) + 2 * h * h + 3 * shapes.norm_params(mixture)
    assert shapes.parameter_count(with_mtp) - shapes.parameter_count(cfg) == module
    with pytest.raises(ConfigError, match="glm4_moe cannot be paracube's GPT"):
        imported_config(GLM45)


# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3), the keys that shape the model; its
# multi-token prediction layer set to 0 (planned without it; refused as published)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "n_group": 8, "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "num_nextn_predict_layers": 0,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}  # fmt: skip
# Kimi K2's (moonshotai/Kimi-K2-Instruct): DeepSeek-V3's architecture, 64 heads, 384
# experts in one group, one dense block; no multi-token prediction layer
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "num_attention_heads": 64,
           "num_key_value_heads": 64, "n_routed_experts": 384, "first_k_dense_replace": 1,
           "n_group": 1, "topk_group": 1, "vocab_size": 163840,
           "rope_theta": 50000.0, "routed_scaling_factor": 2.827}  # fmt: skip
# DeepSeek-V2-Lite's (deepseek-ai/DeepSeek-V2-Lite): no query latent (q_lora_rank null)
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
}  # fmt: skip


def active_without_ends(cfg: ModelConfig) -> float:
    """The parameters a token passes in the blocks (k experts, the shared ones, every norm)."""
    return sum(
        n * (shapes.block_active_matrix_params(k) + 2 * shapes.norm_params(k)
             + shapes.latent_norm_params(k))
        for k, n in cfg.kind_counts()
    )  # fmt: skip


def test_latent_attention_models_count_as_published(tmp_path):
    """DeepSeek-V3: "671B total parameters with 37B activated for each token" (DeepSeek-AI
    2024, abstract; its multi-token prediction module apart). Kimi K2: "32 billion activated
    parameters and 1 trillion total parameters" (its model card; 1.04T in its report).
    DeepSeek-V2-Lite: "15.7B parameters, 2.4B activated" (its model card). Read from their
    configs — a latent attention, dense first blocks, shared experts — the planner counts
    them so: the totals within 1 % of the figure (5 % of Kimi K2's round trillion), the
    activated ones — the blocks' and one vocabulary table, as the three published counts
    agree on — within 3 % (the cards round to the billion, or to 2.4)."""
    from paracube.models.sources import hf_model_config, read_hf_config

    for config, total, within, active in ((DEEPSEEK_V3, 671, 0.01, 37),
                                          (KIMI_K2, 1000, 0.05, 32),
                                          (DEEPSEEK_V2_LITE, 15.7, 0.01, 2.4)):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(config))
        cfg = hf_model_config(read_hf_config(str(tmp_path)), 4096)
        assert cfg.mla and cfg.dense_layers == tuple(range(config["first_k_dense_replace"]))
        assert math.isclose(shapes.parameter_count(cfg) / 1e9, total, rel_tol=within)
        table = shapes.head_params(cfg)
        assert math.isclose((active_without_ends(cfg) + table) / 1e9, active, rel_tol=0.03)


def test_a_latent_attentions_linears_and_core():
    """DeepSeek-V2 §2.1: per token the queries come down to d_c' = q_lora_rank and up to every
    head's d + d_r, the keys and values down to d_c = kv_lora_rank (and the shared rotary
    key d_r) and up to every head's d key and d_v value; the core's QKᵀ runs over d + d_r,
    its scores·V over d_v. Under tensor parallelism the down projections stay whole."""
    from paracube.models.sources import hf_model_config

    cfg = hf_model_config(DEEPSEEK_V3, 4096).mixture_kind
    h, a, d, r, v, cq, ckv = 7168, 128, 128, 64, 128, 1536, 512
    weights = h * cq + cq * a * (d + r) + h * (ckv + r) + ckv * a * (d + v) + a * v * h
    attention = sum(lin.in_features * lin.out_features for lin in shapes.attention_linears(cfg))
    assert attention == weights
    assert shapes.attention_core_flops_per_token(cfg) == 2 * 4096 * a * ((d + r) + v)
    # per tp rank the down projections and the latents' norms whole, the rest of the
    # attention split (as the experts and the shared expert are)
    split = weights - h * cq - h * (ckv + r)
    mlps = shapes.expert_params(cfg) + shapes.shared_expert_params(cfg)
    full, halves = shapes.block_params(cfg), shapes.block_params(cfg, tp=2)
    assert full - halves == pytest.approx((split + mlps) / 2, rel=1e-12)
    # what the core keeps: q and k of d + d_r, v and the output of d_v, a head each
    kept = shapes.latent_attention_saved_bytes(cfg, 1000, 2, 1, 1, "selective")
    latents = 1000 * (cq + ckv) * 4 + 2 * 4 * 1000 + 1000 * r * 2
    assert kept == latents + 1000 * a * (2 * (d + r) + 2 * v) * 2


def test_deepseek_v3_is_planned_and_emitted_for_megatron(tmp_path):
    """A DeepSeek-V3 config fits an H100 in the layout Megatron-Bridge names for 1,024 of
    them (TP 2 × PP 16 × EP 64, ``deepseek_v3_pretrain_1024gpu_h100_bf16_config``; here its
    experts folded whole, etp 1, and every block recomputed), and its Megatron command
    carries the latent attention's widths and the blocks' kinds. Its multi-token prediction
    module: "685B, which includes 671B of the Main Model weights and 14B of the Multi-Token
    Prediction (MTP) Module weights" (the model card) — its copies of the embedding and the
    head among them, which training shares with the model: counted once, the planner's
    671B + module + both tables is that 685B; the last stage carries it (more memory, more
    work) and Megatron's command says --mtp-num-layers 1. A latent attention under
    tensor parallelism without sequence parallelism is refused with the fix."""
    from paracube.models.sources import hf_model_config, read_hf_config
    from paracube.planner.megatron import megatron_args
    from paracube.planner.reasons import _architecture_reason
    from paracube.planner.stacks import stack

    cfg = hf_model_config(DEEPSEEK_V3, 4096)
    recipe = Layout(dp=32, tp=2, pp=16, ep=64, etp=1, sequence_parallel=True, micro_batch=1,
                    microbatches=256, zero=1, recompute="full")  # fmt: skip
    assert peak_memory(cfg, recipe).total < hw.gpu("h100").memory_bytes
    assert 0.05 < estimate(cfg, recipe, H100).mfu < 0.5
    # Megatron cuts its 61 blocks unevenly (a layout of its own): the flags, for one stage
    one_stage = Layout(dp=64, ep=64, tp=2, sequence_parallel=True, **stack("megatron-core"))
    args = " ".join(megatron_args(one_stage, cfg, "bf16", 64))
    assert ("--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
            "--qk-pos-emb-head-dim 64 --v-head-dim 128") in args  # fmt: skip
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in args and "--ffn-hidden-size 18432" in args
    assert "without sequence parallelism" in Layout(dp=8, tp=2).model_refusal(cfg)
    (tmp_path / "config.json").write_text(
        json.dumps({**DEEPSEEK_V3, "num_nextn_predict_layers": 1})
    )
    mtp = hf_model_config(read_hf_config(str(tmp_path)), 4096)
    tables = 2 * shapes.head_params(mtp)
    assert math.isclose((shapes.parameter_count(mtp) + tables) / 1e9, 685, rel_tol=0.002)
    first, last = stage_memory(cfg, recipe)[-1], stage_memory(mtp, recipe)[-1]
    assert last.model_states > first.model_states and last.activations > first.activations
    # the engine's split leaves the head's rank light: one stage shows the module's time
    flat = dataclasses.replace(recipe, pp=1, dp=512, microbatches=16)
    assert estimate(mtp, flat, H100).step_time > estimate(cfg, flat, H100).step_time
    explained = _architecture_reason(mtp, recipe)
    assert "2,112 values a token are gathered rather than 7,168" in explained
    mtp_args = " ".join(megatron_args(one_stage, mtp, "bf16", 64))
    assert "--mtp-num-layers 1" in mtp_args and "--mtp-num-layers" not in args


def test_the_deepseek_v3_preset_is_its_config():
    """``--model deepseek-v3`` is the Hugging Face config with its multi-token prediction
    module: the same parameters (each kind of block, the module, the tables) and FLOPs."""
    from paracube.models.presets import preset
    from paracube.models.sources import hf_model_config
    from paracube.planner.flops import model_flops_per_token

    config = hf_model_config({**DEEPSEEK_V3, "num_nextn_predict_layers": 1}, 4096)
    named = preset("deepseek-v3")
    assert shapes.parameter_count(named) == shapes.parameter_count(config)
    assert model_flops_per_token(named) == model_flops_per_token(config)
    kinds = [[(k.moe, k.ffn_hidden, n) for k, n in c.kind_counts()] for c in (named, config)]
    assert kinds[0] == kinds[1] == [(True, 2048, 58), (False, 18432, 3)]
    assert named.mtp_layers == 1
    router = ("router_score", "router_renorm", "router_expert_bias", "router_scale")
    assert [getattr(named, f) for f in router] == [getattr(config, f) for f in router]
    assert [getattr(named, f) for f in router] == ["sigmoid", True, True, 2.5]
    assert (
        (named.route_groups, named.route_group_topk)
        == (config.route_groups, config.route_group_topk)
        == (8, 4)
    )
