"""Gradient compressors as reducers of the flat unit (``--compress``): the bookkeeping,
the approximations against their known bounds, the bytes on the wire, and training."""

from __future__ import annotations

import pytest
import torch

from paracube.data_parallel.compress import (
    PowerSGDReduce,
    TopKReduce,
    select_top_k,
    wire_bytes,
)
from paracube.data_parallel.flat import FlatUnit
from tests.helpers import assert_losses_close
from tests.test_zero import _check_parity, run_engine, serial, zcfg


def _unit(*shapes) -> FlatUnit:
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    return FlatUnit(0, params)


def test_top_k_selects_the_largest_magnitudes():
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    values, indices = select_top_k(g, 37)
    want = torch.sort(g.abs(), descending=True).values[:37]
    assert torch.equal(torch.sort(values.abs(), descending=True).values, want)
    assert torch.equal(g[indices], values)


def test_error_feedback_keeps_exactly_what_was_not_sent():
    """Every step: what was sent (the dense result, one rank) + the new residual = the
    gradient + the old residual, to the last bit; without feedback nothing is kept."""
    unit = _unit((40, 25), (25,))
    reducer = TopKReduce(0.05)
    gen = torch.Generator().manual_seed(1)
    old = torch.zeros(unit.numel)
    for _ in range(5):
        grad = torch.randn(unit.numel, generator=gen)
        unit.buffer[: unit.numel].copy_(grad)
        sent = reducer(unit, None, None).wait()[: unit.numel]
        assert torch.equal(sent + reducer.residual[0], grad + old)
        assert int((sent != 0).sum()) == reducer.k(unit.numel)
        old = reducer.residual[0].clone()
    plain = TopKReduce(0.05, error_feedback=False)
    unit.buffer[: unit.numel].copy_(grad)
    plain(unit, None, None)
    assert plain.residual == {}


def test_power_sgd_reaches_the_best_rank_r_approximation():
    """A 64×48 matrix of known singular values, compressed again and again (Q warm-started,
    no feedback): the rank-4 approximation's error reaches the SVD bound √Σ_{i>4} σᵢ²
    (Eckart–Young) and never beats it."""
    gen = torch.Generator().manual_seed(2)
    u, _ = torch.linalg.qr(torch.randn(64, 48, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(48, 48, generator=gen, dtype=torch.float64))
    sigma = torch.tensor([2.0**-i for i in range(48)], dtype=torch.float64)
    m = (u * sigma) @ v.t()
    bound = sigma[4:].square().sum().sqrt()
    unit = FlatUnit(0, [torch.nn.Parameter(torch.zeros(64, 48, dtype=torch.float64))])
    reducer = PowerSGDReduce(4, error_feedback=False)
    for _ in range(30):
        unit.buffer.copy_(m.reshape(-1))
        approx = reducer(unit, None, None).wait().view(64, 48)
        err = torch.linalg.norm(m - approx)
        assert err >= bound * (1 - 1e-9)
    assert err <= bound * (1 + 1e-6)


def test_wire_bytes_count_what_each_compressor_sends():
    shapes = [[(64, 32), (32,)]]  # one unit: a matrix and a bias
    numel = 64 * 32 + 32
    assert wire_bytes("bf16", shapes, world=2) == 2 * numel
    assert wire_bytes("topk:0.01", shapes, world=2) == 2 * 21 * 8  # ⌈0.01·2080⌉ pairs each
    assert wire_bytes("powersgd:4", shapes, world=2) == 4 * ((64 + 32) * 4 + 32)


def test_top_k_of_everything_is_the_serial_run(pools):
    """topk:1.0 sends every entry: the sum is exact, so dp2 with accumulation and clipping
    equals the serial run (1e-5, as every parity test), and each step's gradient bytes are
    the all-gathered (index, value) pairs of the analytic volume."""
    cfg = zcfg(0, dp=2, compress="topk:1.0")
    results = pools(2).run(run_engine, cfg)
    _check_parity(results, cfg.steps)
    grad_bytes = results[0][2][-1].comm["all_gather/grad"]["bytes"]
    units = _unit_shapes(cfg)
    assert grad_bytes == wire_bytes("topk:1.0", units, world=2)


def _unit_shapes(cfg):
    """The parameter shapes of each gradient bucket of the nano model (bucket_mb 0.1, in
    reverse order, one group key each), as the DataParallel wrapper builds them."""
    from paracube.data_parallel import DataParallel
    from paracube.models.gpt import GPT
    from paracube.optim import is_decayed

    torch.manual_seed(0)
    model = DataParallel(
        GPT(cfg.model), None, bucket_mb=cfg.parallel.bucket_mb, group_key=is_decayed,
        contiguous_params=True,
    )  # fmt: skip
    return [[tuple(p.shape) for p in unit.params] for unit in model.units]


@pytest.mark.parametrize("spec", ["bf16", "fp16", "powersgd:2"])
def test_compressed_training_tracks_the_serial_loss(pools, spec):
    """16-bit reduction and rank-2 PowerSGD (with error feedback) train nano within 2 % of
    the serial loss at every one of 10 steps; the gradient bytes per step equal the
    compressor's analytic volume."""
    cfg = zcfg(0 if spec == "powersgd:2" else 2, dp=2, compress=spec)
    results = pools(2).run(run_engine, cfg)
    want, _ = serial(cfg.steps, cfg.model)
    for losses, _, _ in results:
        assert_losses_close(losses, want, tol=2e-2)
    comm = results[0][2][-1].comm
    kind = "reduce_scatter/grad" if cfg.zero == 2 else "all_reduce/grad"
    windows = cfg.grad_accum if cfg.zero == 2 else 1  # ZeRO-2 reduces every micro-step
    assert comm[kind]["bytes"] == windows * wire_bytes(spec, _unit_shapes(cfg), world=2)


@pytest.mark.parametrize(
    ("spec", "tp", "pp"), [("topk:1.0", 2, 1), ("topk:1.0", 1, 2)], ids=["dp2-tp2", "dp2-pp2"]
)
def test_compressors_compose_with_tensor_and_pipeline_parallelism(pools, spec, tp, pp):
    """dp2 × tp2 and dp2 × pp2 with gradient accumulation: Top-K over every entry (an exact
    sum through the compressor's all-gather path) equals the serial run."""
    cfg = zcfg(0, dp=2, tp=tp, pp=pp, compress=spec)
    results = pools(4).run(run_engine, cfg)
    _check_parity(results, cfg.steps)
    for _, _, metrics in results:
        assert metrics[-1].comm["all_gather/grad"]["bytes"] > 0
