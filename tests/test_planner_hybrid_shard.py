"""Hybrid sharding (HSDP) in the planner: ZeRO-3 within shard groups, replicas across them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.choices import gradient_bytes
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.collectives import group_link, ring
from paracube.planner.dp_comm import dp_exposed_time, zero3_collectives
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.search import search
from paracube.planner.time_model import Cluster, estimate


def _cluster(inter: str = "ib-hdr") -> Cluster:
    return Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect(inter))


def _hsdp(shard: int, **kw) -> Layout:
    return Layout(dp=64, micro_batch=2, microbatches=2, zero=3, shard=shard, **kw)


def test_states_are_sharded_over_the_shard_group_only():
    """Under hybrid sharding each rank holds 1/shard of the states — what a FULL_SHARD group
    of `shard` ranks holds, whatever the replicas — and steps 1/shard of the optimizer."""
    cfg = preset("llama2-7b")
    hybrid = peak_memory(cfg, _hsdp(8))
    group_of_8 = peak_memory(cfg, replace(_hsdp(0), dp=8, microbatches=2))
    full = peak_memory(cfg, _hsdp(0))
    assert hybrid.model_states == pytest.approx(group_of_8.model_states)
    assert hybrid.model_states > 7 * full.model_states  # 64 ranks' shards against 8's
    layout = _hsdp(8)
    assert (layout.shard_group, layout.replicas) == (8, 8)


def test_the_replicas_all_reduce_their_gradient_shards_every_backward():
    """Without overlap nothing hides: the step pays the shard group's own ZeRO-3 collectives
    (as a data-parallel group of `shard` ranks) plus, every micro-batch, one ring all-reduce
    per unit of the rank's gradient shard (params ÷ shard, in the reduce dtype) over the
    replicas — one GPU per node here, each on its own rail: the per-GPU network."""
    cfg, cluster = preset("llama2-7b"), _cluster()
    layout = _hsdp(8, overlap_grad_reduce=False)
    layers = cfg.n_layers
    params = layers * shapes.block_params(cfg) + shapes.embed_params(cfg)
    per_mb = 1.0
    hybrid = dp_exposed_time(layout, cluster, params, per_mb, cfg, layers)
    own = dp_exposed_time(replace(layout, dp=8, shard=0), cluster, params, per_mb, cfg, layers)
    link = group_link(cluster, 8, 8)
    assert link.bandwidth == cluster.inter.bandwidth  # a replica per node: one rail each
    units = zero3_collectives(layers)[2]
    grads = params / 8 * gradient_bytes(2, "fp32")
    allreduce = ring(grads, 8, link) + (units - 1) * 2 * 7 * link.latency
    assert hybrid == pytest.approx(own + layout.microbatches * allreduce)


def test_hybrid_sharding_wins_where_the_network_is_slow_and_costs_little_where_it_is_fast():
    """Why HSDP exists: over 100 Gb/s Ethernet shared by a node's GPUs, FULL_SHARD's
    parameter gathers cross the network in every micro-batch, while hybrid sharding keeps
    them on NVLink and sends only the gradient shards across — faster, the more so in bf16
    reductions (a node moves 2 × 7/8 of the bf16 parameters gathered plus 7/8 of the
    gradients scattered under FULL_SHARD, 2 × 7/8 of the gradients under HSDP, the same
    bytes only when the gradients are reduced in fp32); on InfiniBand the two are within a
    few per cent."""
    cfg = preset("llama2-7b")
    slow, fast = _cluster("ethernet-100g"), _cluster("ib-hdr")
    gains = {}
    for grads in ("fp32", "compute"):
        full = estimate(cfg, _hsdp(0, grad_reduce=grads), slow).step_time
        hybrid = estimate(cfg, _hsdp(8, grad_reduce=grads), slow).step_time
        assert hybrid < full, (grads, hybrid, full)
        gains[grads] = full / hybrid
        on_ib = estimate(cfg, _hsdp(8, grad_reduce=grads), fast).step_time
        assert on_ib == pytest.approx(
            estimate(cfg, _hsdp(0, grad_reduce=grads), fast).step_time, rel=0.05
        )
    assert gains["compute"] > gains["fp32"]


def test_fsdp_stacks_search_hybrid_sharding_and_paracube_does_not():
    """A stack that runs HYBRID_SHARD has one-node shard groups searched beside FULL_SHARD;
    paracube's engine does not run it, so its search never proposes it, and its command
    refuses it."""
    cfg, cluster = preset("llama2-7b"), _cluster("ethernet-100g")
    fixed = {"tp": 1, "pp": 1, "zero": 3, "micro_batch": 2}
    hybrid = search(cfg, cluster, 64, 128, fixed=fixed, hybrid_shard=3, top=5).ranked
    plain = search(cfg, cluster, 64, 128, fixed=fixed, top=5).ranked
    assert hybrid[0].layout.shard == 8
    assert all(c.layout.shard == 0 for c in plain)
    assert hybrid[0].time.step_time < plain[0].time.step_time
    with pytest.raises(ConfigError, match="shard=8: paracube train shards ZeRO over"):
        hybrid[0].layout.to_args()


def test_a_shard_group_is_refused_where_it_cannot_be():
    with pytest.raises(ConfigError, match="zero=1 or 3"):
        Layout(dp=16, zero=2, shard=8)
    with pytest.raises(ConfigError, match="does not divide the data-parallel group"):
        _ = Layout(dp=12, zero=3, shard=8).shard_group
    with pytest.raises(ConfigError, match="shard group"):
        Layout(dp=16, zero=3, shard=-1)
