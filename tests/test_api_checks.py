"""Bad values through the Python API are refused where they enter, in words that name them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus, read_user_tokens
from paracube.data.sampler import ShardedBatchSampler
from paracube.data_parallel import DataParallel
from paracube.errors import ConfigError, DataError, OutputError, WriteFailed
from paracube.models.gpt import GPT
from paracube.models.presets import preset
from paracube.options import RunOptions
from paracube.outputs import MetricsWriter, check_output
from paracube.pipeline import Costs, build_schedule, simulate
from paracube.planner.search import divisors
from paracube.precision import LossScaler
from paracube.resources import Host, check_host, rank_memory_bytes


@pytest.mark.parametrize("p", [0, -1])
def test_build_schedule_refuses_no_stages(p):
    with pytest.raises(ConfigError, match="--pp must be ≥ 1"):
        build_schedule("1f1b", p=p, m=4)


@pytest.mark.parametrize(
    "costs,match",
    [
        (dict(F=-1.0), "cost F must be finite and >= 0"),
        (dict(I=math.nan), "cost I must be finite and >= 0"),
        (dict(W=math.inf), "cost W must be finite and >= 0"),
        (dict(F=0.0), "must each cost more than 0"),
        (dict(I=0.0, W=0.0), "must each cost more than 0"),
        (dict(F="1"), "cost F must be a number"),
    ],
)
def test_simulator_costs_are_checked(costs, match):
    with pytest.raises(ValueError, match=match):
        Costs(**costs)


def test_simulator_still_runs_zero_cost_weight_passes():
    t = simulate(build_schedule("1f1b", p=2, m=4), Costs(F=1.0, I=2.0, W=0.0))
    assert t.bubble_fraction == pytest.approx(1 / 5)


def test_gpt_refuses_inputs_past_its_shape():
    cfg = preset("nano")
    model = GPT(cfg)
    with pytest.raises(ValueError, match=f"more than the model's seq_len {cfg.seq_len}"):
        model(torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 256 is outside the vocabulary 0..255"):
        model(torch.full((1, 4), 256))
    with pytest.raises(ValueError, match="token id -1 is outside"):
        model(torch.full((1, 4), -1))
    with pytest.raises(ValueError, match=r"must be a \(batch, seq\) integer tensor"):
        model(torch.zeros(1, 4))
    assert model(torch.zeros(2, cfg.seq_len, dtype=torch.long)).shape == (2, cfg.seq_len, 256)


def test_sampler_refuses_data_shorter_than_a_window():
    with pytest.raises(DataError, match="10 tokens hold no window of seq_len"):
        ShardedBatchSampler(torch.zeros(10, dtype=torch.uint8), seq_len=16, global_batch=2, seed=0)


@pytest.mark.parametrize("spec", [-1, 0, "abc", math.inf, 1e30])
def test_loss_scaler_refuses_bad_scales(spec):
    with pytest.raises(ConfigError, match="--loss-scale must be 'dynamic' or a number"):
        LossScaler(spec)


def test_loss_scaler_counts_consecutive_skips():
    scaler = LossScaler("dynamic")
    for _ in range(3):
        scaler.update(True)
    assert (scaler.consecutive, scaler.skipped, scaler.scale) == (3, 3, 2.0**13)
    scaler.update(False)
    assert scaler.consecutive == 0 and scaler.skipped == 3


@pytest.mark.parametrize("bucket_mb", [0, -1.0, math.nan])
def test_data_parallel_refuses_bad_buckets(bucket_mb):
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        DataParallel(torch.nn.Linear(2, 2), None, bucket_mb=bucket_mb)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("init_std", math.nan, "init_std must be a finite number > 0"),
        ("init_std", -0.02, "init_std must be a finite number > 0"),
        ("norm_eps", -1e-5, "norm_eps must be a finite number > 0"),
        ("norm_eps", math.inf, "norm_eps must be a finite number > 0"),
    ],
)
def test_model_config_numbers(field, value, match):
    with pytest.raises(ConfigError, match=match):
        preset("nano", **{field: value})


def test_train_and_run_options_numbers():
    with pytest.raises(ConfigError, match="--lr must be a finite number"):
        TrainConfig(model=preset("nano"), lr=math.inf)
    with pytest.raises(ConfigError, match="--timeout must be a finite number"):
        RunOptions(timeout_s=math.nan)
    with pytest.raises(ConfigError, match="unknown --on-nan"):
        TrainConfig(model=preset("nano"), on_nan="maybe")


def test_divisors_are_fast_and_right():
    assert divisors(360) == [d for d in range(1, 361) if 360 % d == 0]
    assert divisors(2**40)[-1] == 2**40 and len(divisors(2**40)) == 41  # instant, not 10¹² steps


def test_host_limits():
    cfg = TrainConfig(model=preset("nano"), parallel=ParallelConfig(dp=4))
    small = Host(cores=2, memory_bytes=64 * 2**30)
    check_host(cfg, 4, 1, small)  # 2 ranks per core: fine
    with pytest.raises(ConfigError, match="17 ranks on this machine's 2 cores"):
        check_host(cfg, 17, 1, small)
    check_host(cfg, 17, 1, small, oversubscribe=True)
    with pytest.raises(ConfigError, match="--threads 3 is more than this machine's 2 cores"):
        check_host(cfg, 1, 3, small)
    with pytest.raises(ConfigError, match="GiB per rank"):
        check_host(cfg, 4, 1, Host(cores=2, memory_bytes=2**20))
    check_host(cfg, 4, 1, Host(cores=2, memory_bytes=2**20, cuda=True))  # a GPU job: not host RAM


def test_rank_memory_is_a_lower_bound_of_the_rank_share():
    """Serial: at least the fp32 weights, gradients and Adam's two moments of the built
    model (16 bytes a parameter). Under tp=4 the rank holds a quarter of the matrices and
    draws its largest sharded parameter whole first: the bound counts both, and stays
    below the serial rank's (the model is built on the meta device, never whole)."""
    cfg = TrainConfig(model=preset("tiny"))
    params = sum(p.numel() for p in GPT(cfg.model).parameters())
    assert rank_memory_bytes(cfg) >= 16 * params
    tp4 = TrainConfig(model=preset("tiny"), parallel=ParallelConfig(tp=4))
    largest = max(p.numel() for p in GPT(cfg.model).parameters())
    assert rank_memory_bytes(tp4) >= 16 * params / 4 + 4 * largest
    assert rank_memory_bytes(tp4) < rank_memory_bytes(cfg)


