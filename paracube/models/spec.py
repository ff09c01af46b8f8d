"""A model paracube can parallelise: the module, and the few facts the engine needs about it.

Every engine works on a :class:`ModelSpec`, whichever model it is — paracube's reference
GPT, a Hugging Face model (:mod:`paracube.models.hf`) or a user's factory::

    tokens (B, T) ──chain[0]──▶ (B, T, H) ──chain[1…]──▶ … ──chain[-1]──▶ logits (B, T, V)

- ``chain``: the forward pass as a sequence of modules, each taking the previous output
  (the first takes the tokens, the last returns the logits) — the pipeline cuts it into
  stages; ``chain_names`` are their paths, so that a stage's parameters keep the serial
  model's names (checkpoints, parity tests);
- ``units``: the repeated blocks — ZeRO-3 gathers one at a time, recomputation wraps;
- ``tp_plan``: module path pattern → :mod:`paracube.tensor_parallel.plan` style (None:
  the model cannot be tensor-parallel);
- ``config``: its shape as a :class:`~paracube.config.ModelConfig`, what the validator
  and the planner reason about (hidden size for the pipeline's activations, heads for tp).

A user factory (``paracube train --model pkg.mod:build``) returns one::

    >>> import torch
    >>> from paracube.config import ModelConfig
    >>> from paracube.models.gpt import GPT
    >>> cfg = ModelConfig(n_layers=2, hidden=32, n_heads=4, vocab_size=256, seq_len=16)
    >>> spec = ModelSpec.from_names(GPT(cfg), cfg, ["embed", "blocks.0", "blocks.1", "norm", "head"],
    ...                             units=["blocks.0", "blocks.1"])
    >>> spec.module(torch.zeros(1, 16, dtype=torch.long)).shape
    torch.Size([1, 16, 256])
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from paracube.config import ModelConfig, TrainConfig
from paracube.errors import ConfigError
from paracube.models.sources import source_of


@dataclass
class ModelSpec:
    module: nn.Module
    config: ModelConfig
    chain: list[nn.Module]
    chain_names: list[str]
    units: list[nn.Module]
    tp_plan: dict | None = None
    # the plan shards the sequence under --sequence-parallel (scatters after the embedding,
    # marks the norms): a plan without it would see whole sequences where it expects T/tp
    sequence_parallel: bool = False
    # turn on a unit's full recomputation (None: its forward is wrapped in a checkpoint)
    recompute_unit: Callable[[nn.Module], None] | None = None
    # a module built on the meta device, given values per shard by paracube.materialize
    # (paracube's GPT); otherwise every rank builds it whole from the seed
    meta: bool = False
    # called after tensor parallelism with its size under sequence parallelism (else 1):
    # models whose blocks derive positions from the activation's length
    on_sequence_shards: Callable[[int], None] | None = None

    def rebind(self) -> None:
        """Point the chain and the units at the module's current submodules, after a pass
        that replaced some (tensor parallelism swaps nn.Linear for its parallel layers);
        a :class:`Borrowed` chain element re-reads its own."""
        for i, (name, layer) in enumerate(zip(self.chain_names, self.chain)):
            if isinstance(layer, Borrowed):
                layer.rebind(self.module)
            else:
                self.chain[i] = self.module.get_submodule(name)
        names = {id(m): n for n, m in self.module.named_modules()}
        self.units[:] = [self.module.get_submodule(names[id(u)]) for u in self.units]

    @classmethod
    def from_names(
        cls, module: nn.Module, config: ModelConfig, chain: list[str], units: list[str], **kw
    ) -> ModelSpec:
        """A spec whose chain and units are submodules named by path."""
        get = module.get_submodule
        return cls(
            module, config, [get(n) for n in chain], list(chain), [get(n) for n in units], **kw
        )

    def tied_groups(self) -> list[list[str]]:
        return tied_groups(self.module)


class Borrowed(nn.Module):
    """A chain element made of the model's own submodules (``paths``: attribute → module
    path), for a step the model's forward does inline (GPT-2 adds its position embedding
    to the token embedding). Its parameters keep their names when its chain name is the
    modules' parent (``transformer`` + ``wte.weight``)."""

    def __init__(self, root: nn.Module, paths: dict[str, str]):
        super().__init__()
        self.paths = paths
        self.rebind(root)

    def rebind(self, root: nn.Module) -> None:
        for attr, path in self.paths.items():
            setattr(self, attr, root.get_submodule(path))


