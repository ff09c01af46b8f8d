"""Asynchronous data parallelism by periodic averaging: local SGD and DiLoCo.

``--dp-mode local-sgd:H``: every data-parallel rank steps its own optimizer on its own
gradients — no gradient communication at all (:class:`LocalReduce`) — and every H steps
the ranks' parameters are averaged (one all-reduce of each flat buffer): local SGD
(Stich 2019; Lin et al. 2020, "Don't use large mini-batches, use local SGD").

``--dp-mode diloco:H``: the same H inner steps (AdamW, each rank alone), then an *outer*
step (Douillard et al. 2023, DiLoCo): the outer gradient is the ranks' mean of
(θ_outer − θ_local), and Nesterov momentum SGD (lr 0.7, momentum 0.9 — the paper's) moves
θ_outer by it; every rank restarts its inner steps from the new θ_outer.

Both work on the fp32 main parameters of :class:`~paracube.data_parallel.MainParamOptimizer`
(the model's own storage under fp32, the masters under bf16/fp16), so the model is
rebuilt from them after each average (``publish``).
"""

from __future__ import annotations

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.optimizer import MainParamOptimizer
from paracube.data_parallel.reducers import Done
from paracube.data_parallel.shards import Waitable

OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # DiLoCo's outer Nesterov SGD (Douillard et al. 2023, §3)


class LocalReduce:
    """No communication: the rank's own mean gradient. The engine normalises the loss by
    the *global* token count (so that a summed gradient is the serial one); alone, a rank's
    mean is that times the number of data-parallel ranks."""

    sharded = False

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        unit.buffer.mul_(ops.group_size(group))
        return Done(unit.buffer)


class ParameterAveraging:
    """After every ``every``-th optimizer step, average (local SGD) or take DiLoCo's outer
    step, over the data-parallel group."""

    def __init__(
        self, mode: str, every: int, optimizer: MainParamOptimizer, group, ledger: CommLedger
    ) -> None:
        self.mode, self.every, self.optimizer = mode, every, optimizer
        self.group, self.ledger = group, ledger
        mains = [main for _, main, _ in optimizer.held()]
        self.outer = [m.detach().clone() for m in mains] if mode == "diloco" else []
        self.momentum = [torch.zeros_like(m) for m in self.outer]

    @torch.no_grad()
    def after_step(self, step: int) -> bool:
        """Called after optimizer step ``step`` (0-based); returns whether it averaged."""
        if (step + 1) % self.every:
            return False
        world = ops.group_size(self.group)
        mains = [main for _, main, _ in self.optimizer.held()]
        if self.mode == "local-sgd":
            for main in mains:
                ops.all_reduce(main, self.group, self.ledger, tag="average")
                main.div_(world)
        else:
            for main, outer, momentum in zip(mains, self.outer, self.momentum):
                delta = outer - main  # this rank's outer gradient
                ops.all_reduce(delta, self.group, self.ledger, tag="average")
                delta.div_(world)
                momentum.mul_(OUTER_MOMENTUM).add_(delta)
                outer.sub_(OUTER_LR * (delta + OUTER_MOMENTUM * momentum))  # Nesterov
                main.copy_(outer)
        self.optimizer.publish()
        return True
