"""The parameter server (``--dp-mode ps[:S]``): truly asynchronous workers.

Ground truth for an asynchronous run is its interleaving: the server logs, for every
push it applied, which worker sent it, that worker's step and the version it computed
on; replaying that log in one process (each gradient taken on the logged version, on
that worker's share of that step's batch, clipped and stepped by AdamW in log order)
must give the engine's final parameters. The staleness bound S holds on every push, and
without it a slowed worker falls further behind than S.
"""

from __future__ import annotations

import time

import pytest
import torch

from tests.helpers import assert_params_close, small_corpus
from tests.test_zero import zcfg

SLOW = 0.03  # seconds rank 1 sleeps before each step: a straggler


def run_ps(cfg, slow: float):
    import torch.distributed as dist

    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    metrics = []
    while not trainer.finished:
        if dist.get_rank() == 1:
            time.sleep(slow)
        metrics.append(trainer.train_step())
    trainer.drain()
    server = trainer.ps_worker.server
    params = {n: p.detach().clone() for n, p in trainer.serial_named_parameters()}
    log = server.log if server is not None else None
    counts = dict(server.staleness) if server is not None else None
    memory = metrics[-1].memory
    return metrics, params, log, counts, memory


def replay(cfg, log):
    """The run in one process, in the server's order: parameters after each push."""
    from paracube.data.sampler import ShardedBatchSampler
    from paracube.data.split import DataSplit
    from paracube.engine import build_optimizer, lr_at
    from paracube.models.gpt import GPT, lm_loss

    dp = cfg.parallel.dp
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    scratch = GPT(cfg.model)
    optimizer = build_optimizer(model, cfg)
    sampler = ShardedBatchSampler(
        small_corpus().train, cfg.model.seq_len, cfg.global_batch, cfg.seed
    )
    split = DataSplit.even(dp, cfg.global_batch, cfg.grad_accum)
    versions = [{k: v.clone() for k, v in model.state_dict().items()}]
    for update, (worker, step, seen, _) in enumerate(log):
        scratch.load_state_dict(versions[seen])
        rows = [sampler.rows(step, *split.rows(worker, k)) for k in range(cfg.grad_accum)]
        x, y = (torch.cat(parts) for parts in zip(*rows))
        scratch.zero_grad(set_to_none=True)
        lm_loss(scratch(x), y).backward()
        torch.nn.utils.clip_grad_norm_(scratch.parameters(), cfg.grad_clip)
        for p, q in zip(model.parameters(), scratch.parameters()):
            p.grad = q.grad.clone()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(update // dp, cfg)
        optimizer.step()
        versions.append({k: v.clone() for k, v in model.state_dict().items()})
    return dict(model.named_parameters())


@pytest.mark.parametrize("mode", ["ps", "ps:1"])
def test_parameter_server_replays_serially(pools, mode):
    """dp=2 with a slowed rank 1: the job applies steps × dp pushes; the fast worker
    applies more of them; both workers end with the server's parameters; and a serial
    replay of the server's log gives those parameters."""
    cfg = zcfg(0, dp=2, dp_mode=mode, steps=8)
    (m0, p0, log, counts, memory), (m1, p1, *_) = pools(2).run(run_ps, cfg, SLOW)
    assert len(log) == cfg.steps * 2 == sum(counts.values())
    pushes = [sum(1 for w, *_ in log if w == r) for r in (0, 1)]
    assert pushes[0] > pushes[1] > 0  # nobody waited for the straggler every step
    assert [m.step for m in m0] == list(range(len(m0)))
    for name, p in p0.items():
        assert torch.equal(p, p1[name])  # the final parameters, everywhere
    assert m0[-1].ps_version == len(log) or m1[-1].ps_version == len(log)
    assert max(counts) >= 1  # gradients were applied late: asynchronous
    assert_params_close(p0, replay(cfg, log), tol=1e-5, tensor_tol=3e-4)
    assert memory["ps_server"] >= 4 * 4 * sum(p.numel() for p in p0.values())


def test_staleness_bound_holds_and_binds(pools):
    """ps:1: when any worker's k-th push is applied, every other running worker has
    pushed at least k − 1 times (the bound); unbounded, the fast worker gets further
    ahead of the straggler than that."""
    lead = {}
    for mode in ("ps:1", "ps"):
        cfg = zcfg(0, dp=2, dp_mode=mode, steps=10)
        _, _, log, _, _ = pools(2).run(run_ps, cfg, 2 * SLOW)[0]
        lead[mode] = max(step - slowest for _, step, _, slowest in log if slowest >= 0)
    assert lead["ps:1"] <= 1
    assert lead["ps"] > 1


def test_diagnose_explains_that_a_parameter_server_run_has_no_shared_step(tmp_path):
    """A ps run's metrics have no per-rank timings by design: diagnose says so, not that
    the file is from an older paracube."""
    import json

    from paracube.diagnose.records import DiagnoseError, read_run

    path = tmp_path / "ps.jsonl"
    record = {"step": 0, "loss": 5.0, "step_time": 0.1, "staleness": 0, "ps_version": 1}
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DiagnoseError, match="is a --dp-mode ps run"):
        read_run(str(path))
