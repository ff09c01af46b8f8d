"""Sliding-window attention in the planner (``ModelConfig.attention_window``,
``full_attention_every``; ``plan --attention-window W --full-attention-every N``): GPT-OSS's
128-token window in alternate blocks, Mistral's in every block. A windowed block differs from
a fully attending one in its attention core alone — the keys its mask keeps (the model's
FLOPs) and the 128 × 128 tiles a fused kernel computes for them (the time) — each figure
derived here from the mask itself."""

from __future__ import annotations

import json
import math

import pytest

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.time_model import (
    Cluster,
    attention_core,
    attention_core_backward,
    block_costs,
)

H100 = hw.gpu("h100")

# openai/gpt-oss-120b's config.json, as transformers writes it (the keys the plan reads)
GPT_OSS_120B = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
    "vocab_size": 201088, "sliding_window": 128, "attention_bias": True,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}  # fmt: skip


def _mask(s: int, window: int = 0, chunk: int = 0):
    """Which (query, key) pairs a causal window of ``window`` keys, or causal chunks of
    ``chunk`` tokens, keep, as nested bools."""
    if window:
        return [[i - window < j <= i for j in range(s)] for i in range(s)]
    return [[j <= i and i // chunk == j // chunk for j in range(s)] for i in range(s)]


@pytest.mark.parametrize(
    "s, window, chunk",
    [(512, 128, 0), (640, 200, 0), (1024, 300, 0), (384, 128, 0), (1024, 0, 256),
     (768, 0, 200), (512, 0, 128)],
)  # fmt: skip
def test_the_kept_keys_and_the_computed_tiles_are_the_masks(s, window, chunk):
    """attended_keys is the mask's non-zero count over s; local_kernel_keys the pairs of
    every 128 × 128 tile holding one of them, over s — counted on the mask itself, for
    sliding windows and for chunks (aligned to the tiles or not)."""
    tile = shapes.ATTENTION_TILE
    mask = _mask(s, window, chunk)
    kept = sum(map(sum, mask))
    cfg = ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=100, seq_len=s,
                      attention_window=window, attention_chunk=chunk)  # fmt: skip
    assert cfg.attended_keys == pytest.approx(kept / s)
    tiles = sum(
        any(mask[i][j] for i in range(a, a + tile) for j in range(b, b + tile))
        for a in range(0, s, tile)
        for b in range(0, s, tile)
    )
    assert shapes.local_kernel_keys(s, window, chunk) == pytest.approx(tiles * tile * tile / s)


def test_gpt_oss_is_read_from_its_config_as_its_preset_and_counts_as_published(tmp_path):
    """The config's window and layer_types become the 128-token window with every 2nd block
    (1-based) attending fully — blocks 0, 2, 4 … windowed, as its layer_types say —, the
    preset the same model. 116.8B parameters, 5.1B active a token (OpenAI's gpt-oss-120b
    model card): the planner's count, biases and all, within 0.1 %; its active ones — the
    blocks' 4 experts, attention and norms, and one vocabulary table — within 1 %."""
    from paracube.models.sources import hf_model_config, read_hf_config

    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_120B))
    cfg = hf_model_config(read_hf_config(str(tmp_path)), 4096)
    assert cfg.attention_window == 128 and cfg.full_attention_every == 2
    assert [cfg.local_attention(i) for i in range(4)] == [True, False, True, False]
    own = preset("gpt-oss-120b")
    fields = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_size", "ffn_hidden",
              "experts", "experts_per_token", "vocab_size", "bias", "attention_window",
              "full_attention_every", "tie_embeddings", "rope_theta")  # fmt: skip
    assert {f: getattr(cfg, f) for f in fields} == {f: getattr(own, f) for f in fields}
    assert math.isclose(shapes.parameter_count(cfg) / 1e9, 116.8, rel_tol=1e-3)
    active = sum(
        n * (shapes.block_active_matrix_params(k) + 2 * shapes.norm_params(k))
        for k, n in cfg.kind_counts()
    )
    assert math.isclose((active + shapes.head_params(cfg)) / 1e9, 5.1, rel_tol=0.01)
    assert [(k.kind_key, n) for k, n in cfg.kind_counts()] == [
        ((True, 128, 0), 18),
        ((True, 0, 0), 18),
    ]
    assert [(k.kind_key, n) for k, n in cfg.kind_counts(range(3))] == [
        ((True, 128, 0), 2),
        ((True, 0, 0), 1),
    ]


