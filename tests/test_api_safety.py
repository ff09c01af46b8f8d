"""The Python API refuses or corrects what used to fail silently (issue 17's findings).

With a plain module (not paracube's GPT), 2 ranks, float32:

- a plain torch optimizer over a ZeRO-1/2/3 wrapper's parameters is refused at its first
  step with the fix (it trained nothing under ZeRO-2/3, and was not ZeRO under ZeRO-1);
- ``MainParamOptimizer.step()`` without ``prepare_grads()`` steps this step's gradients;
- ``DataParallel`` and ``ShardedDataParallel`` average alike by default, and
  ``MainParamOptimizer.clip_grad_norm_`` sees the whole model's norm under every stage —
  each run equals the serial one, clipping included;
- ZeRO-3 units may return tuples (as Hugging Face blocks do); a unit returning no tensor
  that carries a gradient is refused naming the module;
- ``MainParamOptimizer`` over a ZeRO-0 wrapper without contiguous parameters says how.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

WIDTH, BATCH, STEPS, CLIP = 16, 8, 4, 0.5


class Block(nn.Module):
    """A residual block returning (hidden, auxiliary) — the shape of an HF decoder layer."""

    def __init__(self, tuple_out: bool = True):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)
        self.tuple_out = tuple_out

    def forward(self, x):  # (B, W) -> ((B, W), (B,))
        h = x + torch.tanh(self.fc(self.norm(x)))
        return (h, h.detach().norm(dim=-1)) if self.tuple_out else h


class Net(nn.Module):
    def __init__(self, tuple_out: bool = True):
        super().__init__()
        self.inp = nn.Linear(4, WIDTH)
        self.blocks = nn.ModuleList(Block(tuple_out) for _ in range(3))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x):  # (B, 4) -> (B, 1)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
            h = h[0] if isinstance(h, tuple) else h
        return self.out(h)


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def _wrap(net: nn.Module, stage: int):
    from paracube.data_parallel import DataParallel, ShardedDataParallel

    if stage == 3:
        return ShardedDataParallel(net, list(net.blocks))
    return DataParallel(net, None, bucket_mb=0.001, zero_stage=stage, contiguous_params=True)


def train_wrapped(stage: int, prepare: bool):
    """dp2, each rank its half of the batch and its own mean loss (the DDP convention),
    clipped by the optimizer's global norm: returns the norms and final parameters."""
    import torch.distributed as dist

    from paracube.data_parallel import MainParamOptimizer

    torch.manual_seed(0)
    net = Net()
    model = _wrap(net, stage)
    optimizer = MainParamOptimizer(
        model.shards(),
        lambda groups: torch.optim.AdamW([p for ps in groups.values() for p in ps], lr=0.05),
    )
    half = slice(BATCH // 2 * dist.get_rank(), BATCH // 2 * (dist.get_rank() + 1))
    norms = []
    for step in range(STEPS):
        x, y = _batch(step)
        model.zero_grad()
        nn.functional.mse_loss(model(x[half]), y[half]).backward()
        if prepare:
            optimizer.prepare_grads()
        norms.append(optimizer.clip_grad_norm_(CLIP, None))
        optimizer.step()
    with model.gathered_parameters():
        params = {k: v.detach().clone() for k, v in net.named_parameters()}
    return norms, params


def _serial():
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.05)
    norms = []
    for step in range(STEPS):
        x, y = _batch(step)
        net.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
        optimizer.step()
    return norms, {k: v.detach().clone() for k, v in net.named_parameters()}


@pytest.mark.parametrize(("stage", "prepare"), [(1, True), (2, False), (3, True), (3, False)])
def test_every_stage_averages_and_clips_like_the_serial_run(pools, stage, prepare):
    """The same user code under ZeRO-1/2/3 — with or without calling prepare_grads() —
    gives the serial run's gradient norms (so the averaging and the global norm agree) and
    final parameters; the norms exceed CLIP, so clipping acted."""
    want_norms, want = _serial()
    for norms, params in pools(2).run(train_wrapped, stage, prepare):
        torch.testing.assert_close(torch.tensor(norms), torch.tensor(want_norms), rtol=1e-5, atol=0)
        for name, p in want.items():
            torch.testing.assert_close(params[name], p, rtol=1e-5, atol=1e-6)
    assert min(want_norms) > CLIP


def plain_optimizer_over(stage: int) -> str:
    torch.manual_seed(0)
    net = Net()
    model = _wrap(net, stage)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.05)
    x, y = _batch(0)
    nn.functional.mse_loss(model(x), y).backward()
    try:
        optimizer.step()
    except RuntimeError as e:
        return str(e)
    return "stepped"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_plain_optimizer_over_sharded_parameters_is_refused(pools, stage):
    """ZeRO-1/2/3: refused at the first step, naming the wrapper and the fix; ZeRO-0
    (replicated states, gradients in .grad) is plain data parallelism and steps."""
    said = pools(2).run(plain_optimizer_over, stage)[0]
    if stage == 0:
        assert said == "stepped"
    else:
        assert "AdamW steps the parameters of a" in said
        assert "MainParamOptimizer(model.shards(), make_optimizer)" in said


def unit_without_gradient_output() -> str:
    from paracube.data_parallel import ShardedDataParallel

    class Detached(Block):
        def forward(self, x):
            return {"hidden": super().forward(x)[0].detach()}

    torch.manual_seed(0)
    net = Net()
    net.blocks[1] = Detached()
    model = ShardedDataParallel(net, list(net.blocks))
    try:
        model(_batch(0)[0])
    except TypeError as e:
        return str(e)
    return "ran"


def test_a_zero3_unit_whose_output_carries_no_gradient_is_refused(pools):
    said = pools(2).run(unit_without_gradient_output)[0]
    assert "unit 1 (Detached) returned dict holding no tensor that requires grad" in said


def optimizer_over_scattered_params() -> str:
    from paracube.data_parallel import DataParallel, MainParamOptimizer

    model = DataParallel(copy.deepcopy(Net()), None)
    try:
        MainParamOptimizer(model.shards(), lambda g: torch.optim.SGD([], lr=0.1))
    except RuntimeError as e:
        return str(e)
    return "built"


def test_main_param_optimizer_over_a_zero0_wrapper_says_how(pools):
    said = pools(2).run(optimizer_over_scattered_params)[0]
    assert "contiguous_params=True" in said
