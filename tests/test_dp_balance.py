"""Uneven data-parallel splits (``--dp-balance``): any split of the global batch — by
weights, changed mid-run, or chosen by measured speed — trains exactly the serial model."""

from __future__ import annotations

import pytest

from paracube.data.split import AutoBalance, DataSplit
from paracube.errors import ConfigError
from paracube.metrics import read_metrics
from tests.test_cli import run_cli
from tests.test_zero import _check_parity, run_engine, zcfg

CASES = {
    "dp2-1:3": dict(dp=2, dp_balance="1,3"),
    "dp2-1:3-zero3": dict(dp=2, zero=3, dp_balance="1,3"),
    "dp4-1:1:2:4-zero2": dict(dp=4, accum=1, zero=2, dp_balance="1,1,2,4"),
    "dp2-1:3-tp2-zero1": dict(dp=2, tp=2, zero=1, dp_balance="1,3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_uneven_split_matches_serial(pools, case):
    """10 steps with clipping: loss per step and every parameter within 1e-5 of the
    serial run on the same global batch."""
    cfg = zcfg(**CASES[case])
    assert cfg.data_split().shares != DataSplit.even(cfg.parallel.dp, 8, cfg.grad_accum).shares
    _check_parity(pools(cfg.parallel.world_size).run(run_engine, cfg), cfg.steps)


def run_with_changing_splits(cfg):
    """As ``run_engine``, the split changed every 3 steps (what --dp-balance auto does)."""
    from paracube import engine

    splits = [DataSplit((2, 6), 2), DataSplit((6, 2), 2), DataSplit((4, 4), 2)]
    step = engine.Trainer.train_step

    def train_step(self):
        if self.step % 3 == 0:
            self.batches.set_split(splits[self.step // 3 % len(splits)])
        return step(self)

    engine.Trainer.train_step = train_step
    try:
        return run_engine(cfg)
    finally:
        engine.Trainer.train_step = step


def test_a_split_changed_mid_run_matches_serial(pools):
    cfg = zcfg(zero=1, dp=2, data_workers=2, prefetch=3)  # made ahead under the old split
    _check_parity(pools(2).run(run_with_changing_splits, cfg), cfg.steps)


def test_weights_give_shares_by_largest_remainder():
    assert DataSplit.weighted([1, 3], 16, 1).shares == (4, 12)
    assert DataSplit.weighted([1, 1, 1], 16, 1).shares == (6, 5, 5)  # Σ = 16
    split = DataSplit.weighted([1, 3], 16, 2)
    assert [split.rows(r, k) for r in (0, 1) for k in (0, 1)] == [(0, 2), (2, 2), (4, 6), (10, 6)]
    with pytest.raises(ConfigError, match="use --global-batch ≥ 101"):
        DataSplit.weighted([1, 100], 16, 1)


def test_auto_moves_work_to_the_faster_replica_and_then_holds():
    """Replica 1 takes 2× as long per window: after one window of steps the shares
    follow the speeds (2:1 of 24); with the same timings again nothing changes (the
    split is already right), nor for a difference under the hysteresis."""
    auto = AutoBalance(DataSplit.even(2, 24, 1), replica_of=[0, 0, 1, 1])  # dp2 × tp2
    per_window = [0.01, 0.02]

    def timings():  # every rank's compute per window (ranktimes.compute_per_window)
        return [per_window[r] for r in (0, 0, 1, 1)]

    assert auto.update(0, timings()) is None  # warm-up step: not measured
    found = [auto.update(s, timings()) for s in range(1, 1 + AutoBalance.WINDOW)]
    assert found[:-1] == [None] * (AutoBalance.WINDOW - 1)
    assert found[-1] is not None and found[-1].shares == (16, 8)
    for s in range(10, 10 + 2 * AutoBalance.WINDOW):
        assert auto.update(s, timings()) is None
    per_window[1] = 0.0105  # now nearly as fast: 16 / 8 → 12 / 12 saves over 10 %
    moves = [auto.update(s, timings()) for s in range(20, 20 + AutoBalance.WINDOW)]
    assert moves[-1] is not None and moves[-1].shares == (12, 12)


def test_auto_under_a_slow_rank_shifts_the_batch_and_trains_the_same(tmp_path):
    """--inject slow-rank=1:3 --dp-balance auto: the split moves windows to rank 0 (the
    line says so), and the losses equal those of the even split (same global batches)."""
    nano = ("--model", "nano", "--steps", "10", "--no-progress", "--metrics-mode", "overwrite")
    auto, even = str(tmp_path / "auto.jsonl"), str(tmp_path / "even.jsonl")
    proc = run_cli(
        "train", "--dp", "2", *nano, "--metrics", auto,
        "--inject", "slow-rank=1:3", "--dp-balance", "auto",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--dp-balance auto: from step 4 the data-parallel ranks take" in proc.stdout
    assert run_cli("train", "--dp", "2", *nano, "--metrics", even).returncode == 0
    records = read_metrics(auto)
    changed = [r for r in records if r.get("dp_split_changed")]
    assert changed and changed[0]["step"] == AutoBalance.WINDOW
    assert records[-1]["dp_split"][0] > records[-1]["dp_split"][1]
    for a, b in zip(records, read_metrics(even)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_a_larger_share_is_not_taken_for_a_straggler():
    """Weights 1:3 on equal ranks: rank 1 computes 3× as long per step but no longer per
    window — the straggler watch names nobody; the same seconds over equal shares, it
    names rank 1."""
    from paracube.ranktimes import FIELDS, PATIENCE, StragglerWatch

    def ranks(windows):
        row = dict.fromkeys(FIELDS, [0.0, 0.0])
        return {**row, "forward": [0.1, 0.3], "backward": [0.2, 0.6], "windows": windows}

    uneven, even = (StragglerWatch([[0, 1]], ["a", "b"]) for _ in range(2))
    for step in range(PATIENCE + 2):
        assert uneven.update(step, ranks([4.0, 12.0])) == []
        even.update(step, ranks([8.0, 8.0]))
    assert [s.rank for s in even.seen] == [1] and not uneven.seen


def test_a_split_that_is_not_the_global_batch_is_refused():
    """A split given through the Python API must cover the global batch with one
    window per micro-step for every rank — never train on a different batch."""
    from paracube.data.batches import RankBatches
    from paracube.data.sampler import ShardedBatchSampler

    class Mesh:  # what RankBatches reads of a mesh
        device = None

        def rank(self, axis):
            return 0

        def size(self, axis):
            return 2

    import torch

    batches = RankBatches(ShardedBatchSampler(torch.arange(5000) % 251, 16, 8, 0), Mesh(), 2)
    for bad, why in [
        (DataSplit((2, 4), 2), "covers 6 of the global batch's 8 windows"),
        (DataSplit((2, 2, 4), 2), "3 shares for 2 data-parallel ranks"),
        (DataSplit((1, 7), 2), "less than one window per micro-step"),
        (DataSplit((4, 4), 1), "1 micro-steps, not the 2 this run takes"),
    ]:
        with pytest.raises(ConfigError, match=why):
            batches.set_split(bad)
    batches.set_split(DataSplit((2, 6), 2))
    assert batches.host_micro_batch(0, 1)[0].shape == (1, 16)