def test_a_windowed_block_differs_in_its_attention_core_alone():
    """Of GPT-OSS at 4,096 tokens on an H100 (micro-batch 2, EP 8): a windowed block's core
    forward is a full block's times the computed keys over the causal half (252 of 2,048: the
    first query tile computes one tile, every other two), its backward the same share; the
    rest of the block — its matmuls, its all-to-alls — the same; its model FLOPs count the
    mask's kept keys, a full block's all s."""
    cfg = preset("gpt-oss-120b")
    windowed, full = (kind for kind, _ in cfg.kind_counts())
    layout = Layout(dp=8, ep=8, micro_batch=2, attention="fused", activations="megatron")
    s = cfg.seq_len
    core_full = attention_core(full, layout, H100)[0]
    core_windowed = attention_core(windowed, layout, H100)[0]
    assert shapes.local_kernel_keys(s, 128) == 252
    assert core_windowed == pytest.approx(core_full * 252 / (s / 2))
    cluster = Cluster(H100, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    costs = {k.kind_key: block_costs(k, layout, cluster, 2, False) for k in (windowed, full)}
    saved = core_full - core_windowed
    backward = attention_core_backward(layout, saved, H100)
    assert costs[True, 0, 0].block - costs[True, 128, 0].block == pytest.approx(saved + backward)
    assert costs[True, 0, 0].to_experts == costs[True, 128, 0].to_experts
    a, d = cfg.n_heads, cfg.head_dim
    assert shapes.attention_core_flops_per_token(full) == 2 * s * a * 2 * d
    assert shapes.attention_core_flops_per_token(windowed) == pytest.approx(
        2 * windowed.attended_keys * a * 2 * d
    )


def test_a_window_as_long_as_the_sequence_is_full_attention():
    """A window of s tokens or more masks nothing: the same core, the same FLOPs, the same
    plan as no window; and Mistral's config at 4,096 tokens (its window) plans without
    one, at 8,192 with it; Qwen2's, from its max_window_layers on."""
    from paracube.models.sources import hf_model_config

    base = dict(n_layers=2, hidden=256, n_heads=4, vocab_size=100, seq_len=4096)
    plain, long = ModelConfig(**base), ModelConfig(**base, attention_window=4096)
    layout = Layout(dp=1, attention="fused")
    assert attention_core(long, layout, H100) == attention_core(plain, layout, H100)
    assert shapes.attention_core_flops_per_token(long) == shapes.attention_core_flops_per_token(
        plain
    )
    mistral = {"model_type": "mistral", "sliding_window": 4096, "hidden_size": 4096,
               "intermediate_size": 14336, "num_key_value_heads": 8,
               "max_position_embeddings": 32768}  # fmt: skip
    assert hf_model_config(mistral, 4096).attention_window == 0
    assert hf_model_config(mistral, 8192).attention_window == 4096
    # Qwen2 windows the blocks from max_window_layers on: all of them, none, or — the first
    # ones full and the rest windowed, which is no every-N-th pattern — refused
    qwen2 = {"model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 4,
             "num_hidden_layers": 4, "intermediate_size": 512, "sliding_window": 1024,
             "use_sliding_window": True, "max_position_embeddings": 4096}  # fmt: skip
    assert hf_model_config({**qwen2, "max_window_layers": 0}, 2048).attention_window == 1024
    assert hf_model_config({**qwen2, "max_window_layers": 4}, 2048).attention_window == 0
    with pytest.raises(ConfigError, match="full attention in blocks \\[0, 1\\]"):
        hf_model_config({**qwen2, "max_window_layers": 2}, 2048)


def test_the_plan_emits_the_window_and_refuses_what_it_does_not_plan(capsys):
    """--emit megatron gives Megatron-Core the window as FlashAttention's extents (127 back,
    none ahead) and the full blocks' frequency, and --explain says what the window computes;
    context parallelism is refused with the window, as are a frequency without a window and
    a training run."""
    from paracube.cli import main
    from paracube.config import TrainConfig
    from paracube.validate import validate

    code = main(["plan", "--model", "gpt-oss-120b", "--gpus", "64", "--gpu", "h100",
                 "--global-batch", "512", "--layout", "tp=1,pp=4,ep=8,etp=1",
                 "--micro-batch", "1", "--recompute-modules", "layernorm,moe_act",
                 "--stack", "megatron-core", "--emit", "megatron", "--explain"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "--window-size 127,0 --window-attn-skip-freq 2" in out
    assert "--moe-layer-freq" not in out  # every block a mixture
    assert (
        "A sliding window of 128 tokens in 18 of the 36 blocks (one in 2 attends fully): a "
        "local block's fused attention computes 252 keys a query" in out
    )
    assert (
        Layout(dp=8, cp=2, ep=8)
        .model_refusal(preset("gpt-oss-20b"))
        .startswith("cp=2 with a sliding window of 128 tokens")
    )
    with pytest.raises(ConfigError, match="full_attention_every=2 without a window or chunk"):
        ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=100, seq_len=32,
                    full_attention_every=2)  # fmt: skip
    windowed = ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=256, seq_len=64,
                           attention_window=16)  # fmt: skip
    with pytest.raises(ConfigError, match="a sliding window of 16 tokens < --seq-len 64"):
        validate(TrainConfig(model=windowed))


# meta-llama/Llama-4-Maverick-17B-128E's config.json: the multimodal wrapper and the keys of
# its text_config the plan reads (transformers' defaults: no_rope_layers every 4th zero)
LLAMA4_MAVERICK = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 128,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 202048,
        "attention_chunk_size": 8192, "use_qk_norm": False, "rope_theta": 500000.0,
        "max_position_embeddings": 1048576, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
    },
}  # fmt: skip


