"""Data-parallel engine: parity with the serial run and with torch DDP, exact byte counts,
overlap of communication with backward, no_sync, broadcast and robustness."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from paracube.config import ParallelConfig
from tests.helpers import (
    assert_losses_close,
    assert_params_close,
    default_dtype,
    rel_err,
    serial_cached,
    small_corpus,
    train_config,
)

# -- functions shipped to the worker pools (module level so they pickle) -----------------


def _mesh(dp: int):
    from paracube.mesh.mesh import ProcessMesh

    return ProcessMesh(ParallelConfig(dp=dp))


def run_trainer(cfg):
    from paracube.engine import Trainer

    trainer = Trainer(cfg, _mesh(cfg.parallel.dp), small_corpus())
    metrics = [trainer.train_step() for _ in range(cfg.steps)]
    params = {k: v.detach().clone() for k, v in trainer.module.named_parameters()}
    n_buckets = len(trainer.grad_sync.buckets)
    return [m.loss for m in metrics], params, [m.comm for m in metrics], n_buckets


def ddp_and_paracube_grads():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from paracube.data.sampler import ShardedBatchSampler
    from paracube.data_parallel import DataParallel
    from paracube.models.gpt import GPT, lm_loss

    cfg = train_config(dp=2)
    torch.manual_seed(0)
    ours_model = GPT(cfg.model)
    theirs_model = copy.deepcopy(ours_model)
    ours = DataParallel(ours_model, None, bucket_mb=0.05)
    theirs = DDP(theirs_model)
    sampler = ShardedBatchSampler(small_corpus().train, cfg.model.seq_len, cfg.global_batch, 0)
    x, y = sampler.micro_batch(0, dp_rank=dist.get_rank(), dp_size=2, micro_step=0, accum=1)
    lm_loss(ours(x), y).backward()
    lm_loss(theirs(x), y).backward()
    return (
        {k: p.grad.clone() for k, p in ours_model.named_parameters()},
        {k: p.grad.clone() for k, p in theirs_model.named_parameters()},
    )


def launch_record():
    """Record, at each bucket launch, how many gradients were still to come in backward."""
    from paracube.data_parallel import AllReduce, DataParallel
    from paracube.models.gpt import GPT, lm_loss

    cfg = train_config(dp=2)
    torch.manual_seed(0)
    record = []

    class Recording(AllReduce):
        def __call__(self, bucket, group, ledger):
            record.append((bucket.index, sum(b.pending for b in dp.buckets)))
            return super().__call__(bucket, group, ledger)

    dp = DataParallel(GPT(cfg.model), None, bucket_mb=0.02, reducer=Recording())
    x = torch.randint(0, 256, (2, cfg.model.seq_len))
    lm_loss(dp(x), x).backward()
    return record, len(dp.buckets)


def no_sync_counts():
    """Bytes communicated by two no_sync backwards and one synchronised backward."""
    from paracube.comm.ledger import CommLedger
    from paracube.data_parallel import DataParallel
    from paracube.models.gpt import GPT, lm_loss

    cfg = train_config(dp=2)
    ledger = CommLedger()
    torch.manual_seed(0)
    dp = DataParallel(GPT(cfg.model), None, ledger, bucket_mb=0.05)
    ledger.reset()
    x = torch.randint(0, 256, (2, cfg.model.seq_len))
    with dp.no_sync():
        lm_loss(dp(x), x).backward()
        lm_loss(dp(x), x).backward()
    quiet = ledger.total().bytes
    lm_loss(dp(x), x).backward()
    return quiet, ledger.total(tag="grad").bytes, dp.grad_bytes


def broadcast_from_rank0():
    import torch.distributed as dist

    from paracube.data_parallel import DataParallel
    from paracube.models.gpt import GPT

    torch.manual_seed(100 + dist.get_rank())  # every replica starts different
    model = GPT(train_config().model)
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    DataParallel(model, None)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return before, after


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.used(x)


def unused_params_and_set_to_none():
    """A parameter without gradient must not stall the buckets; ``optimizer.zero_grad()``
    (set_to_none) must not detach gradients from the buckets."""
    import torch.distributed as dist

    from paracube.data_parallel import DataParallel

    torch.manual_seed(0)
    model = WithUnused()
    serial = copy.deepcopy(model)
    dp = DataParallel(model, None, bucket_mb=1e-4)  # one bucket per parameter
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    serial_opt = torch.optim.SGD(serial.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x = torch.randn(4, 8, generator=g)  # global batch; rank r takes rows 2r, 2r+1
        opt.zero_grad(set_to_none=True)
        dp(x[2 * dist.get_rank() : 2 * dist.get_rank() + 2]).pow(2).mean().backward()
        opt.step()
        serial_opt.zero_grad()
        serial(x).pow(2).mean().backward()
        serial_opt.step()
    return max(rel_err(p, q) for p, q in zip(model.used.parameters(), serial.used.parameters()))


# -- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dp,micro_batch,grad_accum",
    [(2, 4, 1), (2, 2, 2), (4, 2, 1), (4, 1, 2)],
    ids=["dp2", "dp2-accum2", "dp4", "dp4-accum2"],
)
def test_parity_with_serial_run(pools, dp, micro_batch, grad_accum):
    """Per-step loss and final parameters equal the single-process run on the same global batch."""
    cfg = train_config(dp=dp, micro_batch=micro_batch, grad_accum=grad_accum, steps=6)
    assert cfg.global_batch == 8
    want_losses, want_params = serial_cached(cfg.global_batch, cfg.steps)
    results = pools(dp).run(run_trainer, cfg)
    for losses, params, _, _ in results:  # every replica, not only rank 0
        assert_losses_close(losses, want_losses)
        assert_params_close(params, want_params)
    assert want_losses[-1] < want_losses[0]  # it trained: the comparison is not vacuous


def run_trainer_float64(cfg):
    with default_dtype(torch.float64):
        return run_trainer(cfg)


def test_parity_is_exact_in_float64(pools):
    """In float64, dp=4 with accumulation equals the serial run to ~1e-14: the float32
    differences above are summation order, not an error in the engine."""
    cfg = train_config(dp=4, micro_batch=1, grad_accum=2, steps=6)
    want_losses, want_params = serial_cached(cfg.global_batch, cfg.steps, None, torch.float64)
    for losses, params, _, _ in pools(4).run(run_trainer_float64, cfg):
        assert params["head.weight"].dtype == torch.float64
        assert_losses_close(losses, want_losses, tol=1e-12)
        assert_params_close(params, want_params, tol=1e-10, tensor_tol=1e-10)


def test_gradients_equal_torch_ddp(pools):
    for ours, theirs in pools(2).run(ddp_and_paracube_grads):
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert rel_err(ours[k], theirs[k]) <= 1e-6, k


def test_gradient_bytes_per_step_equal_parameter_bytes(pools):
    cfg = train_config(dp=2, micro_batch=2, grad_accum=2, steps=3)
    (_, params, comms, n_buckets), _ = pools(2).run(run_trainer, cfg)
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    for comm in comms:
        assert comm["all_reduce/grad"]["bytes"] == param_bytes  # one accumulation window
        assert comm["all_reduce/grad"]["calls"] == n_buckets > 1
        assert comm["all_reduce/loss"]["bytes"] == 4  # the global loss, one float32


def test_no_sync_communicates_nothing(pools):
    for quiet, synced, grad_bytes in pools(2).run(no_sync_counts):
        assert quiet == 0
        assert synced == grad_bytes


def test_buckets_launch_during_backward(pools):
    """The first bucket is all-reduced while other gradients are still being computed."""
    for record, n_buckets in pools(2).run(launch_record):
        assert [i for i, _ in record] == list(range(n_buckets))  # strictly in index order
        assert n_buckets >= 3
        assert record[0][1] > 0, "first bucket launched only after backward finished"


def test_initial_parameters_broadcast_from_rank0(pools):
    (before0, after0), (before1, after1) = pools(2).run(broadcast_from_rank0)
    assert not torch.equal(before0, before1)
    assert torch.equal(after0, before0) and torch.equal(after1, before0)


def test_unused_parameters_and_set_to_none(pools):
    for err in pools(2).run(unused_params_and_set_to_none):
        assert err <= 1e-6


def stalled_peer():
    """Rank 1 stalls past the collective timeout: every rank fails with a line naming
    itself and the step, instead of hanging."""
    import time

    import torch.distributed as dist

    from paracube.engine import Trainer
    from paracube.errors import CollectiveTimeout
    from paracube.mesh.mesh import ProcessMesh

    cfg = train_config(dp=2, steps=2)
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel, timeout_s=2.0), small_corpus())
    trainer.train_step()
    if dist.get_rank() == 1:
        time.sleep(4.0)
    start = time.perf_counter()
    try:
        trainer.train_step()
    except CollectiveTimeout as e:
        return str(e), time.perf_counter() - start
    return None, time.perf_counter() - start


def test_stalled_peer_fails_with_rank_and_step(pools):
    (msg0, waited0), (msg1, _) = pools(2).run(stalled_peer)
    assert msg0 is not None and msg0.startswith(
        "rank 0 (pp=0 dp=0 tp=0) failed in step 1, phase backward:"
    )
    assert msg1 is not None and msg1.startswith("rank 1 ")
    assert waited0 < 30  # the 2 s mesh timeout applied, not gloo's 30-minute default
