"""Gradient compression in the planner: its bytes and its work in the step time, so that
``paracube plan --compress`` says when it pays (a slow link across nodes) and when it
does not (NVLink, where the reduction hides behind the backward anyway)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.dp_comm import compressed_reduction
from paracube.planner.layout import Layout
from paracube.planner.time_model import Cluster, estimate

GPT = preset("gpt3-1.3b")
ETHERNET = Cluster(
    hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ethernet-100g")
)
NVLINK = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))


@pytest.mark.parametrize(
    "spec,precision", [("bf16", "fp32"), ("topk:0.01", "bf16"), ("powersgd:4", "bf16")]
)
def test_compression_pays_across_ethernet_and_not_over_nvlink(spec, precision):
    """tp=8 filling each node and dp=16 across 16 nodes joined by 100 Gb/s Ethernet (each
    data-parallel group has one member per node, so the eight groups share each node's
    NIC): the compressed step is faster than the plain one (bf16 against an fp32 run's
    4-byte gradients); dp=8 inside one NVLink node: it is not (the plain reduction hides
    behind the backward; compressing only adds work)."""
    across = Layout(dp=16, tp=8, micro_batch=4, microbatches=2, zero=1)
    plain, compressed = (
        estimate(GPT, replace(across, compress=c), ETHERNET, precision).step_time
        for c in ("none", spec)
    )
    assert compressed < plain
    inside = Layout(dp=8, micro_batch=4, microbatches=4, zero=1)
    plain, compressed = (
        estimate(GPT, replace(inside, compress=c), NVLINK, precision).step_time
        for c in ("none", spec)
    )
    assert compressed >= plain


def test_top_k_moves_the_gathered_pairs():
    """topk:0.01 of n 16-bit gradient elements at dp=16: a ring all-gather of 16 ranks'
    ⌈0.01·n⌉ (int32, fp32) pairs moves 15/16 of them, plus 15 latencies."""
    n = 1_000_000
    layout = Layout(dp=16, compress="topk:0.01")
    link = ETHERNET.inter
    comm, _ = compressed_reduction(layout, GPT, ETHERNET.gpu, link, n, GPT.n_layers)
    assert comm == pytest.approx(15 / 16 * 16 * 10_000 * 8 / link.bandwidth + 15 * link.latency)
