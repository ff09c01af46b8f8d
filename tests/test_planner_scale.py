"""The planner at scale and on Hopper (pure math): data-parallel rings across nodes use every
member's rail, the last gradient bucket cannot hide, so the step slows as replicas are added
at fixed work per replica; Hopper runs at its measured sustained rate and FlashAttention-2's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.choices import GRAD_BUCKETS
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.models.shapes import parameter_count
from paracube.planner import hardware as hw
from paracube.planner.collectives import OVERLAP_SLOWDOWN, ring
from paracube.planner.dp_comm import bucket_elements, dp_link, reduction_time
from paracube.planner.layout import Layout
from paracube.planner.time_model import Cluster, attention_core, estimate

A100 = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))
H100 = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def test_data_parallel_time_grows_with_replicas_at_fixed_work_per_replica():
    """GPT-3 175B at tp 8 × pp 8, the same micro-batches per replica: 96 → 288 replicas
    leaves the compute unchanged and makes the exposed reduction larger (Megatron-Core's
    bucket grows with the group, 1M elements per rank, and its ring has 2(dp − 1) steps), so
    the step time grows."""
    cfg = preset("gpt3-175b")
    base = dict(tp=8, pp=8, micro_batch=1, microbatches=32, schedule="1f1b", recompute="full")
    for bucket in GRAD_BUCKETS:  # the ring's latency steps grow with any bucket
        small, large = (
            estimate(cfg, Layout(dp=dp, grad_bucket=bucket, **base), A100) for dp in (96, 288)
        )
        assert large.compute == small.compute
        assert large.dp_exposed > small.dp_exposed > 0
        assert large.step_time > small.step_time
    megatron = [Layout(dp=dp, grad_bucket="megatron") for dp in (96, 8)]
    assert [bucket_elements(L, 2) for L in megatron] == [96e6, 40e6]


def test_ring_across_nodes_runs_on_every_members_rail():
    """NCCL runs one ring per NIC: a group with k members per node spreads its inter-node
    traffic over k rails (k × the per-GPU InfiniBand bandwidth, at most NVLink's); with tensor
    parallelism filling the node each group has one member per node and one rail; inside a
    node the ring is on NVLink."""
    fsdp = Layout(dp=64, zero=3)
    assert dp_link(fsdp, A100).bandwidth == 8 * A100.inter.bandwidth
    assert dp_link(fsdp, H100).bandwidth == min(H100.intra.bandwidth, 8 * H100.inter.bandwidth)
    assert dp_link(Layout(dp=64, tp=8), A100) == A100.inter
    assert dp_link(Layout(dp=32, tp=2), A100).bandwidth == 4 * A100.inter.bandwidth
    assert dp_link(Layout(dp=4, tp=2), A100) == A100.intra
    # one Ethernet NIC per node: a lone group gets all of it, eight groups an eighth each
    eth = Cluster(
        hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ethernet-100g")
    )
    nic = hw.interconnect("ethernet-100g").bandwidth
    assert dp_link(Layout(dp=16), eth).bandwidth == pytest.approx(nic)
    assert dp_link(Layout(dp=16, tp=8), eth).bandwidth == pytest.approx(nic / 8)


def test_last_bucket_is_exposed_even_when_the_reduction_hides():
    """A model whose whole reduction hides behind the last backward still waits for the last
    bucket: exactly its ring on the group's link — plus the slowdown of the backward the
    hidden reduction runs beside (OVERLAP_SLOWDOWN of its seconds)."""
    cfg = preset("gpt3-1.3b")
    layout = Layout(dp=64, micro_batch=8, microbatches=1)
    est = estimate(cfg, layout, A100)
    link = dp_link(layout, A100)
    bucket = 25 * 2**20  # paracube's 25 MiB buckets (fp32 gradients: --grad-reduce fp32)
    reduction = ring(4 * parameter_count(cfg), 64, link)
    assert reduction < 2 / 3 * est.compute  # all of it hides behind the backward
    assert est.dp_exposed == pytest.approx(ring(bucket, 64, link) + OVERLAP_SLOWDOWN * reduction)


def test_zero3_always_waits_for_its_root_units_reduce_scatter():
    """ZeRO-3 reduces unit by unit, not in buckets: its last reduce-scatter is the root
    unit's — the embedding, final norm and head, whose gradients complete only with the
    backward. Llama 3 8B's 128K-token vocabulary makes that 1.05B of its 8B parameters: at
    64 GPUs, where the rest hides behind the backward, the step still waits for the root's
    half ring (the planner had charged a 40M-element bucket's)."""
    from paracube.models import shapes
    from paracube.planner.dp_comm import dp_exposed_time, scatter_time

    cfg = preset("llama3-8b")
    layout = Layout(dp=64, zero=3, micro_batch=2, microbatches=1)
    link = dp_link(layout, H100)
    params = parameter_count(cfg)
    root = shapes.embed_params(cfg) + shapes.head_params(cfg) + shapes.norm_params(cfg)
    assert root == pytest.approx(params - cfg.n_layers * shapes.block_params(cfg))
    # behind a backward long enough to hide the whole reduction, what is left is the root's
    # reduce-scatter, and the slowdown of the compute the rest runs beside
    backward_hides_all = 1e3
    exposed = dp_exposed_time(layout, H100, params, backward_hides_all, cfg, cfg.n_layers)
    reduction = reduction_time(params, layout, link, 2, cfg.n_layers)
    root_scatter = scatter_time(root, layout, link, 2)
    assert exposed == pytest.approx(root_scatter + OVERLAP_SLOWDOWN * reduction)
    assert root_scatter > scatter_time(40e6, layout, link, 2)


def test_a_runs_bucket_size_is_planned_as_it_runs():
    """paracube train --bucket-mb 100: Layout.from_config carries it, the last bucket the plan
    waits for is that size (GPT-3 1.3B's reduction hides behind its backward, the 100 MiB
    bucket does not), the emitted flags run it again, and a size beside another stack's
    buckets is refused."""
    from paracube.cli import build_parser, config_from_args

    argv = ["--dp", "64", "--model", "gpt3-1.3b", "--micro-batch", "8", "--bucket-mb", "100"]
    run = config_from_args(build_parser().parse_args(["train", *argv]))
    layout = Layout.from_config(run)
    assert layout.bucket_mb == 100 and "--bucket-mb 100" in layout.to_args("fp32")
    cfg, link = preset("gpt3-1.3b"), dp_link(layout, A100)
    reduction = ring(4 * parameter_count(cfg), 64, link)
    est = estimate(cfg, layout, A100, "fp32")
    assert est.dp_exposed == pytest.approx(
        ring(100 * 2**20, 64, link) + OVERLAP_SLOWDOWN * reduction
    )
    with pytest.raises(ConfigError, match="bucket_mb=100 with grad_bucket='megatron'"):
        layout.replace(grad_bucket="megatron")


def test_communication_beside_compute_slows_it():
    """Collectives hidden behind compute cost the compute they run beside 18.9 % of their
    seconds (arXiv 2507.03114): a reduction left until after the backward costs no such
    slowdown, and ZeRO-3's per-micro-batch gathers and gradient reduce-scatters, all hidden,
    cost more with more micro-batches than the reduction alone."""
    cfg = preset("gpt3-1.3b")
    overlapped = estimate(cfg, Layout(dp=64, micro_batch=8, microbatches=1), A100)
    after = estimate(
        cfg, Layout(dp=64, micro_batch=8, microbatches=1, overlap_grad_reduce=False), A100
    )
    link = dp_link(Layout(dp=64), A100)
    assert after.dp_exposed == pytest.approx(ring(4 * parameter_count(cfg), 64, link))
    assert overlapped.dp_exposed < after.dp_exposed
    one, four = (
        estimate(cfg, Layout(dp=64, zero=3, micro_batch=8, microbatches=m), A100) for m in (1, 4)
    )
    gather = ring(2 * parameter_count(cfg), 64, link) / 2
    scatter = ring(4 * parameter_count(cfg), 64, link) / 2  # fp32 gradients
    units = (24 + 23 + 24) * 63 * link.latency  # a ring per unit: zero3_collectives
    assert four.dp_exposed - one.dp_exposed == pytest.approx(
        OVERLAP_SLOWDOWN * 3 * (2 * gather + scatter + units)
    )


def test_zero2_and_zero3_reduce_scatter_every_micro_batch():
    """ZeRO-2/3 keep no full gradients between micro-batches — the engine's sharded wrapper
    cannot accumulate locally (``no_sync`` is refused) — so each backward reduce-scatters
    its own: without overlap a ZeRO-2 step waits for m reduce-scatters (half a ring of fp32
    gradients each) and the one parameter all-gather after the optimizer step; ZeRO-1
    all-reduces once whatever m."""
    from paracube.data_parallel.zero3 import ShardedDataParallel

    assert not ShardedDataParallel.accumulates_locally
    cfg = preset("gpt3-1.3b")
    n = parameter_count(cfg)
    link = dp_link(Layout(dp=64), A100)
    scatter, gather = ring(4 * n, 64, link) / 2, ring(2 * n, 64, link) / 2
    for m in (1, 4):
        after = dict(dp=64, micro_batch=8, microbatches=m, overlap_grad_reduce=False)
        zero2 = estimate(cfg, Layout(**after, zero=2), A100)
        zero1 = estimate(cfg, Layout(**after, zero=1), A100)
        assert zero2.dp_exposed == pytest.approx(m * scatter + gather)
        assert zero1.dp_exposed == pytest.approx(2 * scatter + gather)
    # overlapped, ZeRO-3's extra reduce-scatters: test_communication_beside_compute_slows_it


def test_zero_gathers_and_scatters_cost_what_the_link_measured_for_them():
    """ZeRO's all-gathers and reduce-scatters are each half a ring all-reduce's traffic, at
    the cost the link measured for such a pair against the all-reduce (1 on NCCL; gloo's
    pair runs 2–3× its all-reduce, `paracube plan --calibrate`): a ZeRO-3 reduction scales by
    the ratio, a plain all-reduce does not."""
    from dataclasses import replace

    n = parameter_count(preset("gpt3-1.3b"))
    link = dp_link(Layout(dp=64), A100)
    gloo_like = replace(link, pair_cost_ratio=2.5)
    zero3, plain = Layout(dp=64, zero=3), Layout(dp=64)
    assert reduction_time(n, zero3, gloo_like, 2) == pytest.approx(
        2.5 * reduction_time(n, zero3, link, 2)
    )
    assert reduction_time(n, plain, gloo_like, 2) == reduction_time(n, plain, link, 2)


def test_gradients_are_reduced_in_the_dtype_the_job_states():
    """Under bf16 the engine accumulates and reduces gradients in fp32 unless told
    --grad-reduce compute (as Megatron-LM forces for bf16): the planner's reduction moves 4
    bytes per gradient by default and 2 with compute; ZeRO-3's parameter gathers stay in bf16
    whatever the gradients; and the model states hold 4- or 2-byte gradients to match."""
    from paracube.planner.layout_memory import peak_memory

    cfg = preset("gpt3-1.3b")
    n = parameter_count(cfg)
    after = dict(dp=64, micro_batch=8, microbatches=1, overlap_grad_reduce=False)
    link = dp_link(Layout(dp=64), A100)
    fp32, compute = (
        estimate(cfg, Layout(**after, grad_reduce=r), A100) for r in ("fp32", "compute")
    )
    assert fp32.dp_exposed == pytest.approx(ring(4 * n, 64, link))
    assert compute.dp_exposed == pytest.approx(ring(2 * n, 64, link))
    zero3 = Layout(dp=64, zero=3)
    assert reduction_time(n, zero3, link, 2) == pytest.approx(
        ring(4 * n, 64, link) / 2 + ring(2 * n, 64, link)
    )
    states = {
        r: peak_memory(cfg, Layout(micro_batch=1, grad_reduce=r)).model_states
        for r in ("fp32", "compute")
    }
    assert states["fp32"] - states["compute"] == pytest.approx(2 * n, rel=0.01)
    with pytest.raises(ConfigError, match="unknown grad_reduce 'int8'"):  # never a silent guess
        estimate(cfg, Layout(**after, grad_reduce="int8"), A100)


def test_zero3_backward_gathers_without_prefetch_are_waited_for():
    """FSDP1's BACKWARD_POST (Composer's default) gathers a unit's parameters only after the
    backward before it: every micro-batch's backward waits for a half ring of the rank's
    bf16 weights. With prefetching (paracube, FSDP2) the same gathers hide behind compute;
    below ZeRO-3 there is nothing to gather, and the flag changes nothing."""
    cfg = preset("gpt3-13b")
    n = parameter_count(cfg)
    for m in (1, 3):
        base = dict(dp=16, zero=3, micro_batch=2, microbatches=m, recompute="none")
        pre, post = (
            estimate(cfg, Layout(**base, backward_prefetch=p), H100) for p in (True, False)
        )
        link = dp_link(Layout(**base), H100)
        # a half ring of the weights, unit by unit: one ring per block (zero3_collectives)
        gather = ring(2 * n, 16, link) / 2 + (cfg.n_layers - 1) * 15 * link.latency
        # the prefetched gathers hid and slowed the compute beside them; waited for, they
        # no longer slow it but cost their own seconds, once per micro-batch
        assert post.dp_exposed - pre.dp_exposed == pytest.approx(
            m * gather * (1 - OVERLAP_SLOWDOWN)
        )
        assert post.compute == pre.compute and post.step_time > pre.step_time
    zero1 = dict(dp=16, zero=1, micro_batch=2, microbatches=2)
    assert estimate(cfg, Layout(**zero1, backward_prefetch=False), H100) == estimate(
        cfg, Layout(**zero1), H100
    )


def test_the_layout_carries_the_jobs_gradient_dtype():
    """A train job's --grad-reduce reaches the planner's layout and back into the launch
    flags (one translation each way)."""
    from paracube.config import TrainConfig

    job = TrainConfig(model=preset("nano"), precision="bf16", grad_reduce="compute")
    layout = Layout.from_config(job)
    assert layout.grad_reduce == "compute"
    assert "--grad-reduce compute" in " ".join(layout.to_args("bf16"))
    assert "--grad-reduce" not in " ".join(Layout().to_args("bf16"))  # fp32: the default


def test_hopper_runs_at_its_measured_sustained_rates():
    """H100/H200: matmuls at the sustained rate measured at the power limit with the whole
    node busy (698.6 of 989 TFLOP/s), FlashAttention-2's forward at its published 35 % of peak; the
    A100 keeps the base-clock fraction and FlashAttention-2's 50 %."""
    h100, a100 = hw.gpu("h100"), hw.gpu("a100-80gb")
    assert h100.sustained_fraction == pytest.approx(698.6 / 989)
    assert a100.sustained_fraction == pytest.approx(1095 / 1410)
    cfg = preset("llama3-8b")
    layout = Layout(micro_batch=1, microbatches=1)
    seconds, flops = attention_core(cfg, layout, h100)
    assert seconds == pytest.approx(flops / (0.35 * 989e12))
    seconds, flops = attention_core(cfg, layout, a100)
    assert seconds == pytest.approx(flops / (0.50 * 312e12))


def test_zero3_pays_a_ring_latency_per_unit():
    """ZeRO-3 gathers and reduce-scatters unit by unit (dp_comm.zero3_collectives; the
    engine's own counts: tests/test_zero.py), and each collective is a ring with its
    (n − 1) latency steps: over 64 ranks a 24-block model's waited backward gathers pay 23
    more of them per micro-batch than one gather of all its parameters, and its last
    micro-batch's gathers and reduce-scatter 24 + 23 + 24 more."""
    from paracube.planner.dp_comm import waited_gathers, zero3_collectives

    cfg = preset("gpt3-1.3b")
    n = parameter_count(cfg)
    layout = Layout(dp=64, zero=3, micro_batch=1, microbatches=4, backward_prefetch=False)
    link = dp_link(layout, A100)
    step = 63 * link.latency  # one half ring's latency over 64 ranks
    assert zero3_collectives(cfg.n_layers) == (25, 24, 25)
    blocks = cfg.n_layers
    assert waited_gathers(layout, link, n, 2, blocks) - waited_gathers(
        layout, link, n, 2
    ) == pytest.approx(4 * 23 * step)
    assert reduction_time(n, layout, link, 2, blocks) - reduction_time(
        n, layout, link, 2
    ) == pytest.approx((24 + 23 + 24) * step)
    assert reduction_time(n, Layout(dp=64, zero=2), link, 2, blocks) == reduction_time(
        n, Layout(dp=64, zero=2), link, 2
    )  # ZeRO-2 reduces in buckets, not units


def test_the_export_variants_compute_alike_and_talk_slower():
    """H800 and A800 are H100 and A100 silicon with 8 NVLinks (400 GB/s both ways) against
    18 and 12: one tensor-parallel layout computes in the same time and spends the bandwidth
    part of its collectives 18/8 (12/8) times as long — NCCL's rate per link, and the
    switch's reduction per link on Hopper, are the same on both."""
    cfg = preset("gpt3-13b")
    layout = Layout(dp=1, tp=8, micro_batch=1, microbatches=4, sequence_parallel=True)
    for fast, slow in (("h100", "h800"), ("a100-80gb", "a800")):
        times = {}
        for key in (fast, slow):
            intra = hw.interconnect(hw.DEFAULT_INTRA[key])
            cluster = Cluster(hw.gpu(key), 8, intra, hw.interconnect(hw.DEFAULT_INTER[key]))
            # the collectives' latency steps are the same on both: compare what is left
            no_latency = replace(cluster, intra=replace(intra, latency=0.0))
            times[key] = estimate(cfg, layout, no_latency)
        assert times[slow].compute == pytest.approx(times[fast].compute)
        links = {"h100": 18, "a100-80gb": 12}[fast] / 8
        assert times[slow].tp_comm == pytest.approx(links * times[fast].tp_comm)


def test_nvlink_runs_at_nccls_rate_and_hoppers_switch_reduces():
    """NVLink as NCCL moves data (src/graph/topo.h: 20 GB/s a link on Volta and Ampere, 20.6
    on Hopper; 25 is the line rate): V100 6 links, A100 12, H100 18, A800 and H800 8. On
    Hopper's NVSwitch an all-reduce of B bytes over 8 GPUs takes 2 · 7/8 · B at NVLS's
    480 GB/s bus bandwidth (480 × 8/18 on the H800), an all-gather 7/8 · B at the rings'
    rate; on A100 both run at the rings' 240 GB/s; across nodes no switch reduces."""
    from paracube.planner.collectives import half_ring

    gb = 1e9
    expected = {"nvlink2": 6 * 20, "nvlink3": 12 * 20, "nvlink4": 18 * 20.6,
                "nvlink-400": 8 * 20, "nvlink4-400": 8 * 20.6}  # fmt: skip
    for name, rate in expected.items():
        assert hw.interconnect(name).bandwidth == pytest.approx(rate * gb)
    b = 1e9  # bytes
    for name, allreduce in (("nvlink4", 480), ("nvlink4-400", 480 * 8 / 18)):
        link = replace(hw.interconnect(name), latency=0.0)
        assert ring(b, 8, link) == pytest.approx(2 * 7 / 8 * b / (allreduce * gb))
        assert half_ring(b, 8, link) == pytest.approx(7 / 8 * b / link.bandwidth)
    a100 = replace(hw.interconnect("nvlink3"), latency=0.0)
    assert ring(b, 8, a100) == pytest.approx(2 * half_ring(b, 8, a100))
    across = dp_link(Layout(dp=16, tp=8), H100)  # one rank per node: the network's ring
    assert across.allreduce_bandwidth is None
    assert hw.DEFAULT_INTRA["h800"] == "nvlink4-400" and hw.DEFAULT_INTRA["a800"] == "nvlink-400"
