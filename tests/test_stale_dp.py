"""Bounded staleness (``--dp-mode stale:S``): step t applies the gradient of step t − S,
reduced while the next S steps computed. Parity with a serial run that delays its
gradients the same way, under ZeRO 0 and 1 and with a pipeline; the first S steps do not
step; every step's reduction is launched and counted."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import (
    assert_losses_close,
    assert_params_close,
    serial_reference,
    small_corpus,
    train_config,
)
from tests.test_zero import CLIP, GLOBAL, NANO, run_engine, zcfg


def _serial_late(staleness: int, steps: int):
    cfg = train_config(dp=1, micro_batch=GLOBAL, steps=steps, grad_clip=CLIP, model=NANO)
    return serial_reference(cfg, small_corpus(), staleness)


def _run_and_drain(cfg):
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from paracube.tensor_parallel import full_tensor

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    metrics = [trainer.train_step() for _ in range(cfg.steps)]
    in_flight = trainer.grad_sync.memory_bytes()["gradients"]
    trainer.drain()
    with trainer.gathered_parameters():
        params = {
            n: full_tensor(p, p, trainer.tp_group) for n, p in trainer.serial_named_parameters()
        }
    return [m.loss for m in metrics], params, metrics, in_flight


@pytest.mark.parametrize(
    ("staleness", "zero", "pp"), [(1, 0, 1), (2, 1, 1), (1, 1, 2)], ids=["S1", "S2-zero1", "S1-pp2"]
)
def test_stale_matches_serial_with_late_gradients(pools, staleness, zero, pp):
    """dp=2 (× pp): the losses and final parameters equal a serial run whose step t uses
    step t − S's gradient; the first S steps leave the parameters alone (their losses are
    those of the initial model on two batches), and the data-parallel ranks stay equal."""
    steps = 8
    cfg = zcfg(zero, dp=2, pp=pp, dp_mode=f"stale:{staleness}", steps=steps)
    results = pools(2 * pp).run(_run_and_drain, cfg)
    want_losses, want_params = _serial_late(staleness, steps)
    merged: dict = {}
    for losses, params, metrics, _ in results:
        assert_losses_close(losses, want_losses)
        merged.update(params)
        assert [m.grad_norm == 0.0 for m in metrics[:staleness]] == [True] * staleness
        assert max(m.grad_norm for m in metrics) > CLIP  # clipping happened
    assert_params_close(merged, want_params, tol=1e-5, tensor_tol=3e-4)
    # the serial late run differs from the synchronous one: the test can tell them apart
    sync_losses, _ = _serial_late(0, steps)
    assert abs(sync_losses[-1] - want_losses[-1]) > 1e-3


def test_stale_launches_every_step_and_holds_s_copies(pools):
    """Every step launches one gradient all-reduce per bucket (counted at launch, the
    bucket's bytes), on the twin group; the in-flight copies — S per bucket at the end of
    a step — are counted in the gradient memory."""

    staleness = 2
    cfg = zcfg(0, dp=2, dp_mode=f"stale:{staleness}", steps=4)
    _, _, metrics, in_flight = pools(2).run(_run_and_drain, cfg)[0]
    sync_cfg = zcfg(0, dp=2, steps=4)
    _, _, sync_metrics = pools(2).run(run_engine, sync_cfg)[0]
    for m, s in zip(metrics, sync_metrics):
        assert m.comm["all_reduce/grad"]["bytes"] == s.comm["all_reduce/grad"]["bytes"] > 0
        assert m.comm["all_reduce/grad"]["calls"] == s.comm["all_reduce/grad"]["calls"]
    buffers = sync_metrics[-1].memory["gradients"]
    assert in_flight == buffers + staleness * buffers


def test_stale_zero_is_synchronous(pools):
    """stale:0 hands back each step's own reduction: the synchronous run, to rounding."""
    cfg = zcfg(0, dp=2, dp_mode="stale:0", steps=4)
    losses, params, *_ = pools(2).run(_run_and_drain, cfg)[0]
    sync = pools(2).run(run_engine, zcfg(0, dp=2, steps=4))[0]
    assert_losses_close(losses, sync[0], tol=1e-6)
    for name, p in params.items():
        torch.testing.assert_close(p, sync[1][name], rtol=1e-6, atol=1e-7)
