"""Factories for the command line's refusals (tests/bad_inputs.py)."""

from __future__ import annotations

from examples.own_model import CONFIG, ConvLM

from paracube.models.spec import ModelSpec


def chain_without_the_norm() -> ModelSpec:
    """examples/own_model.py's model with its final norm left out of the chain."""
    blocks = [f"blocks.{i}" for i in range(CONFIG.n_layers)]
    return ModelSpec.from_names(ConvLM(CONFIG), CONFIG, ["embed", *blocks, "head"], units=blocks)
