"""Making a pipeline chunk's linears defer their weight gradients (zero-bubble schedules,
Qi et al. 2024; the mechanism is :mod:`paracube.weight_grad`)."""

from __future__ import annotations

from torch import nn

from paracube.weight_grad import DefersWeightGrad, WeightGradStore, linear


class DeferrableLinear(nn.Module):
    """Same parameters and result as the ``nn.Linear`` it replaces; its weight gradient
    can be deferred to a W pass."""

    def __init__(self, module: nn.Linear, store: WeightGradStore):
        super().__init__()
        self.weight, self.bias, self.store = module.weight, module.bias, store

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.store)


def make_deferrable(module: nn.Module, store: WeightGradStore) -> int:
    """Replace every ``nn.Linear`` under ``module`` and hand the store to the layers that
    defer their weight gradients themselves; returns how many linears now defer."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):  # the GPT's Head too (its GPU padding is dropped)
            setattr(module, name, DeferrableLinear(child, store))
            count += 1
        elif isinstance(child, DefersWeightGrad):
            child.weight_grad_store = store
            count += 1
        else:
            count += make_deferrable(child, store)
    return count