def test_llama4_is_read_from_its_config_and_counts_as_published(tmp_path):
    """Maverick's config: every 2nd block (1-based) a mixture of 128 experts and a shared
    one, the others dense at 16,384; every 4th block attending fully, the others within
    chunks of 8,192 — at 8,192 tokens one chunk is the sequence, so no block is local. "17B
    active parameters, 400B total" (Meta's Llama 4 model card): the planner's count within
    0.5 %, its active ones — the blocks' one expert, shared expert, dense MLPs, attention
    and one vocabulary table — within 6 % (the card's figures count the vision encoder too);
    Scout's "109B total" within 1.5 % for the same reason. The preset is the same model."""
    from paracube.models.sources import hf_model_config, read_hf_config

    (tmp_path / "config.json").write_text(json.dumps(LLAMA4_MAVERICK))
    cfg = hf_model_config(read_hf_config(str(tmp_path)), 8192)
    assert cfg.dense_layers == tuple(range(0, 48, 2)) and cfg.dense_ffn == 16384
    assert cfg.attention_chunk == 0 and cfg.local_span == 0  # one chunk: full attention
    own = preset("llama4-maverick")
    fields = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "experts",
              "experts_per_token", "shared_expert_ffn", "dense_layers", "dense_ffn",
              "vocab_size", "tie_embeddings")  # fmt: skip
    assert {f: getattr(cfg, f) for f in fields} == {f: getattr(own, f) for f in fields}
    longer = hf_model_config(read_hf_config(str(tmp_path)), 32768)
    assert (longer.attention_chunk, longer.full_attention_every) == (8192, 4)
    assert [(k.kind_key, n) for k, n in longer.kind_counts()] == [
        ((True, 0, 8192), 12),
        ((True, 0, 0), 12),
        ((False, 0, 8192), 24),
    ]

    def active(model):
        blocks = sum(
            n * (shapes.block_active_matrix_params(k) + 2 * shapes.norm_params(k))
            for k, n in model.kind_counts()
        )
        return (blocks + shapes.head_params(model)) / 1e9

    assert math.isclose(shapes.parameter_count(own) / 1e9, 400, rel_tol=0.005)
    assert math.isclose(active(own), 17, rel_tol=0.06)
    scout = preset("llama4-scout")
    assert math.isclose(shapes.parameter_count(scout) / 1e9, 109, rel_tol=0.015)
    assert math.isclose(active(scout), 17, rel_tol=0.06)


def test_a_chunked_block_differs_in_its_attention_core_alone():
    """Scout at 32,768 tokens: a chunked block's core forward is a full block's times the
    keys its kernel computes over the causal half (4,160 of 16,384: each chunk's causal
    triangle of 64 × 64 tiles); at 8,192 tokens, one chunk, Scout plans as a model without
    chunks — the same step, to the second."""
    from paracube.planner.time_model import estimate

    long = preset("llama4-scout", seq_len=32768)
    chunked, full = (kind for kind, _ in long.kind_counts())
    layout = Layout(dp=8, ep=8, tp=2, sequence_parallel=True, attention="fused",
                    activations="megatron")  # fmt: skip
    assert shapes.local_kernel_keys(32768, chunk=8192) == (64 * 65 / 2) * 128 * 128 * 4 / 32768
    assert attention_core(chunked, layout, H100)[0] == pytest.approx(
        attention_core(full, layout, H100)[0] * 4160 / 16384
    )
    cluster = Cluster(H100, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    at_chunk = preset("llama4-scout")
    plain = at_chunk.replace(attention_chunk=0, full_attention_every=0)
    one = Layout(dp=8, ep=8, tp=8, sequence_parallel=True, micro_batch=1, microbatches=8,
                 attention="fused", activations="megatron", recompute="full")  # fmt: skip
    assert estimate(at_chunk, one, cluster).step_time == estimate(plain, one, cluster).step_time