def tied_groups(module: nn.Module) -> list[list[str]]:
    """Names sharing one parameter object (a tied embedding and head), by identity."""
    by_id: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def gpt_spec(model: nn.Module) -> ModelSpec:
    """paracube's reference GPT as a spec (its plan, chain and blocks)."""
    from paracube.models.gpt import GPT
    from paracube.models.shapes import chain_names
    from paracube.tensor_parallel.plan import gpt_plan

    assert isinstance(model, GPT)
    cfg = model.cfg
    return ModelSpec(
        model, cfg, model.layers(), chain_names(cfg), list(model.blocks), gpt_plan(cfg),
        sequence_parallel=True, meta=next(model.parameters()).is_meta,
    )  # fmt: skip


def checkpoint_forward(unit: nn.Module) -> None:
    """Full recomputation of any module (Chen et al. 2016): its forward runs under a
    non-reentrant checkpoint — activations inside it are recomputed in backward, and the
    hooks on the module (ZeRO-3's gather) run once per call, around it."""
    from torch.utils.checkpoint import checkpoint

    original = unit.forward
    unit.forward = lambda *a, **kw: (
        checkpoint(original, *a, use_reentrant=False, **kw)
        if torch.is_grad_enabled()
        else original(*a, **kw)
    )


def check_plan(spec: ModelSpec, tp: int, sequence_parallel: bool) -> None:
    """A model without a tensor-parallel plan at tp > 1, or whose plan does not shard
    the sequence under --sequence-parallel, is refused (it would run whole tensors where
    the layout expects shards)."""
    if tp > 1 and spec.tp_plan is None:
        raise ConfigError(
            f"{spec.config.name} has no tensor-parallel plan: give its ModelSpec a tp_plan, or use --tp 1"
        )
    if sequence_parallel and not spec.sequence_parallel:
        raise ConfigError(
            f"{spec.config.name}'s tensor-parallel plan does not shard the sequence: drop "
            "--sequence-parallel, or write the plan for it and set ModelSpec.sequence_parallel"
        )


def build_model(cfg: TrainConfig, meta: bool = True) -> ModelSpec:
    """This job's model, as every rank builds it (the same values from ``cfg.seed``):
    paracube's GPT on the meta device when ``meta``, a Hugging Face model or a factory's
    whole."""
    from paracube.models.gpt import GPT

    torch.manual_seed(cfg.seed)
    if cfg.model_source is None:
        with torch.device("meta") if meta else contextlib.nullcontext():
            return gpt_spec(GPT(cfg.model))
    source = source_of(cfg.model_source)
    if source.kind == "hf":
        from paracube.models.hf import build_hf

        return build_hf(source.where, cfg.model)
    spec = call_factory(source.where)
    if spec.config.replace(seq_len=cfg.model.seq_len) != cfg.model:  # --seq-len: the window
        raise ConfigError(
            f"--model {source.where}: the factory returned a different model on this rank "
            "(it must build the same model every time it is called)"
        )
    spec.config = cfg.model
    return spec


def serial_shapes(cfg: TrainConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the job's serial model by name (a tied one once, under its
    first name), from a build on the meta device: nothing allocated, no weights read."""
    with torch.device("meta"):
        spec = build_model(cfg, meta=True)
    return {name: tuple(p.shape) for name, p in spec.module.named_parameters()}


def tied_aliases(groups: list[list[str]]) -> dict[str, str]:
    """Each later name of a tied group → the first (the name the serial model lists)."""
    return {alias: names[0] for names in groups for alias in names[1:]}


def call_factory(target: str) -> ModelSpec:
    """Import ``package.module:function`` (from the working directory too, as ``python
    -m`` would) and call it; it must return a ModelSpec."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, fn_name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--model {target}: cannot import it ({e})") from None
    spec = fn()
    if not isinstance(spec, ModelSpec):
        raise ConfigError(
            f"--model {target} returned {type(spec).__name__}, not a paracube.models.ModelSpec: "
            "wrap the module with ModelSpec.from_names(module, config, chain, units)"
        )
    if len(spec.chain) != len(spec.chain_names):
        raise ConfigError(
            f"--model {target}: {len(spec.chain)} chain modules but {len(spec.chain_names)} names"
        )
    covered = {id(p) for layer in spec.chain for p in layer.parameters()}
    missing = [n for n, p in spec.module.named_parameters() if id(p) not in covered]
    if missing:  # a pipeline stage holds only its chain modules: this one would never train
        raise ConfigError(
            f"--model {target}: parameter {missing[0]} is in none of the chain's modules, so a "
            "pipeline would never train it: add its module to the chain"
        )
    return spec


def factory_config(target: str, tp: int = 1, sequence_parallel: bool = False) -> ModelConfig:
    """A factory's model shape, from one call on the meta device (nothing allocated),
    its plan checked against the layout."""
    with torch.device("meta"):
        spec = call_factory(target)
    check_plan(spec, tp, sequence_parallel)
    return spec.config
