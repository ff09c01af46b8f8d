"""Gemma and Gemma 2 in the planner. Gemma 2 is Gemma 3's block without q/k norms, a
4,096-token window in every other block, and logit soft-capping: c·tanh(x/c) on each
attention score (inside FlashAttention-2's kernel, its softcap) and on each output logit
before the loss (passes over the logits, their tanh kept for backward). Each charge is
derived here from the uncapped model's."""

from __future__ import annotations

import dataclasses
import json

import pytest

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_memory
from paracube.planner.time_model import Cluster, estimate, head_time

# google/gemma-2-27b's config.json (the keys the plan reads; its soft caps are
# transformers' Gemma2Config defaults, written out) and google/gemma-7b's
GEMMA2_27B = {
    "model_type": "gemma2", "hidden_size": 4608, "intermediate_size": 36864,
    "num_hidden_layers": 46, "num_attention_heads": 32, "num_key_value_heads": 16,
    "head_dim": 128, "vocab_size": 256000, "sliding_window": 4096,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "query_pre_attn_scalar": 144, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
}  # fmt: skip
GEMMA_7B = {
    "model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 256, "vocab_size": 256000, "hidden_act": "gelu", "hidden_activation": None,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06,
}  # fmt: skip


def non_embedding(cfg: ModelConfig) -> int:
    return int(shapes.parameter_count(cfg) - shapes.embed_params(cfg))


def test_gemma_configs_are_read_and_count_as_published():
    """The non-embedding parameters of the Gemma reports' tables, to the parameter: Gemma
    2B and 7B 1,981,884,416 and 7,751,248,896 (Gemma Team 2024, Table 2); Gemma 2 2B, 9B
    and 27B 2,024,517,888, 8,324,201,984 and 26,047,480,320 (the Gemma 2 report's parameter
    counts). Gemma 2 27B's config is its preset: a window in every other block from the
    first, four norms a block, no q/k norms, both soft caps, a tied head."""
    from paracube.models.sources import hf_model_config

    gemma2 = hf_model_config(GEMMA2_27B, 8192)
    assert dataclasses.replace(gemma2, name="gemma2-27b") == preset("gemma2-27b")
    assert (gemma2.attention_window, gemma2.full_attention_every) == (4096, 2)
    assert [gemma2.local_attention(i) for i in range(4)] == [True, False, True, False]
    assert (gemma2.post_norms, gemma2.qk_norm, gemma2.tie_embeddings) == (True, False, True)
    assert (gemma2.attention_softcap, gemma2.logit_softcap) == (50.0, 30.0)
    gemma = hf_model_config(GEMMA_7B, 8192)
    assert (gemma.post_norms, gemma.local_span, gemma.logit_softcap) == (False, 0, 0.0)
    assert non_embedding(gemma) == 7_751_248_896
    assert non_embedding(gemma.replace(n_layers=18, hidden=2048, n_heads=8, n_kv_heads=1,
                                       ffn_hidden=16384)) == 1_981_884_416  # fmt: skip
    published = {"gemma2-2b": 2_024_517_888, "gemma2-9b": 8_324_201_984,
                 "gemma2-27b": 26_047_480_320}  # fmt: skip
    assert {name: non_embedding(preset(name)) for name in published} == published


@pytest.mark.parametrize("elementwise", ["fused", "eager"])
def test_the_logits_soft_cap_is_its_passes_and_its_kept_tanh(elementwise):
    """Against the same model uncapped: the head's time grows by the cap's bytes over this
    rank's logits at the GPU's memory rate — fused 2 + 3 passes of 2-byte logits, eager
    (divide, tanh, multiply) 6 + 7 — and the last pipeline stage keeps one more tensor of
    the logits' shape (the tanh), the first stage nothing more."""
    plain = preset("gemma2-2b", logit_softcap=0.0)
    capped = preset("gemma2-2b")
    g = hw.gpu("h100")
    layout = Layout(dp=2, tp=2, pp=2, micro_batch=2, microbatches=4, sequence_parallel=True,
                    elementwise=elementwise)  # fmt: skip
    logits = 2 * 8192 * 256000 / 2  # (b, s, V/t)
    passes = 5 if elementwise == "fused" else 13
    grown = head_time(capped, layout, g) - head_time(plain, layout, g)
    assert grown == pytest.approx(logits * passes * 2 / g.memory_rate, rel=1e-12)
    (first, last), (first_plain, last_plain) = (
        stage_memory(cfg, layout) for cfg in (capped, plain)
    )
    assert first.activations == first_plain.activations
    assert last.activations - last_plain.activations == pytest.approx(logits * 2)