def test_corpus_file_is_memory_mapped_and_exact(tmp_path):
    text = ("the quick brown fox jumps over the lazy dog\n" * 400).encode()
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    tokens = read_user_tokens(str(path))
    assert bytes(tokens.numpy()) == text
    with open("/proc/self/maps") as maps:  # mapped from the page cache, not copied per rank
        assert any(str(path) in line for line in maps)
    corpus = build_corpus(str(path), seq_len=32)
    assert corpus.train.numel() + corpus.val.numel() == len(text)


def test_corpus_folder_reads_every_text_file_once(tmp_path):
    (tmp_path / "a.txt").write_text("A" * 3000)
    (tmp_path / "b.txt").write_text("B" * 2000)
    (tmp_path / "c.bin").write_bytes(b"\0" * 100)
    tokens = read_user_tokens(str(tmp_path))
    assert bytes(tokens.numpy()) == b"A" * 3000 + b"B" * 2000


def test_output_checks_and_metrics_modes(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    check_output(str(path), "--metrics", "new")  # the folder can be made
    assert not (tmp_path / "sub").exists()  # … but is not made by the check
    w = MetricsWriter(str(path), "new")
    w.write_line('{"step": 0}', 0)
    w.close()
    with pytest.raises(OutputError, match="exists"):
        check_output(str(path), "--metrics", "new")
    w = MetricsWriter(str(path), "append")
    w.write_line('{"step": 1}', 1)
    w.close()
    assert path.read_text().splitlines() == ['{"step": 0}', '{"step": 1}']
    w = MetricsWriter(str(path), "overwrite")
    w.write_line('{"step": 9}', 9)
    path.unlink()
    with pytest.raises(WriteFailed, match="deleted during the run"):
        w.write_line('{"step": 10}', 10)
    w.close()


def test_a_full_disk_is_one_line():
    w = MetricsWriter("/dev/full", "overwrite")
    with pytest.raises(WriteFailed, match="cannot write step 3 .No space left on device."):
        w.write_line("x" * 10, 3)
    w.close()


def test_a_huge_binary_file_is_refused_from_its_first_bytes(tmp_path, monkeypatch):
    """A 2 GiB file (sparse: no disk used) is refused by its first 8 KiB, never read whole."""
    from paracube.data.source import check_source

    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(2 * 2**30)
    reads = []
    real_open = Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if self == huge:
            original = handle.read
            handle.read = lambda n=-1: reads.append(n) or original(n)  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read whole"))
    with pytest.raises(DataError, match="looks binary"):
        check_source(str(huge), seq_len=64, val_fraction=0.05)
    assert reads and all(0 < n <= 8192 for n in reads)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="cannot write in"):
            check_output(str(folder / "m.jsonl"), "--metrics", "new")
    finally:
        folder.chmod(0o755)


def test_offloading_a_cpu_models_optimizer_is_refused():
    """MainParamOptimizer(offload=True) over a model in host memory already: a clear
    error (there is nothing to offload), not a silent copy."""
    from paracube.data_parallel import MainParamOptimizer

    model = DataParallel(torch.nn.Linear(4, 4), None, None, contiguous_params=True)
    with pytest.raises(ValueError, match="nothing to offload"):
        MainParamOptimizer(model.shards(), lambda groups: None, offload=True)


def test_data_parallel_refuses_a_reducer_of_the_wrong_kind():
    """A Top-K (whole-buffer) reducer under ZeRO-2, or a sharded one under ZeRO-0, would
    leave the gradient where the optimizer does not read it: refused at wrap time."""
    from paracube.data_parallel.compress import CastReduce, TopKReduce

    with pytest.raises(ValueError, match="ZeRO stage 2 needs a sharded reducer"):
        DataParallel(torch.nn.Linear(4, 4), None, zero_stage=2, reducer=TopKReduce(0.1))
    with pytest.raises(ValueError, match="ZeRO stage 0 needs a reducer that leaves the whole"):
        DataParallel(torch.nn.Linear(4, 4), None, reducer=CastReduce("bf16", sharded=True))
    DataParallel(
        torch.nn.Linear(4, 4), None, zero_stage=2, reducer=CastReduce("bf16", sharded=True)
    )
