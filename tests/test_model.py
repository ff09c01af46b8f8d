"""The reference GPT: exact parameter counts, causality, options, and published shapes."""

from __future__ import annotations

import pytest
import torch

from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import PRESETS, preset
from paracube.models.shapes import parameter_count
from tests.helpers import LLAMA_BLOCK

# the last: heads wider than hidden / n_heads, the query and output projections n·d wide
VARIANTS = [
    {},
    dict(tie_embeddings=True),
    LLAMA_BLOCK,
    {**LLAMA_BLOCK, "head_size": 32},
    {**LLAMA_BLOCK, "qkv_bias": True},  # Qwen2's: q, k and v alone biased
]
IDS = ["gpt", "tied", "llama", "wide-heads", "qkv-bias"]


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_parameter_count_formula_matches_module(overrides):
    cfg = preset("nano", **overrides)
    model = GPT(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_causal_and_shapes(overrides):
    """Changing token t never changes the logits of positions before t."""
    torch.manual_seed(0)
    cfg = preset("nano", **overrides)
    model = GPT(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    y = x.clone()
    y[:, 40] = (y[:, 40] + 1) % cfg.vocab_size
    a, b = model(x), model(y)
    assert a.shape == (2, cfg.seq_len, cfg.vocab_size)
    torch.testing.assert_close(a[:, :40], b[:, :40], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_initial_loss_is_uniform_guess():
    """Small init → near-uniform predictions: loss ≈ ln(V)."""
    torch.manual_seed(0)
    cfg = preset("tiny")
    x = torch.randint(0, 256, (4, cfg.seq_len))
    loss = lm_loss(GPT(cfg)(x), x)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_layers_chain_reproduces_forward():
    torch.manual_seed(0)
    model = GPT(preset("nano")).eval()
    x = torch.randint(0, 256, (2, 16))
    h = x
    for layer in model.layers():
        h = layer(h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)


def test_published_sizes():
    """Preset shapes give the published parameter counts (Brown et al. 2020; Touvron et al.
    2023; Dubey et al. 2024; the Qwen2.5 and Qwen3 model cards) — ours include learned
    positions / untied heads as specified."""
    billions = {k: parameter_count(preset(k)) / 1e9 for k in PRESETS}
    assert billions["gpt3-175b"] == pytest.approx(175.0, rel=0.01)
    assert billions["gpt3-13b"] == pytest.approx(13.0, rel=0.03)
    assert billions["llama2-7b"] == pytest.approx(6.74, rel=0.001)
    assert billions["llama2-70b"] == pytest.approx(68.98, rel=0.001)
    assert billions["llama3-8b"] == pytest.approx(8.03, rel=0.001)
    assert billions["llama3-70b"] == pytest.approx(70.55, rel=0.001)
    assert billions["llama3-405b"] == pytest.approx(405.85, rel=0.001)
    # Qwen3's model cards: parameters and non-embedding parameters, to their 0.1B
    for name, total, body in [("qwen3-4b", 4.0, 3.6), ("qwen3-8b", 8.2, 6.95),
                              ("qwen3-14b", 14.8, 13.2), ("qwen3-32b", 32.8, 31.2)]:  # fmt: skip
        cfg = preset(name)
        tables = cfg.vocab_size * cfg.hidden * (1 if cfg.tie_embeddings else 2)
        assert billions[name] == pytest.approx(total, abs=0.05), name
        assert (parameter_count(cfg) - tables) / 1e9 == pytest.approx(body, abs=0.05), name
    # Qwen2.5's model cards, to their 0.01B (72B's non-embedding 70.0B is not the card's own
    # total less its two 152,064 × 8,192 tables, 70.2B, and is left out)
    for name, total, body in [("qwen2.5-0.5b", 0.49, 0.36), ("qwen2.5-1.5b", 1.54, 1.31),
                              ("qwen2.5-3b", 3.09, 2.77), ("qwen2.5-7b", 7.61, 6.53),
                              ("qwen2.5-72b", 72.7, None)]:  # fmt: skip
        cfg = preset(name)
        tables = cfg.vocab_size * cfg.hidden * (1 if cfg.tie_embeddings else 2)
        assert billions[name] == pytest.approx(total, abs=0.0075), name
        if body is not None:
            assert (parameter_count(cfg) - tables) / 1e9 == pytest.approx(body, abs=0.0075), name
    # and its mixtures' model cards: 30.5B (29.9B non-embedding) and 235B (234B)
    for name, total, body in [("qwen3-30b-a3b", 30.5, 29.9), ("qwen3-235b-a22b", 235, 234)]:
        cfg = preset(name)
        tables = cfg.vocab_size * cfg.hidden * 2
        assert billions[name] == pytest.approx(total, rel=0.002), name
        assert (parameter_count(cfg) - tables) / 1e9 == pytest.approx(body, rel=0.002), name


def test_narayanan_parameter_formula_for_gpt3():
    """SC21 Eq. 2, P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)), counts the same model as
    ours with a head tied to the embedding."""
    cfg = preset("gpt3-175b", tie_embeddings=True)
    l, h, V, s = cfg.n_layers, cfg.hidden, cfg.vocab_size, cfg.seq_len
    formula = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert parameter_count(cfg) == pytest.approx(formula, rel=1e-6)


def test_padded_head_product_is_the_linear_and_its_gradients():
    """The head's GPU path (products over a vocabulary padded to VOCAB_ALIGN with zero rows,
    the padded logits dropped) is x·Wᵀ exactly: the same values and, by gradcheck in
    float64, the same gradients — for a vocabulary that needs padding (131 → 256)."""
    from paracube.models.gpt import VOCAB_ALIGN, _PaddedHeadProduct

    torch.manual_seed(0)
    vocab = 131
    assert vocab % VOCAB_ALIGN
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, 8, dtype=torch.float64, requires_grad=True)
    out = _PaddedHeadProduct.apply(x, w)
    assert out.shape == (2, 3, vocab)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w))
    assert torch.autograd.gradcheck(_PaddedHeadProduct.apply, (x, w))