def test_the_scores_cap_is_planned_inside_flash_attention_alone():
    """The scores' cap runs inside FlashAttention-2's kernel: the step is the uncapped
    model's to the second; any other attention kernel is refused with the reason."""
    cluster = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    layout = Layout(dp=8, micro_batch=1, microbatches=8, zero=1, recompute="full")
    capped, plain = preset("gemma2-9b"), preset("gemma2-9b", attention_softcap=0.0)
    assert (
        estimate(capped, layout, cluster, "bf16").step_time
        == estimate(plain, layout, cluster, "bf16").step_time
    )
    for attention in ("unfused", "fused-v1", "fused-triton"):
        refusal = layout.replace(attention=attention).model_refusal(capped)
        assert refusal.startswith(f"attention={attention} with attention_softcap=50"), refusal
    assert layout.replace(attention="unfused").model_refusal(plain) == ""


def test_gemma2_plans_explains_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """A Gemma 2 plan says where its caps are charged; --emit megatron refuses it before
    the search, paracube train refuses to build it, a negative cap is refused — each one
    line, exit 2 (tests/bad_inputs.py); a config's cap must be a positive number."""
    from paracube.cli import main
    from paracube.config import TrainConfig
    from paracube.models.sources import hf_model_config
    from paracube.validate import validate

    args = ["plan", "--model", "gemma2-27b", "--gpus", "64", "--gpu", "h100",
            "--global-batch", "512", "--top", "1"]  # fmt: skip
    assert main([*args, "--explain"]) == 0
    out = capsys.readouterr().out
    assert "logit soft-capping: each attention score capped at 50 inside" in out
    assert "each logit capped at 30 by passes over this rank's" in out
    assert main([*args, "--emit", "megatron"]) == 2
    assert "post-norms" in capsys.readouterr().err  # the first of its parts Megatron lacks
    with pytest.raises(ConfigError, match="logit soft-capping"):
        validate(TrainConfig(model=preset("gemma2-2b", seq_len=1024, post_norms=False)))
    with pytest.raises(ConfigError, match="logit_softcap=-1"):
        preset("gemma2-2b", logit_softcap=-1)
    with pytest.raises(ConfigError, match="final_logit_softcapping 0 must be a positive"):
        hf_model_config({**GEMMA2_27B, "final_logit_softcapping": 0}, 8192)
    uncapped = hf_model_config({**GEMMA2_27B, "final_logit_softcapping": None}, 8192)
    assert uncapped.logit_softcap == 0.0 and uncapped.attention_softcap == 50.0
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_27B))
    assert main(["plan", "--model", f"hf:{tmp_path}", "--gpus", "8", "--gpu", "h100",
                 "--global-batch", "64", "--top", "1", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["candidates"]


def test_a_vocabulary_that_fits_only_with_the_loss_in_place_is_told_so(capsys):
    """Gemma 3 1B at 32,768 tokens on 8 H100s: 262,144 logits a token make the loss's two
    fp32 gradients of the logits' shape (shapes.loss_backward_transient_bytes: 68.7 GB at a
    sequence a micro-batch) the peak, and no layout fits; the refusal names the loss computed
    in place and the layout it fits as — which, with the loss's backward back, does not."""
    from paracube.cli import main

    code = main(["plan", "--model", "gemma3-1b", "--gpus", "8", "--gpu", "h100",
                 "--global-batch", "64"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    named = err.split("it fits as ")[1].split(")")[0] + ")"
    assert named.startswith("dp=8 tp=1 pp=1 b=1 m=8"), err
    cfg = preset("gemma3-1b")
    transient = shapes.loss_backward_transient_bytes(cfg, 1, 1)
    assert transient == 2 * 32768 * 262144 * 4
    layout = Layout(dp=8, micro_batch=1, microbatches=8, zero=2, recompute="full",
                    recompute_blocks=17, loss="fused")  # fmt: skip
    (fused,) = stage_memory(cfg, layout)
    (torch_loss,) = stage_memory(cfg, layout.replace(loss="torch"))
    capacity = hw.gpu("h100").memory_bytes
    assert fused.total <= capacity < torch_loss.total
    assert torch_loss.transient - fused.transient == transient
