"""``paracube train`` from the command line: errors (exit 2, one line) and real runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paracube.cli import build_parser, config_from_args, main
from paracube.data.corpus import build_corpus
from paracube.metrics import read_metrics
from tests.helpers import assert_losses_close, serial_reference

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    timeout: float = 240,
    env_extra: dict | None = None,
    module: tuple = ("-m", "paracube"),
):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(
        [sys.executable, *module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("paracube: error: ")
    return err


def test_empty_and_unreadable_data(capsys, tmp_path, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "no text in it (empty)" in error_line(capsys, ["train", "--data", str(empty)])
    locked = tmp_path / "locked.txt"
    locked.write_text("x" * 10_000)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    monkeypatch.setattr(Path, "open", refuse)  # the launcher's sniff, before any process
    assert "cannot read" in error_line(capsys, ["train", "--data", str(locked)])


def test_world_size_mismatch_under_torchrun_env(capsys, monkeypatch):
    """As a rank of a 2-rank torchrun job asked for dp=1: refused before any collective."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = error_line(capsys, ["train", "--dp", "1", "--model", "nano"])
    assert "pp×dp×tp = 1×1×1 = 1 but the job has 2 ranks" in err


def test_real_exit_status_of_a_bad_command():
    proc = run_cli("train", "--dp", "0")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "paracube: error: --dp must be a positive integer, got 0 (use 1 to switch this axis off)"
    )


def test_train_dp2_matches_serial_and_writes_metrics(tmp_path):
    """End to end: two local ranks through the elastic launcher, grad accumulation 2;
    the metrics file's losses equal a serial run on the same global batches."""
    metrics = tmp_path / "m.jsonl"
    argv = [
        "train",
        "--dp",
        "2",
        "--model",
        "nano",
        "--steps",
        "4",
        "--micro-batch",
        "2",
        "--grad-accum",
        "2",
        "--eval-every",
        "2",
        "--metrics",
        str(metrics),
        "--no-progress",
    ]
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert "validation loss" in proc.stdout and "time split" in proc.stdout
    records = read_metrics(str(metrics))
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert set(r["time"]) == {"data", "forward", "backward", "comm_exposed", "optimizer"}
        assert r["tokens"] == 8 * 64 and r["tokens_per_s"] > 0
        assert r["comm"]["all_reduce/grad"]["bytes"] == 136_960 * 4
    assert "val_loss" in records[1] and "val_loss" in records[3]
    cfg = config_from_args(build_parser().parse_args(argv))
    want, _ = serial_reference(cfg, build_corpus(None, cfg.model.seq_len, cfg.val_fraction))
    assert_losses_close([r["loss"] for r in records], want)


def test_train_dp2_tp2_sequence_parallel_matches_serial(tmp_path):
    """Four local ranks, dp × tp = 2 × 2 with sequence parallelism, from the command line."""
    metrics = tmp_path / "m.jsonl"
    argv = [
        "train",
        "--dp",
        "2",
        "--tp",
        "2",
        "--sequence-parallel",
        "--model",
        "nano",
        "--steps",
        "4",
        "--micro-batch",
        "2",
        "--metrics",
        str(metrics),
        "--no-progress",
    ]
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(str(metrics))
    assert {"all_gather/tp", "reduce_scatter/tp", "all_reduce/grad", "all_reduce/sp_grad"} <= set(
        records[0]["comm"]
    )
    cfg = config_from_args(build_parser().parse_args(argv))
    want, _ = serial_reference(cfg, build_corpus(None, cfg.model.seq_len, cfg.val_fraction))
    assert_losses_close([r["loss"] for r in records], want)


