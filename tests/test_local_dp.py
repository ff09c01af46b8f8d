"""Asynchronous data parallelism by periodic averaging (``--dp-mode local-sgd:H|diloco:H``):
no gradient communication between averages, the average and DiLoCo's outer Nesterov
step exactly as their formulas say, every rank equal after each, and training that
learns."""

from __future__ import annotations

import pytest
import torch

from tests.test_zero import zcfg


def _mains(trainer) -> torch.Tensor:
    return torch.cat([main.detach().clone() for _, main, _ in trainer.optimizer.held()])


def _gathered(x: torch.Tensor) -> list[torch.Tensor]:
    import torch.distributed as dist

    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def average_by_hand(cfg, steps: int):
    """Train ``steps`` local steps (H is larger), then average once by hand: returns every
    rank's values before, this rank's after, the gradient bytes sent, and the outer state."""
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from tests.helpers import small_corpus

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    metrics = [trainer.train_step() for _ in range(steps)]
    grad_bytes = sum(v["bytes"] for m in metrics for k, v in m.comm.items() if k.endswith("/grad"))
    averaging = trainer.averaging
    outer = torch.cat([o.clone() for o in averaging.outer]) if averaging.outer else None
    momentum = torch.cat([m.clone() for m in averaging.momentum]) if averaging.momentum else None
    before = _gathered(_mains(trainer))
    assert averaging.after_step(averaging.every - 1)  # the step after which it averages
    after = _mains(trainer)
    return before, after, grad_bytes, outer, momentum, [m.loss for m in metrics]


def test_local_sgd_averages_the_ranks_parameters(pools):
    """dp=2, 3 local steps: no gradient byte crosses; the ranks drifted apart; the average
    is their mean and leaves every rank with the same values (to the last bit)."""
    cfg = zcfg(0, dp=2, dp_mode="local-sgd:100", steps=3)
    (before, after, grad_bytes, _, _, losses), (_, after1, *_) = pools(2).run(
        average_by_hand, cfg, 3
    )
    assert grad_bytes == 0
    assert not torch.equal(before[0], before[1])
    torch.testing.assert_close(after, (before[0] + before[1]) / 2, rtol=0, atol=1e-7)
    assert torch.equal(after, after1)
    assert losses[-1] < losses[0]


def test_diloco_takes_the_outer_nesterov_step(pools):
    """dp=2, 3 inner steps, then the outer step: Δ = mean_r(θ_outer − θ_r),
    m = 0.9·m + Δ, θ_outer −= 0.7·(Δ + 0.9·m) — every rank restarts from that θ_outer."""
    cfg = zcfg(0, dp=2, dp_mode="diloco:100", steps=3)
    results = pools(2).run(average_by_hand, cfg, 3)
    before, after, grad_bytes, outer, momentum, _ = results[0]
    assert grad_bytes == 0
    delta = ((outer - before[0]) + (outer - before[1])) / 2
    m = 0.9 * momentum + delta
    want = outer - 0.7 * (delta + 0.9 * m)
    torch.testing.assert_close(after, want, rtol=1e-6, atol=1e-7)
    assert torch.equal(results[1][1], after)


@pytest.mark.parametrize("mode", ["local-sgd:2", "diloco:2"])
def test_training_under_periodic_averaging_learns(pools, mode):
    """10 steps, averaging every 2: the loss falls, and the parameters are averaged over the
    data-parallel group 5 times (the ledger's 'average' all-reduces), the bytes of the
    parameters each time."""
    from tests.test_zero import run_engine

    cfg = zcfg(0, dp=2, dp_mode=mode)
    losses, _, metrics = pools(2).run(run_engine, cfg)[0]
    assert losses[-1] < losses[0] - 0.5
    averages = [m.comm.get("all_reduce/average", {}).get("calls", 0) for m in metrics]
    assert sum(1 for a in averages if a) == cfg.steps // 2