def test_a_decoupled_head_size_and_per_head_q_k_norms():
    """``head_size`` frees the heads' width from hidden / n_heads (then any head count
    goes); it must be positive. With ``qk_norm`` the GPT builds Qwen3's per-head q and k
    norms (d weights each, counted by the planner's parameter count) and gives each head
    of q and k unit root-mean-square before the rotary positions."""
    from paracube.config import ModelConfig
    from paracube.errors import ConfigError

    wide = ModelConfig(n_layers=1, hidden=60, n_heads=8, head_size=16, vocab_size=64, seq_len=8)
    assert (wide.head_dim, wide.q_dim) == (16, 128)
    with pytest.raises(ConfigError, match="head_size must be a positive integer"):
        ModelConfig(n_layers=1, hidden=64, n_heads=4, head_size=0, vocab_size=64, seq_len=8)
    with pytest.raises(ConfigError, match="hidden=60 is not divisible by n_heads=8"):
        ModelConfig(n_layers=1, hidden=60, n_heads=8, vocab_size=64, seq_len=8)
    qwen = wide.replace(qk_norm=True, norm="rmsnorm", position="rope", n_kv_heads=2)
    model = GPT(qwen)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(qwen)
    attn = model.blocks[0].attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (16,)
    seen = {}
    attn.q_norm.register_forward_hook(lambda _m, _a, out: seen.update(q=out))
    attn.k_norm.register_forward_hook(lambda _m, _a, out: seen.update(k=out))
    model(torch.randint(0, 64, (2, 8)))
    assert seen["q"].shape == (2, 8, 8, 16) and seen["k"].shape == (2, 8, 2, 16)
    for normed in seen.values():  # unit weights at initialisation: each head's RMS is 1 (less eps)
        rms = normed.pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), rtol=2e-3, atol=0)


