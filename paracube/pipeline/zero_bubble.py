"""Splitting a backward into I (input gradient) and W (weight gradient) for zero-bubble
schedules (Qi et al. 2024): linears compute dX at once and leave dW = dYᵀ·X for later.

The :class:`WeightGradStore` is owned by the executor and handed to the linears when the
zero-bubble plan replaces them; it is not global state.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradStore:
    """Deferred weight-gradient computations, queued per (micro-batch, chunk)."""

    def __init__(self) -> None:
        self.key = None  # set while an I pass runs: its weight gradients are deferred
        self._queue: dict[object, list] = defaultdict(list)

    def push(self, work) -> None:
        self._queue[self.key].append(work)

    @torch.no_grad()
    def flush(self, key) -> None:
        """Run the W pass of ``key``: compute and accumulate its deferred gradients."""
        for grad_out, inp, weight, bias in self._queue.pop(key, []):
            g2 = grad_out.reshape(-1, grad_out.shape[-1])
            _accumulate(weight, g2.t().matmul(inp.reshape(-1, inp.shape[-1])))
            if bias is not None:
                _accumulate(bias, g2.sum(0))

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._queue.values())


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
        ctx.weight = weight  # the parameter object, for the deferred W pass (see layers.py)
        ctx.store, ctx.has_bias = store, bias is not None
        ctx.bias = bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_in = grad_out.matmul(weight)
        if ctx.store.key is not None:  # an I pass: W later
            ctx.store.push((grad_out, x, ctx.weight, ctx.bias))
            return grad_in, None, None, None
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = g2.t().matmul(x.reshape(-1, x.shape[-1]))
        return grad_in, grad_w, (g2.sum(0) if ctx.has_bias else None), None


class DeferrableLinear(nn.Module):
    """Same parameters and result as the ``nn.Linear`` it replaces; its weight gradient
    can be deferred to a W pass."""

    def __init__(self, linear: nn.Linear, store: WeightGradStore):
        super().__init__()
        self.weight, self.bias, self.store = linear.weight, linear.bias, store

    def forward(self, x):
        return _DeferrableLinearFn.apply(x, self.weight, self.bias, self.store)


def deferrable_linear(x, weight, bias, store: WeightGradStore):
    return _DeferrableLinearFn.apply(x, weight, bias, store)


def make_deferrable(module: nn.Module, store: WeightGradStore) -> int:
    """Replace every ``nn.Linear`` under ``module``, and hand the store to the tensor-parallel
    linears (they defer their weight gradients themselves); returns how many linears."""
    count = 0
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            setattr(module, name, DeferrableLinear(child, store))
            count += 1
        elif hasattr(child, "weight_grad_store"):
            child.weight_grad_store = store
            count += 1
        else:
            count += make_deferrable(child, store)
    return count
