"""``--offload optimizer`` in the planner: optimizer states in host memory, the step on the
CPU — counted in memory, charged in time, proposed only where a layout needs it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.models.presets import preset
from paracube.planner.layout_memory import stage_bytes
from paracube.planner.time_model import estimate

GPT = preset("gpt3-1.3b")
GPT27 = preset("gpt3-2.7b")


def test_offload_moves_the_optimizer_states_off_the_gpu_and_charges_the_host():
    """A100-80GB, gpt3-1.3b, dp=8: offloaded, the GPU holds Ψ·(2 + 2) bytes of states
    instead of Ψ·(2 + 2 + 12) — the 12 (fp32 master and Adam's moments) are in host memory —
    and the step pays the gradient down and the values up over PCIe (2 + 2 bytes a
    parameter at 32 GB/s) and the CPU's norm and Adam (4 + 28 bytes a parameter of host
    bandwidth), where on the GPU the norm, Adam and the bf16 write-back (4 + 28 + 6 bytes)
    were on HBM."""
    from paracube.models.shapes import parameter_count
    from paracube.planner import hardware as hw
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import Cluster

    g = hw.gpu("a100-80gb")
    cluster = Cluster(g, 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))
    base = Layout(dp=8, micro_batch=1, microbatches=8)
    off = replace(base, offload=True)
    gone = (
        stage_bytes(GPT, base, 0, GPT.n_layers).model_states
        - stage_bytes(GPT, off, 0, GPT.n_layers).model_states
    )
    params = parameter_count(GPT)
    assert gone == pytest.approx(12 * params)
    extra = estimate(GPT, off, cluster).optimizer - estimate(GPT, base, cluster).optimizer
    want = 4 * params / g.host_link_bandwidth + 32 * params / g.host_memory_bandwidth
    assert extra == pytest.approx(want - 38 * params / g.memory_rate)


def test_the_search_offloads_only_what_does_not_fit(capsys):
    """gpt3-2.7b on 8 V100-32GB at dp=8 without ZeRO fits only with the optimizer offloaded:
    the search proposes that; at dp=8 with ZeRO-1 it fits on the GPUs, the best layout keeps
    its optimizer there, and a layout is offloaded only where it does not fit without;
    --offload none refuses the fallback; the launch line runs it."""
    from paracube.cli import build_parser, config_from_args, main
    from paracube.planner import hardware as hw
    from paracube.planner.layout_memory import peak_memory
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    base = ["plan", "--model", "gpt3-2.7b", "--gpus", "8", "--gpu", "v100", "--global-batch", "64",
            "--layout", "dp=8,tp=1,pp=1"]  # fmt: skip
    assert main([*base, "--zero", "0", "--emit", "torchrun"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | dp=8 tp=1 pp=1" in out and "offload |" in out.split("| 1 |")[1].splitlines()[0]
    line = next(x for x in out.splitlines() if x.startswith("torchrun"))
    cfg = config_from_args(build_parser().parse_args(line.split(" -m paracube ", 1)[1].split()))
    assert cfg.offload == "optimizer"
    assert main([*base, "--zero", "1"]) == 0
    assert "offload" not in capsys.readouterr().out.split("| 1 |")[1].splitlines()[0]
    v100 = hw.gpu("v100")
    cluster = Cluster(v100, 8, hw.interconnect("nvlink2"), hw.interconnect("ib-hdr"))
    fixed = {"dp": 8, "tp": 1, "pp": 1, "zero": 1}
    ranked = search(GPT27, cluster, 8, 64, precision="fp16", fixed=fixed).ranked
    offloaded = [c for c in ranked if c.layout.offload]
    assert offloaded  # b=2 fits 34 GB only with its optimizer in host memory
    for c in offloaded:
        assert peak_memory(GPT27, replace(c.layout, offload=False)).total > v100.memory_bytes
    assert main([*base, "--zero", "0", "--offload", "none"]) == 2