def test_the_rotary_base_is_the_models():
    """The rotary tables turn by the model's θ: RoFormer's 10,000 unless told — Llama 3's
    500,000 (Dubey et al. 2024, Table 3) and Qwen3's 1,000,000 in their presets, a Hugging
    Face config's ``rope_parameters`` read as such; a base below 1 is refused."""
    from paracube.config import ModelConfig
    from paracube.errors import ConfigError
    from paracube.models.gpt import rotary_tables
    from paracube.models.sources import hf_model_config

    llama = preset("nano", **LLAMA_BLOCK)
    assert llama.rope_theta == 10000.0
    assert preset("llama3-8b").rope_theta == 500000.0 and preset("qwen3-8b").rope_theta == 1e6
    slow = llama.replace(rope_theta=500000.0)
    attn = GPT(slow).blocks[0].attn
    cos, sin = rotary_tables(slow)
    assert torch.equal(attn.cos, cos) and torch.equal(attn.sin, sin)
    assert not torch.equal(GPT(llama).blocks[0].attn.cos, cos)  # the base changes the angles
    # the last pair turns by t·θ^(−(d−2)/d): slower the larger θ
    d = slow.head_dim
    torch.testing.assert_close(cos[5, -1], torch.tensor(5 * 500000.0 ** (-(d - 2) / d)).cos())
    config = {
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 256,
        "max_position_embeddings": 64, "rope_parameters": {"rope_theta": 500000.0},
    }  # fmt: skip
    assert hf_model_config(config, 64).rope_theta == 500000.0
    with pytest.raises(ConfigError, match="rope_theta must be a finite number >= 1"):
        ModelConfig(n_layers=1, hidden=64, n_heads=4, vocab_size=64, seq_len=8, rope_theta=0.5)


def test_stretched_rotary_frequencies():
    """Linear interpolation divides every frequency by the factor; Llama 3.1's stretch
    divides the slow pairs' (wavelength over the original context ÷ low), keeps the fast
    ones' (under it ÷ high) and blends between — each pair checked against its branch; a
    stretch paracube does not build, or inverted bounds, is refused."""
    import math

    from paracube.config import ModelConfig
    from paracube.errors import ConfigError
    from paracube.models.gpt import rotary_frequencies

    base = preset("nano", **LLAMA_BLOCK).replace(rope_theta=500000.0)
    omega = rotary_frequencies(base)
    linear = base.replace(rope_scaling="linear", rope_factor=4.0)
    torch.testing.assert_close(rotary_frequencies(linear), omega / 4)
    llama3 = base.replace(
        rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0, rope_original_context=64,
    )  # fmt: skip
    got = rotary_frequencies(llama3)
    kinds = set()
    for w, g in zip(omega.tolist(), got.tolist()):
        wavelength = 2 * math.pi / w
        if wavelength < 64 / 4:
            kinds.add("fast")
            assert g == pytest.approx(w)
        elif wavelength > 64 / 1:
            kinds.add("slow")
            assert g == pytest.approx(w / 8)
        else:
            kinds.add("blended")
            s = (64 / wavelength - 1) / (4 - 1)
            assert g == pytest.approx((1 - s) * w / 8 + s * w) and w / 8 < g < w
    assert kinds == {"fast", "slow", "blended"}
    shape = dict(n_layers=1, hidden=64, n_heads=4, vocab_size=64, seq_len=8)
    with pytest.raises(ConfigError, match="rope_scaling 'yarn' is not built"):
        ModelConfig(**shape, rope_scaling="yarn")
    with pytest.raises(ConfigError, match="rope_high_freq_factor 1.0 must exceed"):
        ModelConfig(**shape, rope_scaling="llama3", rope_high_freq_factor=1.0)


def test_a_qwen25_config_reads_as_its_preset():
    """Qwen2.5-7B's config.json, as transformers' Qwen2Config writes it (q, k and v biased,
    no other linear; no sliding window in use), reads as the ``qwen2.5-7b`` preset."""
    import json
    import tempfile

    from transformers import Qwen2Config

    from paracube.models.sources import hf_model_config, read_hf_config

    qwen = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, sliding_window=131072, max_window_layers=28,
                       use_sliding_window=False)  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        with open(f"{directory}/config.json", "w") as f:
            json.dump(qwen.to_dict(), f)
        cfg = hf_model_config(read_hf_config(directory), 4096)
    assert cfg.replace(name="qwen2.5-7b") == preset("qwen2.5-7b")
