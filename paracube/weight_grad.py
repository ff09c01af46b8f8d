"""Deferred weight gradients: a linear layer's backward split into I and W.

Zero-bubble pipeline schedules (Qi et al. 2024) run a backward in two passes: I, the
input gradient dX = dY·W, on the critical path to the previous stage, and W, the weight
gradient dW = dYᵀ·X, later, to fill idle time. This module is the mechanism, shared by
plain linears (made deferrable by the pipeline) and the tensor-parallel linears (which
defer themselves): a :class:`WeightGradStore` queues the W work of each (micro-batch,
chunk) while :meth:`WeightGradStore.deferring` is active, and :meth:`WeightGradStore.flush`
runs it. It knows nothing of pipelines or tensor parallelism; both import it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Hashable, Iterator

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradStore:
    """Deferred weight-gradient computations, queued per key (the executor's (mb, chunk))."""

    def __init__(self) -> None:
        self._key: Hashable | None = None  # set while an I pass runs
        self._queue: dict[Hashable, list] = defaultdict(list)

    @contextlib.contextmanager
    def deferring(self, key: Hashable) -> Iterator[None]:
        """Inside, backward passes through deferrable linears leave dW to :meth:`flush`."""
        self._key = key
        try:
            yield
        finally:
            self._key = None

    @property
    def active(self) -> bool:
        return self._key is not None

    def push(
        self,
        grad_out: torch.Tensor,
        inp: torch.Tensor,
        weight: nn.Parameter,
        bias: nn.Parameter | None,
    ) -> None:
        self._queue[self._key].append((grad_out, inp, weight, bias))

    @torch.no_grad()
    def flush(self, key: Hashable) -> None:
        """Run the W pass of ``key``: compute and accumulate its deferred gradients."""
        for grad_out, inp, weight, bias in self._queue.pop(key, []):
            g2 = grad_out.reshape(-1, grad_out.shape[-1])  # (B·T, O)
            _accumulate(weight, g2.t().matmul(inp.reshape(-1, inp.shape[-1])))  # (O, H)
            if bias is not None:
                _accumulate(bias, g2.sum(0))

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._queue.values())


class DefersWeightGrad:
    """Marker for layers that take a store and defer their own weight gradients (the
    tensor-parallel linears): ``weight_grad_store`` is None until a zero-bubble schedule
    hands them one."""

    weight_grad_store: WeightGradStore | None = None


def _accumulate(p: nn.Parameter, g: torch.Tensor) -> None:
    """As autograd's AccumulateGrad would (the data-parallel wrapper picks the gradient up
    at its end-of-step synchronisation)."""
    if p.grad is None:
        p.grad = g
    else:
        p.grad.add_(g)


class _DeferrableLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        # The parameter objects themselves, for the W pass: under saved-tensor hooks a saved
        # tensor comes back as a different object, whose .grad the optimizer never sees.
        ctx.weight, ctx.bias, ctx.store = weight, bias, store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_in = grad_out.matmul(weight)
        if ctx.store.active:  # an I pass: W later
            ctx.store.push(grad_out, x, ctx.weight, ctx.bias)
            return grad_in, None, None, None
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = g2.t().matmul(x.reshape(-1, x.shape[-1]))
        return grad_in, grad_w, (g2.sum(0) if ctx.bias is not None else None), None


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, store: WeightGradStore | None
) -> torch.Tensor:
    """``F.linear``, or with a store its deferrable form (the same result and gradients)."""
    if store is None:
        return F.linear(x, weight, bias)
    return _DeferrableLinearFn.apply(x, weight, bias, store)
