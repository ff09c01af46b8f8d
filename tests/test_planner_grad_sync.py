"""ZeRO-1's gradient reduction as each stack runs it: an all-reduce of the whole buffer, of
which each rank steps its slice (paracube's engine, InternLM), or the reduce-scatter of
Megatron-Core's distributed optimizer, which leaves each rank only the slice it steps
(``Layout.grad_sync``; megatron/core/distributed/param_and_grad_buffer.py,
``start_grad_sync``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.dp_comm import reduction_time
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.stacks import MEGATRON_CORE, NEMO, STACK_SOFTWARE
from paracube.planner.time_model import Cluster, estimate


def _h100s() -> Cluster:
    return Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def test_a_reduce_scatter_moves_half_an_all_reduces_bytes_in_half_its_steps():
    """Over a network link (no in-switch reduction), a ring all-reduce of B bytes over n ranks
    is 2(n − 1)/n · B / β + 2(n − 1)α; the reduce-scatter that leaves each rank its slice is
    exactly half of it — the ZeRO paper's own split of the all-reduce (Rajbhandari et al.
    2020, §7.2.1)."""
    link = hw.interconnect("ib-ndr")
    params, n = 5e9, 16
    summed = Layout(dp=n, zero=1)
    scattered = replace(summed, grad_sync="reduce-scatter")
    grads = params * 4  # fp32 gradients, the planner's default reduction dtype
    expected_all_reduce = 2 * (n - 1) / n * grads / link.bandwidth + 2 * (n - 1) * link.latency
    assert reduction_time(params, summed, link, 2) == pytest.approx(expected_all_reduce)
    assert reduction_time(params, scattered, link, 2) == pytest.approx(expected_all_reduce / 2)


def test_the_choice_is_zero1s_alone():
    """ZeRO-0 all-reduces (every rank steps every parameter) and ZeRO-2/3 reduce-scatter
    (they keep only their slice) whatever grad_sync says; only ZeRO-1, which keeps the whole
    buffer to accumulate into, can do either."""
    link = hw.interconnect("ib-ndr")
    for zero in (0, 2, 3):
        base = Layout(dp=16, zero=zero)
        assert reduction_time(1e9, replace(base, grad_sync="reduce-scatter"), link, 2) == (
            reduction_time(1e9, base, link, 2)
        )


def test_megatron_cores_distributed_optimizer_reduce_scatters_and_paracube_all_reduces():
    """The Megatron-Core stacks state the reduce-scatter; paracube's engine, whose ZeRO-1 keeps
    the all-reduced buffer (data_parallel/shards.py), and every other stack the all-reduce."""
    assert MEGATRON_CORE["grad_sync"] == NEMO["grad_sync"] == "reduce-scatter"
    assert Layout().grad_sync == "all-reduce"
    for name, facts in STACK_SOFTWARE.items():
        if name not in ("megatron-core", "nemo", "megatron-bridge"):
            assert facts.get("grad_sync", "all-reduce") == "all-reduce", name


def test_a_reduce_scatter_shortens_the_step_by_half_the_all_reduce_and_keeps_the_memory():
    """Llama 3 70B at TP 8 × DP 8 on 64 H100s, ZeRO-1 without overlap (so the whole reduction
    is on the step): the reduce-scatter shortens the step by half the all-reduce of a rank's
    fp32 gradients — its 1/8 of every block, the embedding and the head — over the 8
    replicas, one a node (InfiniBand); the memory is the same, as both keep the whole
    gradient buffer to accumulate into."""
    cfg, cluster = preset("llama3-70b"), _h100s()
    summed = Layout(dp=8, tp=8, micro_batch=1, microbatches=2, zero=1, sequence_parallel=True,
                    overlap_grad_reduce=False, recompute="full")  # fmt: skip
    scattered = replace(summed, grad_sync="reduce-scatter")
    a, b = estimate(cfg, summed, cluster), estimate(cfg, scattered, cluster)
    params = (
        cfg.n_layers * shapes.block_params(cfg, tp=8)
        + shapes.embed_params(cfg, tp=8)
        + shapes.norm_params(cfg)
        + shapes.head_params(cfg, tp=8)
    )
    saved = reduction_time(params, summed, hw.interconnect("ib-ndr"), 2) / 2
    assert a.dp_exposed - b.dp_exposed == pytest.approx(saved)
    assert a.step_time - b.step_time == pytest.approx(saved)
    assert peak_memory(cfg, scattered).total == pytest.approx(peak_memory(cfg, summed).total)


def test_a_bad_grad_sync_is_refused_by_name():
    with pytest.raises(ConfigError, match="grad_sync='scatter'"):
        Layout(dp=8, zero=1, grad_sync="scatter")
    # ZeRO-1 in groups all-reduces over every rank (InternLM's zero1 size): no scatter there
    with pytest.raises(ConfigError, match="grad_sync='reduce-scatter' with shard=8"):
        Layout(dp=16, zero=1, shard=8, grad_sync="reduce-scatter")
    # another stack's software: paracube train's ZeRO-1 all-reduces
    with pytest.raises(ConfigError, match="grad_sync='reduce-scatter'"):
        Layout(dp=8, zero=1, grad_sync="reduce-scatter").check_paracube_software()


def test_a_stack_that_shards_zero1_in_groups_plans_the_reduce_scatter_without_them():
    """InternLM's plans try ZeRO-1 in node-sized groups; asked to reduce-scatter as well, the
    search drops those twins (refused in groups) and plans the rest, instead of failing."""
    from paracube.planner.search import search
    from paracube.planner.stacks import HYBRID_SHARD_STACKS, stack, stack_choices

    found = search(preset("llama3-8b"), _h100s(), 16, 64,
                   fixed=stack("internlm") | {"grad_sync": "reduce-scatter"},
                   allowed=stack_choices("internlm"),
                   hybrid_shard=HYBRID_SHARD_STACKS["internlm"], top=50)  # fmt: skip
    assert found.ranked
    assert all(not c.layout.shard for c in found.ranked)
    assert any(c.layout.zero == 1 for c in found.ranked)
