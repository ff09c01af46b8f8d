"""Gemma 3 in the planner: four norms a block (``ModelConfig.post_norms``: each sub-layer's
output normed again before the residual add), per-head q/k norms, a GeGLU MLP planned as the
gated MLP it is in matrices, and a 1,024-token sliding window in five blocks of six. The two
extra norms are counted as the block's own two are — their weights, what each keeps for
backward, their eager reads and writes — each figure derived from the pre-norms'."""

from __future__ import annotations

import math

import pytest

from paracube.config import ModelConfig
from paracube.models import shapes
from paracube.planner.memory import te_block_bytes

# google/gemma-3-27b's config.json: the multimodal wrapper and the keys of its text_config
# the plan reads
GEMMA3_27B = {
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
        "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 1000000.0,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
    },
}  # fmt: skip

BASE = dict(n_layers=2, hidden=256, n_heads=4, vocab_size=512, seq_len=128, norm="rmsnorm",
            activation="swiglu", position="rope", ffn_hidden=512, bias=False)  # fmt: skip


def test_gemma3_is_read_from_its_config_and_counts_as_published():
    """Gemma 3 27B: "25,600M non-embedding parameters" (Gemma Team 2025, Gemma 3 technical
    report, Table 1) — the planner's blocks and final norm within 0.1 %; its embedding tied
    to the head; every 6th block at full attention, the others over 1,024 tokens; per-head
    q/k norms and four norms a block. Its config is the gemma3-27b preset's shape; the
    presets of the 1B, 4B and 12B count Table 1's 698M, 3,209M and 10,759M."""
    import dataclasses

    from paracube.models.presets import preset
    from paracube.models.sources import hf_model_config

    assert dataclasses.replace(hf_model_config(GEMMA3_27B, 32768), name="gemma3-27b") == (
        preset("gemma3-27b")
    )
    for name, millions in (("gemma3-1b", 698), ("gemma3-4b", 3209), ("gemma3-12b", 10759)):
        small = preset(name)
        counted = shapes.parameter_count(small) - shapes.embed_params(small)
        assert round(counted / 1e6) == millions, name
    cfg = hf_model_config(GEMMA3_27B, 8192)
    assert (cfg.post_norms, cfg.qk_norm, cfg.tie_embeddings) == (True, True, True)
    assert (cfg.attention_window, cfg.full_attention_every, cfg.head_size) == (1024, 6, 128)
    blocks = shapes.parameter_count(cfg) - shapes.embed_params(cfg)
    assert math.isclose(blocks / 1e6, 25600, rel_tol=1e-3)
    assert [(k.kind_key, n) for k, n in cfg.kind_counts()] == [
        ((False, 1024, 0), 52),
        ((False, 0, 0), 10),
    ]


def test_two_more_norms_are_counted_as_the_block_s_own():
    """Against the same block with its two pre-norms alone: h more weights per norm; in
    paracube's saved-bytes table and in Megatron's what a pre-norm keeps (its input and
    rstd), once more per post-norm; and in the eager element-wise traffic, an RMSNorm's
    reads and writes each way per post-norm."""
    plain, post = ModelConfig(**BASE), ModelConfig(**BASE, post_norms=True)
    n, h = 2 * 128, 256
    assert shapes.block_params(post) - shapes.block_params(plain) == 2 * shapes.norm_params(plain)
    one = shapes._norm_bytes(plain, n, 2)
    assert (
        shapes.block_saved_bytes(post, 2, elem=2) - shapes.block_saved_bytes(plain, 2, elem=2)
        == 2 * one
    )
    te = te_block_bytes(post, 2, t=2, sequence_parallel=True) - te_block_bytes(
        plain, 2, t=2, sequence_parallel=True
    )
    assert te == pytest.approx(2 * (2 * n * h + 4 * n) / 2)
    fwd, bwd = shapes._rmsnorm_traffic(n, h, 2)
    a = shapes.eager_elementwise_bytes(plain, n, elem=2)
    b = shapes.eager_elementwise_bytes(post, n, elem=2)
    assert (b[0] - a[0], b[1] - a[1]) == (2 * fwd, 2 * bwd)


def test_gemma3_plans_and_refuses_what_it_cannot_emit(tmp_path, capsys):
    """A Gemma 3 config plans (--explain names its window); --emit megatron refuses its
    post-norms before the search, one line, exit 2; paracube train refuses to build it."""
    import json

    from paracube.cli import main
    from paracube.config import TrainConfig
    from paracube.errors import ConfigError
    from paracube.models.sources import hf_model_config
    from paracube.validate import validate

    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_27B))
    argv = ["plan", "--model", f"hf:{tmp_path}", "--seq", "8192", "--gpus", "16", "--gpu",
            "h100", "--global-batch", "64", "--top", "1", "--explain"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "A sliding window of 1,024 tokens in 52 of the 62 blocks (one in 6 attends fully)" in out
    assert main([*argv, "--emit", "megatron"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "post-norms (four norms a block, Gemma's)" in err[0]
    small = hf_model_config(GEMMA3_27B, 1024)  # no window within 1,024 tokens
    with pytest.raises(ConfigError, match="post_norms"):
        validate(TrainConfig(model=small.replace(vocab_size=256)))
