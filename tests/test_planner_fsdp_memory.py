"""ZeRO-3's memory as the stacks hold it: the parameters gathered beside the shards, and
PyTorch FSDP's mixed precision, whose fp32 parameters are the main weights (no 16-bit shard
kept at rest). The engine's own gathered bytes are checked against the planner's in
tests/test_materialize.py."""

from __future__ import annotations

import pytest

from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_memory
from paracube.planner.stacks import stack


def test_zero3_holds_its_root_unit_and_two_blocks_gathered():
    """Beside its shards, ZeRO-3 holds the root unit (embedding, final norm, head) through
    the step and a block with the next one prefetched, in the compute dtype: on one
    pipeline stage, (embed + head + norm + 2 blocks) × 2 bytes in bf16. ZeRO-1 gathers
    nothing; neither does a pipelined step that keeps its stage gathered (ZeRO-1's memory,
    counted in its states)."""
    cfg = preset("llama3-8b")
    root = shapes.embed_params(cfg) + shapes.head_params(cfg) + shapes.norm_params(cfg)
    expected = (root + 2 * shapes.block_params(cfg)) * 2
    [rank] = stage_memory(cfg, Layout(dp=8, zero=3), "bf16")
    assert rank.gathered == pytest.approx(expected)
    [fp32] = stage_memory(cfg, Layout(dp=8, zero=3), "fp32")
    assert fp32.gathered == pytest.approx(2 * expected)
    assert stage_memory(cfg, Layout(dp=8, zero=1), "bf16")[0].gathered == 0
    kept = Layout(dp=2, pp=4, microbatches=8, zero=3, zero3_pipeline="per-step")
    assert all(m.gathered == 0 for m in stage_memory(cfg, kept, "bf16"))
    # under a pipeline each end holds its own part of the root
    spread = stage_memory(cfg, Layout(dp=2, pp=4, microbatches=8, zero=3), "bf16")
    blocks = 2 * shapes.block_params(cfg) * 2
    assert spread[0].gathered == pytest.approx(blocks + 2 * shapes.embed_params(cfg))
    assert spread[1].gathered == pytest.approx(blocks)


def test_pytorch_fsdp_keeps_no_16bit_shard_under_zero3():
    """PyTorch FSDP's shards are the fp32 parameters — the main weights of the optimizer's
    12 bytes — cast to bf16 only as they are gathered: under ZeRO-3 a rank keeps 2/dp bytes
    a parameter less than a stack that keeps 16-bit parameters beside fp32 main weights.
    Under ZeRO-1 and 2 the 16-bit parameters are whole on every rank either way, and in fp32
    the parameters are the weights in both."""
    cfg = preset("llama3-8b")
    params = shapes.parameter_count(cfg)

    def states(zero: int, precision: str = "bf16", **software) -> float:
        [rank] = stage_memory(cfg, Layout(dp=8, zero=zero, **software), precision)
        return rank.model_states

    fsdp = {"master_weights": "parameters"}
    assert states(3) - states(3, **fsdp) == pytest.approx(2 * params / 8)
    for zero in (0, 1, 2):
        assert states(zero, **fsdp) == states(zero)
    assert states(3, "fp32", **fsdp) == states(3, "fp32")
    # the PyTorch FSDP stacks state it; Megatron-Core keeps its main weights in the optimizer
    for name in ("fsdp", "fsdp1", "torchtitan", "composer"):
        assert stack(name)["master_weights"] == "parameters", name
    assert "master_weights" not in stack("megatron-core")
