"""GPU checks (NCCL): skipped on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.test_cli import run_cli


@pytest.mark.cuda
def test_train_on_gpus_with_nccl(tmp_path):
    """dp over every local GPU (at least 1) through the elastic launcher, on NCCL."""
    from paracube.metrics import read_metrics

    n = min(torch.cuda.device_count(), 4)
    metrics = tmp_path / "m.jsonl"
    proc = run_cli(
        "train",
        "--dp",
        str(n),
        "--model",
        "tiny",
        "--steps",
        "20",
        "--metrics",
        str(metrics),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(str(metrics))
    assert records[-1]["loss"] < records[0]["loss"]
    if n > 1:
        assert records[-1]["comm"]["all_reduce/grad"]["bytes"] == 875_264 * 4


@pytest.mark.cuda
def test_model_matches_on_cpu_and_gpu():
    from paracube.models.gpt import GPT, lm_loss
    from paracube.models.presets import preset

    torch.manual_seed(0)
    cpu = GPT(preset("nano"))
    gpu = GPT(preset("nano")).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randint(0, 256, (2, 64))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.testing.assert_close(
        lm_loss(gpu(x.cuda()), x.cuda()).cpu(), lm_loss(cpu(x), x), rtol=1e-4, atol=1e-5
    )


@pytest.mark.cuda
@pytest.mark.parametrize("zero", [1, 3])
def test_zero_bf16_on_gpu_reports_cuda_memory(tmp_path, zero):
    """ZeRO with bf16 on NCCL: training proceeds and every step reports the CUDA
    allocator's peak beside the counted model states."""
    from paracube.metrics import read_metrics

    n = min(torch.cuda.device_count(), 2)
    metrics = tmp_path / "m.jsonl"
    proc = run_cli(
        "train",
        "--dp",
        str(n),
        "--zero",
        str(zero),
        "--precision",
        "bf16",
        "--recompute",
        "full",
        "--model",
        "tiny",
        "--steps",
        "10",
        "--metrics",
        str(metrics),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(str(metrics))
    assert records[-1]["loss"] < records[0]["loss"]
    mem = records[-1]["memory"]
    assert mem["cuda_max_allocated"] >= mem["weights"] + mem["optimizer"]


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_offloaded_optimizer_trains_as_on_the_gpu(tmp_path, precision):
    """--offload optimizer: the losses equal the run with the optimizer on the GPU (the
    same fp32 AdamW, stepped by the CPU), and the GPU's memory record holds no optimizer
    state while the host's does."""
    from paracube.metrics import read_metrics

    runs = {}
    for offload in ("none", "optimizer"):
        metrics = tmp_path / f"{offload}.jsonl"
        proc = run_cli(
            "train", "--dp", "1", "--model", "nano", "--steps", "5", "--precision", precision,
            "--offload", offload, "--metrics", str(metrics), "--no-progress",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs[offload] = read_metrics(str(metrics))
    losses = {k: [r["loss"] for r in v] for k, v in runs.items()}
    torch.testing.assert_close(losses["optimizer"], losses["none"], rtol=1e-4, atol=1e-5)
    memory = runs["optimizer"][-1]["memory"]
    assert memory["optimizer"] == 0 and memory["optimizer_host"] > 0
    # the host holds what the GPU's optimizer held and, in fp32 — where the run on the GPU
    # steps the weights themselves — the fp32 copy of the weights the CPU steps
    none = runs["none"][-1]["memory"]
    copy = none["weights"] if precision == "fp32" else 0
    assert memory["optimizer_host"] == none["optimizer"] + copy


@pytest.mark.cuda
def test_phases_time_the_gpu_kernels_not_their_launch():
    """A CUDA kernel is queued and returns at once: the trainer's PhaseTimer waits for the
    device at a phase's edges, so the phase holds its kernels' time (without, it holds a
    few microseconds of launching)."""
    from paracube.metrics import PhaseTimer

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    for sync in (torch.cuda.synchronize, None):
        timer = PhaseTimer(sync)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with timer.phase("forward"):
            start.record()
            for _ in range(20):
                a @ a
            end.record()
        end.synchronize()
        kernels = start.elapsed_time(end) / 1e3
        if sync is not None:
            assert timer.seconds["forward"] >= 0.95 * kernels
        else:
            assert timer.seconds["forward"] < 0.5 * kernels  # what the sync is for


@pytest.mark.cuda
def test_padded_head_on_gpu_matches_the_cpu_model():
    """A vocabulary that is not a multiple of VOCAB_ALIGN (1,001): on the GPU the head
    runs its products padded; loss and every gradient equal the CPU model's (fp32, TF32
    off)."""
    from paracube.models.gpt import GPT, lm_loss
    from paracube.models.presets import preset

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    cfg = preset("nano", vocab_size=1001)
    cpu, gpu = GPT(cfg), GPT(cfg).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randint(0, 1001, (2, 64))
    losses = []
    for model, tokens in ((cpu, x), (gpu, x.cuda())):
        loss = lm_loss(model(tokens), tokens)
        loss.backward()
        losses.append(loss.detach().cpu())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-3, atol=1e-5, msg=name)