@pytest.mark.parametrize(
    "extra", [["--schedule", "zb-h1"], ["--balance", "time", "--schedule", "gpipe"]]
)
def test_train_pipeline_matches_serial(tmp_path, extra):
    """Two pipeline stages from the command line: per-step losses equal the serial run's."""
    metrics = tmp_path / "m.jsonl"
    argv = [
        "train",
        "--pp",
        "2",
        "--model",
        "nano",
        "--steps",
        "3",
        "--micro-batch",
        "2",
        "--microbatches",
        "4",
        "--metrics",
        str(metrics),
        "--no-progress",
        *extra,
    ]
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert "pipeline split by" in proc.stdout and "stage 1 (rank pp=1" in proc.stdout
    records = read_metrics(str(metrics))
    assert records[-1]["pipeline"]["schedule"] == extra[-1]
    assert 0 <= records[-1]["pipeline"]["bubble_measured"] < 1 and "bubble" in records[-1]["time"]
    cfg = config_from_args(build_parser().parse_args(argv))
    want, _ = serial_reference(cfg, build_corpus(None, cfg.model.seq_len, cfg.val_fraction))
    assert_losses_close([r["loss"] for r in records], want)


def torchrun_logs(tmp_path) -> tuple[str, str]:
    """torchrun's agent files in the test's own folder: by default torchrun makes a
    /tmp/torchelastic_* folder per run and never removes it."""
    return ("--log-dir", str(tmp_path / "torchrun"))


