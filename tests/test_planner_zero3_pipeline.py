"""ZeRO-3 under a pipeline as torchtitan runs it (``Layout.zero3_pipeline="per-step"``): each
stage's FSDP2 parameters gathered in its first forward and kept through the step, its
gradients accumulated whole and reduce-scattered once after its last backward
(torchtitan's apply_fsdp: reshard_after_forward off when pipelining; PyTorch's
pipelining: no gradient sync nor reshard until the last backward). paracube's own engine
refuses ZeRO-3 with a pipeline, and so does its plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.dp_comm import dp_link, unit_latency, zero3_collectives
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.search import search
from paracube.planner.stacks import STACK_CHOICES, stack, stack_choices
from paracube.planner.time_model import Cluster, estimate


def _h100s(overlaps: bool = True) -> Cluster:
    gpu = hw.gpu("h100")
    if not overlaps:  # nothing hides behind compute: the communication is all on the step
        gpu = replace(gpu, overlaps_communication=False)
    return Cluster(gpu, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def _stage(**kw) -> Layout:
    """Llama 3 70B at DP 4 × TP 8 × PP 2 (80 blocks, 40 a stage), 8 micro-batches."""
    base = dict(dp=4, tp=8, pp=2, micro_batch=1, microbatches=8, sequence_parallel=True,
                recompute="full", overlap_grad_reduce=False)  # fmt: skip
    return Layout(**(base | kw))


def test_torchtitan_plans_fsdp_with_a_pipeline_and_paracube_refuses_it_with_the_way_out():
    """Llama 3.1 405B on 512 H100s at FSDP 8 × TP 8 × PP 8 (torchtitan's own 3-D layout,
    docs/performance.md Table 5) is planned for torchtitan, every candidate ZeRO-3 kept
    gathered through the step; asked of paracube's own software it is refused, naming
    torchtitan's way of running it."""
    cfg, cluster = preset("llama3-405b"), _h100s()
    shape = {"dp": 8, "tp": 8, "pp": 8, "zero": 3}
    titan = search(cfg, cluster, 512, 256, fixed=stack("torchtitan") | shape, top=5,
                   allowed=stack_choices("torchtitan"))  # fmt: skip
    assert titan.ranked and all(c.layout.zero3_per_step for c in titan.ranked)
    own = search(cfg, cluster, 512, 256, fixed=shape)
    assert not own.ranked
    assert any("plan it as torchtitan runs it" in why for why in own.rejected)


def test_torchtitan_shards_with_fsdp_or_replicates():
    """torchtitan has FSDP2 (ZeRO-3) and DDP (ZeRO-0), no ZeRO-1 or 2: its plans propose
    nothing else, pipelined or not."""
    assert STACK_CHOICES["torchtitan"]["zero"] == (0, 3)
    found = search(preset("llama3-70b"), _h100s(), 64, 128, fixed=stack("torchtitan"),
                   allowed=stack_choices("torchtitan"), top=200)  # fmt: skip
    assert found.ranked and {c.layout.zero for c in found.ranked} <= {0, 3}


def test_gathered_once_a_step_it_moves_zero1s_bytes_in_more_rings():
    """Nothing hidden (a GPU that overlaps no communication): the step pays one all-gather of
    the stage's 16-bit weights and one reduce-scatter of its fp32 gradients — the bytes of
    ZeRO-1 with Megatron-Core's reduce-scatter and its all-gather after the step — plus
    one ring's latency for every FSDP unit past the first, gathered and scattered unit by
    unit; and it is the same whatever the micro-batches, where ZeRO-3 re-gathering every
    micro-batch pays its gathers and reduce-scatter once per micro-batch."""
    cfg, cluster = preset("llama3-70b"), _h100s(overlaps=False)
    kept = _stage(zero=3, zero3_pipeline="per-step")
    zero1 = _stage(zero=1, grad_sync="reduce-scatter")
    link = dp_link(kept, cluster)
    blocks = cfg.n_layers // 2
    forwards, _, scatters = zero3_collectives(blocks)
    latency = unit_latency(kept, link, forwards) + unit_latency(kept, link, scatters)
    exposed_kept = estimate(cfg, kept, cluster).dp_exposed
    exposed_zero1 = estimate(cfg, zero1, cluster).dp_exposed
    assert exposed_kept == pytest.approx(exposed_zero1 + latency, rel=1e-6)
    # per micro-batch re-gathering (what "none" times) pays far more on the same stage
    regathered = estimate(cfg, replace(kept, zero3_pipeline="none"), cluster).dp_exposed
    assert regathered > 4 * exposed_kept
    # twice the micro-batches: the same once-a-step communication
    more = estimate(cfg, replace(kept, microbatches=16), cluster).dp_exposed
    assert more == pytest.approx(exposed_kept, rel=1e-6)


def test_while_the_step_runs_it_holds_what_zero1_holds():
    """The whole stage's 16-bit weights and fp32 gradients, the main weights and Adam's
    moments sharded: ZeRO-1's model states, more than ZeRO-3 re-gathering every micro-batch
    holds between its gathers."""
    cfg = preset("llama3-70b")
    kept = peak_memory(cfg, _stage(zero=3, zero3_pipeline="per-step"))
    zero1 = peak_memory(cfg, _stage(zero=1))
    sharded = peak_memory(cfg, _stage(zero=3))
    assert kept.model_states == pytest.approx(zero1.model_states)
    assert kept.model_states > sharded.model_states


def test_hybrid_sharding_under_a_pipeline_is_refused_by_name():
    with pytest.raises(ConfigError, match="shard=2 with zero=3 and pp=2"):
        Layout(dp=4, pp=2, zero=3, shard=2, zero3_pipeline="per-step")
    with pytest.raises(ConfigError, match="zero3_pipeline='sometimes'"):
        Layout(zero3_pipeline="sometimes")
    with pytest.raises(ConfigError, match="zero3_pipeline='per-step'"):
        _stage(zero=3, zero3_pipeline="per-step").check_paracube_software()
