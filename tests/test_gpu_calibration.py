"""Reading a GPU calibration (``paracube calibrate`` on a CUDA machine) into the planner.

The measuring itself needs a GPU (``benchmarks/gpu_check.sh``); what the planner makes of
a measured section is pure arithmetic, checked here on a section made up from the time
model's own GEMM model, so that the right reading reproduces it exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paracube.calibrate_gpu import ATTENTION_SHAPE, GEMM_SHAPES
from paracube.cli.calibrate import gpu_lines
from paracube.planner import local
from paracube.planner.hardware import GPUS, catalog_key
from paracube.planner.time_model import wave_efficiency

SUSTAINED = 800e12  # the made-up GPU's tensor-core rate before tile and wave losses
SMS = 132


def _section(name: str = "NVIDIA H200") -> dict:
    bf16 = {f"{m}x{n}x{k}": SUSTAINED * wave_efficiency(m, n, SMS) for m, n, k in GEMM_SHAPES}
    return {
        "gpu": {
            "name": name,
            "sms": SMS,
            "memory_bytes": 150e9,
            "torch": "2.x",
            "cuda": "13.0",
            "matmul": {"bf16": bf16, "fp32": 50e12, "tf32": 400e12},
            "head": {"plain": 130e12, "padded": 600e12},
            "attention": {
                "shape": list(ATTENTION_SHAPE),
                "forward_s": 1e-3,
                "forward_backward_s": 3.5e-3,
                "forward_flops": 500e12,
                "backward_flops": 500e12,
                "flops": 500e12,
            },
            "memory_bandwidth": 4.3e12,
        }
    }


@pytest.mark.parametrize(
    "device, key",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA H800", "h800"),
        ("NVIDIA A800-SXM4-80GB", "a800"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_cuda_device_names_find_their_catalog_entry(device, key):
    assert catalog_key(device) == key


def test_calibrated_peak_is_the_block_shapes_rate_before_their_waves():
    """Each measured rate already lost its shape's tile and wave quantization: the peak is
    the block shapes' median rate over their wave efficiencies, so the time model (which
    derates every GEMM by its own) reproduces every measured shape of a GPU whose only
    loss is those waves."""
    gpu, link = local.calibrated_gpu(_section())
    assert gpu.peak_flops == GPUS["h200"].peak_flops  # MFU stays against the datasheet peak
    assert gpu.peak_flops * gpu.sustained_fraction == pytest.approx(SUSTAINED)
    for m, n, _ in GEMM_SHAPES:
        modelled = gpu.peak_flops * gpu.sustained_fraction * wave_efficiency(m, n, gpu.sms)
        assert modelled == pytest.approx(SUSTAINED * wave_efficiency(m, n, SMS))
    # fp32 and TF32: the time model's derating gives back the measured rates
    fraction = gpu.sustained_fraction
    assert gpu.rate("fp32") * fraction == pytest.approx(50e12)
    assert gpu.rate("tf32") * fraction == pytest.approx(400e12)
    assert gpu.attention_rate == 500e12
    # a GPU the catalog does not list: its measured rate is its peak
    unlisted, _ = local.calibrated_gpu(_section("NVIDIA GeForce RTX 4090"))
    assert unlisted.peak_flops == pytest.approx(SUSTAINED) and unlisted.sustained_fraction == 1
    assert gpu.hbm_bandwidth == 4.3e12 and gpu.memory_bytes == 150e9
    # what one GPU cannot measure comes from its catalog entry
    assert gpu.host_link_bandwidth == GPUS["h200"].host_link_bandwidth
    assert link.name.startswith("NVLink 4")


def test_a_calibration_without_a_gpu_section_has_no_calibrated_gpu():
    assert local.calibrated_gpu({"matmul_flops_per_thread": 1e9}) is None


def test_the_report_sets_each_shape_beside_both_models():
    lines = gpu_lines(_section())
    rows = [line for line in lines if line.startswith("  ")]
    assert len(rows) == len(GEMM_SHAPES)
    h200 = GPUS["h200"]
    for row, (m, n, _) in zip(rows, GEMM_SHAPES):
        measured, calibrated, sheet = (float(x) for x in row.split(": ")[1].split(" | "))
        waves = wave_efficiency(m, n, SMS)
        assert measured == calibrated == round(SUSTAINED * waves / 1e12)
        assert sheet == round(h200.peak_flops * h200.sustained_fraction * waves / 1e12)
    assert "catalog entry: H200 SXM" in lines[0]
    assert any("plain F.linear 130, padded as the GPT runs it 600 TFLOP/s" in x for x in lines)
    # a GPU the catalog does not list is still reported, without datasheet columns
    unlisted = gpu_lines(_section("NVIDIA GeForce RTX 4090"))
    assert "not in the planner's catalog" in unlisted[0]
    assert all(line.endswith(" | -") for line in unlisted if line.startswith("  "))


def _catalog_h200_measured() -> dict:
    """A calibration whose GPU measured exactly the catalog's H200: every figure the
    planner reads equals the datasheet entry's."""
    from paracube.planner.hardware import FLASH2_HOPPER, FLASH2_HOPPER_BACKWARD

    h200 = GPUS["h200"]
    data = _section()
    sustained = h200.peak_flops * h200.sustained_fraction
    gpu = data["gpu"]
    gpu["matmul"] = {
        "bf16": {f"{m}x{n}x{k}": sustained * wave_efficiency(m, n, SMS) for m, n, k in GEMM_SHAPES},
        "fp32": h200.fp32_flops,
        "tf32": h200.tf32_flops,
    }
    gpu["attention"].update(
        flops=FLASH2_HOPPER, forward_flops=FLASH2_HOPPER, backward_flops=FLASH2_HOPPER_BACKWARD
    )
    # what a copy moves on the catalog's H200: the datasheet's bandwidth at the measured fraction
    gpu["memory_bandwidth"], gpu["memory_bytes"] = h200.memory_rate, h200.memory_bytes
    cpu = dict.fromkeys(local.REQUIRED, 1.0)
    return {**cpu, **data}


