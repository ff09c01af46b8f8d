"""``--balance speed``: pipeline stages cut by each stage's own measured speed and memory."""

from __future__ import annotations

import re

import pytest

from paracube.cli import build_parser, config_from_args
from paracube.data.corpus import build_corpus
from paracube.errors import ConfigError
from paracube.metrics import read_metrics
from paracube.pipeline.speed import speed_split
from tests.helpers import assert_losses_close, serial_reference

UNIFORM = 12  # layers of equal cost and size


def _split(times, capacity=(float("inf"), float("inf")), parts=2, memory=1.0):
    bounds, _ = speed_split([list(t) for t in times], list(capacity), lambda k, i: memory, parts)
    return bounds


def test_equal_stages_split_evenly():
    assert _split([[1.0] * UNIFORM, [1.0] * UNIFORM]) == [(0, 6), (6, 12)]


def test_a_stage_twice_as_slow_gets_half_the_layers():
    """Stage 1 takes 2 s a layer, stage 0 1 s: the slowest stage's time max(a, 2(12 − a))
    is least at a = 8 (both 8 s), where an even cut would take 12 s."""
    assert _split([[1.0] * UNIFORM, [2.0] * UNIFORM]) == [(0, 8), (8, 12)]
    assert _split([[3.0] * UNIFORM, [1.0] * UNIFORM]) == [(0, 3), (3, 12)]


def test_memory_caps_a_fast_stage():
    """Stage 0 is faster but holds only 5 layers: it gets 5, however fast it is."""
    assert _split([[1.0] * UNIFORM, [2.0] * UNIFORM], capacity=(5, 100)) == [(0, 5), (5, 12)]


def test_interleaved_chunks_share_their_ranks_memory():
    """p = 2, two chunks a rank: each chunk gets half its rank's capacity, and parts 0 and 2
    run on rank 0 (its times), 1 and 3 on rank 1."""
    bounds = _split([[1.0] * UNIFORM, [2.0] * UNIFORM], capacity=(8, 100), parts=4)
    sizes = [b - a for a, b in bounds]
    assert sizes[0] <= 4 and sizes[2] <= 4  # rank 0's chunks within 8 / 2
    assert sizes[0] + sizes[2] > sizes[1] + sizes[3]  # the faster rank still holds more


def test_no_split_that_fits_is_refused():
    with pytest.raises(ConfigError, match="no split of the 12 layers into 2 pipeline stages fits"):
        _split([[1.0] * UNIFORM, [1.0] * UNIFORM], capacity=(5, 5))


def test_a_slowed_stage_gets_fewer_layers_and_trains_the_serial_model(tmp_path):
    """Two stages of ``tiny`` (7 layers: embed, 4 blocks, norm, head), rank 1 three times as
    slow (injected): the speed balance gives stage 1 fewer layers than stage 0 (the even
    cut of 3 / 4 would leave it 3 × 2 blocks against 2) and says each stage's measured
    time; the per-step losses equal the serial run's (a pipeline split changes where
    layers run, not the maths). (``nano``'s 2 blocks left too little to cut: under load
    its millisecond timings chose either of two near-equal cuts.)"""
    from tests.test_cli import run_cli

    metrics = tmp_path / "m.jsonl"
    argv = [
        "train", "--pp", "2", "--model", "tiny", "--seq-len", "32", "--steps", "3", "--micro-batch", "2",
        "--microbatches", "4", "--balance", "speed", "--inject", "slow-rank=1:3",
        "--metrics", str(metrics), "--no-progress",
    ]  # fmt: skip
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert "pipeline split by speed" in proc.stdout
    sizes = [
        int(n) for n in re.findall(r"stage \d \(rank pp=\d, chunk 0\): (\d+) layers", proc.stdout)
    ]
    assert len(sizes) == 2 and sizes[1] < sizes[0], proc.stdout
    assert "ms per micro-batch (forward + backward, measured)" in proc.stdout
    cfg = config_from_args(build_parser().parse_args(argv))
    want, _ = serial_reference(cfg, build_corpus(None, cfg.model.seq_len, cfg.val_fraction))
    assert_losses_close([r["loss"] for r in read_metrics(str(metrics))], want)