def test_runs_unchanged_under_torchrun(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = run_cli(
        *torchrun_logs(tmp_path),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "paracube",
        "train",
        "--dp",
        "2",
        "--model",
        "nano",
        "--steps",
        "2",
        "--metrics",
        str(metrics),
        "--no-progress",
        "--diagnose",
        module=("-m", "torch.distributed.run"),
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_metrics(str(metrics))) == 2
    assert proc.stdout.count("paracube diagnose:") == 1  # rank 0 diagnoses the run it wrote


def test_readme_example_matches_serial(tmp_path):
    """examples/data_parallel_any_module.py under torchrun prints the serial run's losses."""
    proc = run_cli(
        *torchrun_logs(tmp_path),
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/data_parallel_any_module.py",
        module=("-m", "torch.distributed.run"),
    )
    assert proc.returncode == 0, proc.stderr
    got = [
        float(line.split("loss ")[1])
        for line in proc.stdout.splitlines()
        if line.startswith("step ")
    ]
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    want = []
    for _ in range(5):
        x = torch.randn(32, 16, generator=g)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    assert len(got) == 5
    assert_losses_close(got, want, tol=1e-5 + 5e-6 / min(want))  # printed with 5 decimals


def test_zero3_example_matches_serial(tmp_path):
    """examples/zero3_any_module.py prints its ZeRO-3 losses beside a single process's."""
    proc = run_cli(
        *torchrun_logs(tmp_path),
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/zero3_any_module.py",
        module=("-m", "torch.distributed.run"),
    )
    assert proc.returncode == 0, proc.stderr
    pairs = [
        line.split("loss ")[1].split(" (serial ")
        for line in proc.stdout.splitlines()
        if line.startswith("step ")
    ]
    assert len(pairs) == 5
    for got, want in pairs:
        want = float(want.rstrip(")"))
        assert abs(float(got) - want) <= 1e-5 * want + 1e-6  # printed with 6 decimals
    assert (
        "parameter bytes held per rank: 36612 of 73220" in proc.stdout
    )  # half of each unit (padded)


def test_readme_tensor_parallel_example(tmp_path):
    proc = run_cli(
        *torchrun_logs(tmp_path),
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/tensor_parallel_gpt.py",
        module=("-m", "torch.distributed.run"),
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("logits shard"))
    got, want = line.split("loss ")[1].split(" (serial ")
    assert abs(float(got) - float(want.rstrip(")"))) <= 1e-5 * float(got)
    assert "qkv_proj shard (96, 64) of (192, 64)" in proc.stdout


def test_schedule_command_draws_and_reports(capsys, tmp_path):
    out = tmp_path / "t.png"
    assert (
        main(
            [
                "schedule",
                "--pp",
                "4",
                "--microbatches",
                "8",
                "--schedule",
                "1f1b",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "bubble fraction 0.2727 (formula 0.2727, Narayanan et al. 2021)" in text
    assert "peak in-flight micro-batches per rank: 4, 3, 2, 1" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "t.svg"
    assert (
        main(
            [
                "schedule",
                "--pp",
                "2",
                "--microbatches",
                "4",
                "--schedule",
                "interleaved-1f1b",
                "--chunks",
                "2",
                "--out",
                str(svg),
            ]
        )
        == 0
    )
    assert "(formula 0.1111," in capsys.readouterr().out and b"<svg" in svg.read_bytes()


def test_schedule_costs_from_a_run(capsys, tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(
        '{"step": 0, "pipeline": {"action_seconds": {"F": 0.01, "I": 0.012, "W": 0.008}}}\n'
    )
    assert (
        main(
            [
                "schedule",
                "--pp",
                "2",
                "--microbatches",
                "4",
                "--schedule",
                "zb-h1",
                "--costs",
                str(metrics),
            ]
        )
        == 0
    )
    assert "measured costs" in capsys.readouterr().out


def test_plan_calibrate_is_the_calibrate_command(capsys, monkeypatch):
    import paracube.calibrate

    fake = dict(
        matmul_flops_per_thread=1e9,
        attention_flops_per_thread=1e9,
        gelu_forward_per_thread=2e9,
        gelu_backward_per_thread=1e9,
        memory_bandwidth=1e9,
        link_bandwidth=1e9,
        link_latency=1e-6,
        allreduce_bandwidth=1e9,
        allreduce_latency=1e-6,
        gather_scatter_pair_ratio=1.0,
    )
    monkeypatch.setattr(paracube.calibrate, "calibrate", lambda: fake)
    assert main(["plan", "--calibrate"]) == 0
    out = capsys.readouterr().out
    assert "matmul 1.0 GFLOP/s per thread" in out
    assert "GELU 2.00 / 1.00 G elements/s per thread (forward / backward)" in out


def test_a_calibrated_rate_is_the_median_round_not_one_hiccup(monkeypatch):
    """A rate the planner divides by is the median of timed rounds: one round that a
    neighbour slowed tenfold does not move it (a clock that each round advances by a
    scripted duration)."""
    import paracube.calibrate

    durations = iter([9.0, 1.0, 1.1, 10.0, 0.9, 1.0])  # warm-up, then five rounds
    clock = [0.0]

    def run() -> None:
        clock[0] += next(durations)

    monkeypatch.setattr(paracube.calibrate.time, "perf_counter", lambda: clock[0])
    assert paracube.calibrate._median_rate(100.0, run) == 100.0


def test_a_collective_is_priced_as_a_step_issues_it_between_computes(monkeypatch):
    """The all-reduce's cost is what it adds between computes: rounds of collective +
    compute, less compute alone (a scripted clock: each collective 2, each compute 5)."""
    import paracube.calibrate

    clock = [0.0]

    def advance(seconds: float):
        def run() -> None:
            clock[0] += seconds

        return run

    monkeypatch.setattr(paracube.calibrate.time, "perf_counter", lambda: clock[0])
    cost = paracube.calibrate._between_computes(advance(2.0), advance(5.0))
    assert cost == 2.0


def test_calibrate_then_predict(tmp_path):
    """`paracube calibrate` measures this machine; `train --predict` then prints the planner's
    step time and model-state memory next to the measured ones (memory: equal)."""
    env = {"PARACUBE_CALIBRATION": str(tmp_path / "cal.json")}
    proc = run_cli("calibrate", env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert "GFLOP/s per thread" in proc.stdout and (tmp_path / "cal.json").exists()
    proc = run_cli(
        "train",
        "--dp",
        "2",
        "--model",
        "nano",
        "--steps",
        "3",
        "--no-progress",
        "--predict",
        env_extra=env,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "predicted step" in x)
    import re

    states = re.search(
        r"model states on rank 0: predicted ([\d.]+) MiB, counted ([\d.]+) MiB", line
    )
    assert states and states[1] == states[2]
    saved = re.search(
        r"saved activations per micro-batch: predicted ([\d.]+) MiB, counted peak ([\d.]+) MiB",
        line,
    )
    assert saved and saved[1] == saved[2]