def test_plan_on_the_calibrated_gpu_is_the_plan_on_its_catalog_twin(tmp_path, monkeypatch, capsys):
    """``paracube plan --gpu calibrated`` plans on the measured GPU: measured exactly as the
    catalog's H200, its plan is the H200's, figure for figure (the name aside); without a
    measured GPU it is refused in one line."""
    import json

    from paracube.cli import main

    path = tmp_path / "calibration.json"
    monkeypatch.setattr("paracube.planner.local.DEFAULT_PATH", path)
    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--top", "3"]
    path.write_text(json.dumps({k: 1.0 for k in local.REQUIRED}))  # a CPU-only calibration
    assert main([*argv, "--gpu", "calibrated"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--gpu calibrated: no GPU measured in" in err and len(err.splitlines()) == 1
    path.write_text(json.dumps(_catalog_h200_measured()))
    outputs = []
    for gpu in ("h200", "calibrated"):
        assert main([*argv, "--gpu", gpu]) == 0
        outputs.append(capsys.readouterr().out)
    catalog, calibrated = outputs
    assert "NVIDIA H200 (calibrated)" in calibrated
    assert calibrated.replace("NVIDIA H200 (calibrated)", GPUS["h200"].name) == catalog


RECORDED = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "gpu_h200")


@pytest.mark.parametrize(
    "run, micro_batch, precision, recompute",
    [("none", 8, "bf16", "none"), ("selective", 8, "bf16", "selective"),
     ("full", 8, "bf16", "full"), ("fp32", 4, "fp32", "none")],
)  # fmt: skip
def test_the_planner_against_the_recorded_h200_runs(
    monkeypatch, run, micro_batch, precision, recompute
):
    """The GPU check's recorded runs on one H200 (benchmarks/results/gpu_h200: GPT-3 1.3B,
    its calibration and each run's metrics), replayed through ``--predict``'s report: the
    step predicted with the measured GPU and with the catalog's H200 within ±15 % of the
    measured, and the CUDA allocator's peak the counted memory plus the loss backward's
    fp32 gradients, within 100 MiB (cuBLAS's workspace: 67-69)."""
    import json
    import re
    from types import SimpleNamespace

    from paracube import report
    from paracube.config import ParallelConfig, TrainConfig
    from paracube.models.presets import preset

    monkeypatch.setattr("paracube.planner.local.DEFAULT_PATH", Path(RECORDED) / "calibration.json")
    cfg = TrainConfig(
        model=preset("gpt3-1.3b"), parallel=ParallelConfig(), micro_batch=micro_batch,
        precision=precision, recompute=recompute, steps=12,
    )  # fmt: skip
    with open(os.path.join(RECORDED, f"train_{run}.jsonl")) as f:
        history = [SimpleNamespace(**json.loads(line)) for line in f]
    text = report.prediction(cfg, history, threads=16, local_ranks=1, device_name="NVIDIA H200")
    ratios = [float(r) for r in re.findall(r"predicted/measured ([\d.]+)", text)]
    assert len(ratios) == 2 and all(0.85 <= r <= 1.15 for r in ratios), text
    left = re.search(r"allocator − these: (-?\d+) MiB", text)
    assert left and 0 <= int(left[1]) < 100, text
    # the planner's fit figure: the same terms, its allowance on states and activations on
    # top — never below the allocator's peak, nor above it by more than that allowance
    from paracube.planner.layout_memory import FRAGMENTATION

    fit = re.search(r"planner/allocator ([\d.]+)", text)
    assert fit and 1.0 <= float(fit[1]) <= 1.0 + FRAGMENTATION, text


def test_the_loss_backward_transient_sits_on_the_last_stage_under_paracubes_loss():
    """Two fp32 gradients of the logits' shape (this rank's 1/tp of the vocabulary) on the
    last pipeline stage; none under a loss that computes its gradient in place."""
    from dataclasses import replace

    from paracube.models.presets import preset
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = preset("gpt3-1.3b")
    n_logits = 8 * cfg.seq_len * cfg.vocab_size  # micro-batch 8
    (serial,) = stage_memory(cfg, Layout(micro_batch=8))
    assert serial.transient == 2 * n_logits * 4
    first, last = stage_memory(cfg, Layout(pp=2, micro_batch=8, microbatches=2))
    assert first.transient == 0 and last.transient == 2 * n_logits * 4
    (tp2,) = stage_memory(cfg, Layout(tp=2, micro_batch=8))
    # the engine pads the vocabulary to divide by tp: 50,257 → two shards of 25,129
    assert tp2.transient == 2 * 8 * cfg.seq_len * 25129 * 4
    (fused,) = stage_memory(cfg, replace(Layout(micro_batch=8), loss="fused"))
    assert fused.transient == 0 and fused.total == serial.total - serial.transient


def test_a_measured_attention_backward_rate_times_the_backward():
    """FlashAttention's backward does 2.5× the forward's work; at a measured backward rate
    half the forward's, the layer's backward grows by exactly that much more (2.5 × the
    core's forward), and its forward does not change."""
    from dataclasses import replace

    from paracube.models.presets import preset
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import attention_core, layer_time

    cfg, layout = preset("gpt3-1.3b"), Layout(micro_batch=8)
    gpu, _ = local.calibrated_gpu(_section())
    same = replace(gpu, attention_backward_rate=gpu.attention_rate)
    slow = replace(gpu, attention_backward_rate=gpu.attention_rate / 2)
    (f_same, b_same, _), (f_slow, b_slow, _) = (
        layer_time(cfg, layout, same),
        layer_time(cfg, layout, slow),
    )
    core_forward = attention_core(cfg, layout, gpu)[0]
    assert f_slow == f_same
    assert b_slow - b_same == pytest.approx(2.5 * core_forward)


def test_hoppers_flashattention2_backward_runs_at_its_published_share_of_the_forward():
    """The catalog's Hopper entries run FlashAttention-2's backward at 318/370 of its forward
    rate (FlashAttention-3's H100 benchmarks of it at 8K tokens): the core's backward,
    2.5× the forward's work, takes 370/318 × 2.5 × its forward — on the 500 W variant too,
    scaled alike; Ampere's one rate covers both passes (2.5× exactly)."""
    from paracube.models.presets import preset
    from paracube.planner import hardware as hw
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import attention_core, attention_core_backward

    cfg, layout = preset("llama3-8b"), Layout(micro_batch=1)
    for key, share in (("h100", 318 / 370), ("h200", 318 / 370), ("h800", 318 / 370),
                       ("h100-96gb-500w", 318 / 370), ("a100-80gb", 1.0)):  # fmt: skip
        gpu = hw.gpu(key)
        forward = attention_core(cfg, layout, gpu)[0]
        backward = attention_core_backward(layout, forward, gpu)
        assert backward == pytest.approx(2.5 * forward / share), key
    assert hw.gpu("h100").attention_backward_rate == pytest.approx(0.35 * 989e12 * 318 / 370)


def test_flashattention3_runs_at_its_published_speed_up_on_hopper_alone():
    """attention=fused-v3 times the core at the bottom of FlashAttention-3's stated 1.5–2.0×
    over FlashAttention-2 (its abstract), forward and backward — 52 % and 45 % of an H100's
    peak against 35 % and 30 % —; pads a head to its sm90 kernels' sizes (80 → 96, 160 →
    192, which FlashAttention-2 runs at 160); runs Gemma 2's scores' soft cap; and is
    refused off Hopper and outside 16-bit and FP8 operands, in plans and in estimate."""
    from paracube.errors import ConfigError
    from paracube.models.presets import preset
    from paracube.planner import hardware as hw
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import (
        Cluster,
        attention_core,
        attention_core_backward,
        estimate,
        kernel_head_dim,
        kernel_refusal,
    )

    cfg, h100 = preset("llama3-8b"), hw.gpu("h100")
    v2, v3 = Layout(micro_batch=1), Layout(micro_batch=1, attention="fused-v3")
    f2, f3 = attention_core(cfg, v2, h100)[0], attention_core(cfg, v3, h100)[0]
    assert f3 == pytest.approx(f2 / 1.5)
    b2, b3 = attention_core_backward(v2, f2, h100), attention_core_backward(v3, f3, h100)
    assert b3 == pytest.approx(b2 / 1.5)
    assert (kernel_head_dim("fused-v3", 80), kernel_head_dim("fused-v3", 160)) == (96, 192)
    assert kernel_head_dim("fused", 160) == 160
    assert v3.model_refusal(preset("gemma2-2b")) == ""
    assert kernel_refusal("fused-v3", h100, "bf16") == ""
    assert "runs on Hopper GPUs" in kernel_refusal("fused-v3", hw.gpu("a100-80gb"), "bf16")
    assert "takes 16-bit" in kernel_refusal("fused-v3", h100, "tf32")
    a100 = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))
    with pytest.raises(ConfigError, match="FlashAttention-3 runs on Hopper"):
        estimate(cfg, Layout(dp=8, micro_batch=1, attention="fused-v3"), a100)


