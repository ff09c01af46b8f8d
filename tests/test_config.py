"""Configuration validation: invalid values are refused with a line naming value and fix."""

from __future__ import annotations

import pytest

from paracube.config import ModelConfig, ParallelConfig, TrainConfig
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.validate import validate


def test_defaults_derive_global_batch():
    cfg = TrainConfig(
        model=preset("nano"), parallel=ParallelConfig(dp=4), micro_batch=2, grad_accum=3
    )
    assert cfg.global_batch == 24
    assert cfg.tokens_per_step == 24 * 64


def test_global_batch_sets_accumulation():
    cfg = TrainConfig(
        model=preset("nano"), parallel=ParallelConfig(dp=2), micro_batch=4, global_batch=32
    )
    assert cfg.grad_accum == 4


def test_global_batch_not_divisible():
    with pytest.raises(
        ConfigError, match=r"--global-batch 30 is not divisible by dp×micro-batch = 2×4 = 8"
    ):
        TrainConfig(
            model=preset("nano"), parallel=ParallelConfig(dp=2), micro_batch=4, global_batch=30
        )


@pytest.mark.parametrize("axis", ["dp", "tp", "pp"])
@pytest.mark.parametrize("value", [0, -2])
def test_axis_sizes_must_be_positive(axis, value):
    with pytest.raises(ConfigError, match=rf"--{axis} must be a positive integer, got {value}"):
        ParallelConfig(**{axis: value})


def test_world_size_mismatch():
    with pytest.raises(ConfigError, match=r"pp×dp×tp = 1×2×2 = 4 but the job has 2 ranks"):
        ParallelConfig(dp=2, tp=2).check_world_size(2)
    ParallelConfig(dp=2, tp=2).check_world_size(4)


def test_model_shape_checks():
    with pytest.raises(ConfigError, match="hidden=100 is not divisible by n_heads=3"):
        ModelConfig(n_layers=1, hidden=100, n_heads=3, vocab_size=256, seq_len=8)
    with pytest.raises(ConfigError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        ModelConfig(n_layers=1, hidden=64, n_heads=4, n_kv_heads=3, vocab_size=256, seq_len=8)
    with pytest.raises(ConfigError, match="unknown norm 'batchnorm'"):
        ModelConfig(n_layers=1, hidden=64, n_heads=4, vocab_size=256, seq_len=8, norm="batchnorm")
    with pytest.raises(ConfigError, match="n_layers must be a positive integer"):
        ModelConfig(n_layers=0, hidden=64, n_heads=4, vocab_size=256, seq_len=8)


def test_training_value_checks():
    with pytest.raises(ConfigError, match="--steps must be a positive integer"):
        TrainConfig(model=preset("nano"), steps=0)
    with pytest.raises(ConfigError, match="--micro-batch must be a positive integer"):
        TrainConfig(model=preset("nano"), micro_batch=-1)
    with pytest.raises(ConfigError, match="--min-lr 0.01 is above --lr 0.001"):
        TrainConfig(model=preset("nano"), lr=1e-3, min_lr=1e-2)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ConfigError, match=r"unknown model preset 'gpt5'.*tiny.*llama3-405b"):
        preset("gpt5")


def test_configs_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        ParallelConfig(2, 1, 1)  # type: ignore[misc]
    cfg = ParallelConfig(dp=2)
    with pytest.raises(AttributeError):
        cfg.dp = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "model,parallel,match",
    [
        (
            dict(n_heads=6, hidden=96),
            dict(tp=4),
            r"attention heads \(n_heads=6\) is not divisible by --tp 4",
        ),
        (
            dict(n_kv_heads=2),
            dict(tp=4),
            r"key/value heads \(n_kv_heads=2\) is not divisible by --tp 4",
        ),
        (
            dict(n_heads=8, ffn_hidden=100),
            dict(tp=8),
            r"MLP size \(ffn_hidden=100\) is not divisible by --tp 8",
        ),
        (
            dict(hidden=72, n_heads=8, seq_len=66),
            dict(tp=4, sequence_parallel=True),
            r"sequence length \(seq_len=66\) is not divisible by --tp 4",
        ),
    ],
)
def test_tensor_parallel_divisibility(model, parallel, match):
    with pytest.raises(ConfigError, match=match):
        validate(TrainConfig(model=preset("tiny", **model), parallel=ParallelConfig(**parallel)))


def test_vocabulary_need_not_divide_by_tp():
    """Padded to a multiple of tp, as Megatron does (GPT-2's 50,257 with tp = 4)."""
    validate(
        TrainConfig(model=preset("gpt3-125m"), parallel=ParallelConfig(tp=4)), data=False
    )  # 50,257 rows, 12 heads


def test_tensor_parallel_within_a_node():
    ParallelConfig(tp=8, dp=2, gpus_per_node=8)
    with pytest.raises(ConfigError, match=r"--tp 16 is larger than a node \(8 ranks per node\)"):
        ParallelConfig(tp=16, gpus_per_node=8)


@pytest.mark.parametrize(
    "model, refused",
    [
        (
            dict(kv_lora_rank=32, rope_head_dim=8, v_head_dim=16),
            "kv_lora_rank=32 \\(a multi-head latent",
        ),
        (dict(mtp_layers=1), "mtp_layers=1 \\(multi-token prediction\\)"),
    ],
)
def test_a_planned_only_shape_is_not_trained_as_another_model(model, refused):
    """A latent attention or multi-token prediction modules are planned (paracube plan), not
    built: paracube's GPT would silently train standard attention with one head, so both the
    job's validation and the model's constructor refuse them."""
    from paracube.models.gpt import GPT

    cfg = preset("tiny", **model)
    with pytest.raises(ConfigError, match=f"{refused}.*planned \\(paracube plan\\), not trained"):
        validate(TrainConfig(model=cfg), data=False)
    with pytest.raises(ConfigError, match=f"{refused}.*not built"):
        GPT(cfg)
