"""The pass that brings each micro-batch's weight gradients into the buffer they are reduced
from (``planner.time_model.accumulation_time``): its bytes per parameter follow from each
stack's code — paracube's ``FlatUnit.absorb``, Megatron-Core's fused accumulation,
DeepSpeed's ``BF16_Optimizer.update_hp_grads`` — and the step pays it on the rank's
parameters at the memory rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.time_model import Cluster, accumulation_time, estimate

A100 = hw.gpu("a100-80gb")
P = 1e9  # parameters on the rank


def test_bytes_per_parameter_of_each_stack():
    """bf16 gradients (2 bytes) into an fp32 buffer (4), m = 4 micro-batches over 8 ranks:
    paracube copies the first (2 + 4), adds the other three (2 + 4 + 4 each) and averages the
    buffer once before its reduction (4 + 4); under ZeRO-3 every micro-batch starts a new
    window and is averaged for its own reduce-scatter: four copies and four averages;
    reduced in bf16 the buffer is 2 bytes; Megatron-Core's fused accumulation passes over
    the embedding only, and averages everything once; DeepSpeed's BF16_Optimizer casts to
    an fp32 temporary and adds, every micro-batch ((2 + 4) + 3 × 4), and averages once;
    FSDP's cast and pre-divide are ZeRO-3's bytes on a side stream, charged as hidden work
    (the overlap slowdown's share). One rank: nothing to average."""
    from paracube.planner.collectives import OVERLAP_SLOWDOWN

    base = Layout(dp=8, micro_batch=1, microbatches=4, zero=1)
    rate = A100.memory_rate
    assert accumulation_time(base, A100, P, 0, 2) == pytest.approx(P * (6 + 3 * 10 + 8) / rate)
    zero3 = replace(base, zero=3)
    assert accumulation_time(zero3, A100, P, 0, 2) == pytest.approx(P * 4 * (6 + 8) / rate)
    compute = replace(base, grad_reduce="compute")
    assert accumulation_time(compute, A100, P, 0, 2) == pytest.approx(P * (4 + 18 + 4) / rate)
    fused = replace(base, grad_accumulation="fused")
    assert accumulation_time(fused, A100, P, 0, 2) == pytest.approx(P * 8 / rate)
    assert accumulation_time(fused, A100, P, 0.1 * P, 2) == pytest.approx(
        (0.1 * P * 36 + P * 8) / rate
    )
    deepspeed = replace(base, grad_accumulation="bf16-optimizer")
    assert accumulation_time(deepspeed, A100, P, 0, 2) == pytest.approx(P * (4 * 18 + 8) / rate)
    fsdp = replace(zero3, grad_accumulation="side-stream")
    assert accumulation_time(fsdp, A100, P, 0, 2) == pytest.approx(
        OVERLAP_SLOWDOWN * accumulation_time(zero3, A100, P, 0, 2)
    )
    alone = replace(base, dp=1)
    assert accumulation_time(alone, A100, P, 0, 2) == pytest.approx(P * (6 + 3 * 10) / rate)


def test_the_step_pays_it_on_the_ranks_parameters():
    """gpt3-1.3b at dp=8, 8 micro-batches on A100s: the step under paracube's accumulation is
    slower than under fused accumulation by exactly the pass over every parameter but the
    embedding's (which both pay), and the pass grows with the micro-batches."""
    cfg = preset("gpt3-1.3b")
    cluster = Cluster(A100, 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))
    ours = Layout(dp=8, micro_batch=2, microbatches=8)
    fused = replace(ours, grad_accumulation="fused")
    params = shapes.parameter_count(cfg)
    embedding = shapes.embed_params(cfg)
    gap = estimate(cfg, ours, cluster).compute - estimate(cfg, fused, cluster).compute
    assert gap == pytest.approx(
        accumulation_time(ours, A100, params, 0, 2)
        - accumulation_time(fused, A100, params, embedding, 2)
    )
    assert gap > 0
    more = replace(ours, micro_batch=1, microbatches=16)
    assert accumulation_time(more, A100, params, 0, 2) > accumulation_time(ours, A100, params, 0, 2)


def test_another_stacks_accumulation_is_planned_only():
    """A misspelt one is refused where the Layout is made; a stack's own is never turned into
    a paracube train command."""
    with pytest.raises(ConfigError, match="grad_accumulation='fusion': choose one of buffer"):
        Layout(grad_accumulation="fusion")
    with pytest.raises(ConfigError, match="another stack's software"):
        Layout(grad_accumulation="fused").to_args()


def test_fsdp2_copies_every_gathered_parameter_out_once_per_pass():
    """Under per-parameter sharding (FSDP2) each ZeRO-3 gather is copied out of the
    all-gather's buffer into the parameters: a read and a write (2 + 2 bytes in bf16) of
    every parameter gathered for forward, and of all but the root's for backward, per
    micro-batch, on the compute stream. gpt3-1.3b at dp=8, 4 micro-batches: the step is
    slower than with flat units by exactly that; flat units, ZeRO-1 and a single rank pay
    nothing."""
    from paracube.planner.time_model import gather_copy_time

    cfg = preset("gpt3-1.3b")
    cluster = Cluster(A100, 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))
    flat = Layout(dp=8, micro_batch=2, microbatches=4, zero=3)
    copied = replace(flat, param_gather="per-parameter")
    blocks = cfg.n_layers * shapes.block_params(cfg)
    root = shapes.embed_params(cfg) + shapes.norm_params(cfg)  # the embedding, final norm
    root += 0 if cfg.tie_embeddings else shapes.head_params(cfg)  # and an untied head
    expected = 4 * 2 * 2 * (2 * (blocks + root) - root) / A100.memory_rate
    slower = estimate(cfg, copied, cluster).compute - estimate(cfg, flat, cluster).compute
    assert slower == pytest.approx(expected)
    assert gather_copy_time(flat, A100, P, 0, 2) == 0
    assert gather_copy_time(replace(copied, zero=1), A100, P, 0, 2) == 0
    assert gather_copy_time(replace(copied, dp=1), A100, P, 0, 2) == 0
    with pytest.raises(ConfigError, match="param_gather='chunked': choose flat or per-parameter"):
        Layout(dp=8, param_gather="chunked")