def test_the_catalog_moves_memory_at_the_measured_hbm_rate():
    """The catalog's Hopper entries move memory-bound work (element-wise passes, the loss,
    the optimizer) at the rate the recorded H200 copy reached — 89 % of the datasheet's
    4,800 GB/s — not at the datasheet figure; the A100s at their cited measurements, a
    streaming kernel's 85–90 %; a GPU with no measurement at its datasheet's."""
    import json

    from paracube.planner.layout import Layout
    from paracube.planner.time_model import optimizer_time

    with open(os.path.join(RECORDED, "calibration.json")) as f:
        copied = json.load(f)["gpu"]["memory_bandwidth"]
    h200 = GPUS["h200"]
    assert h200.memory_rate == pytest.approx(copied, rel=1e-3)
    assert GPUS["h100"].memory_rate / GPUS["h100"].hbm_bandwidth == pytest.approx(
        copied / 4.8e12, rel=1e-3
    )
    for key in ("a100-80gb", "a100-40gb"):
        assert 0.84 < GPUS[key].memory_rate / GPUS[key].hbm_bandwidth < 0.9
    assert GPUS["v100"].memory_rate == GPUS["v100"].hbm_bandwidth
    # the optimizer step of one fp32-mastered bf16 parameter: 4 + 7·4 + (4 + 2) bytes
    params = 1e9
    assert optimizer_time(Layout(), h200, params, 2) == pytest.approx(38 * params / copied, 1e-3)
