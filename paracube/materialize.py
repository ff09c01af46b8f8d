"""Starting a model too large for one rank: build it on the meta device, fill only this
rank's shards.

Every rank used to build the whole fp32 model and then keep its slices (llama2-70b: 280 GB
per rank). Now :func:`paracube.parallelize.parallelize` builds the GPT on the ``meta``
device (shapes, no memory), applies the tensor-parallel plan and the pipeline split to it,
and :func:`materialize` then gives values to the parameters this rank keeps: it walks the
serial model's parameters in order, draws each one's full initial value
(:func:`paracube.models.gpt.initial_values` — one generator, so the values are the serial
model's), copies this rank's blocks of it (:func:`~paracube.tensor_parallel.plan.tp_blocks`)
and drops it. Peak memory: this rank's shards plus one full parameter.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from paracube.config import ModelConfig
from paracube.models.gpt import CausalSelfAttention, initial_values, rotary_tables
from paracube.tensor_parallel.plan import tp_blocks


@torch.no_grad()
def materialize(
    named: Iterable[tuple[str, nn.Parameter]],
    modules: Iterable[nn.Module],
    cfg: ModelConfig,
    seed: int,
    tp: tuple[int, int],
) -> None:
    """Give the meta parameters ``named`` (serial name → this rank's parameter) their
    initial values for ``seed`` under tensor parallelism ``tp = (rank, size)``, and the
    ``modules``' buffers (rotary tables) theirs."""
    modules = list(modules)
    wanted = dict(named)
    holders = _holders(modules)
    done: set[str] = set()
    for name, full in initial_values(cfg, seed):
        names = [name] + (
            ["head.weight"] if cfg.tie_embeddings and name == "embed.tok.weight" else []
        )
        for n in names:  # a tied head on the last stage takes the embedding's value
            p = wanted.get(n)
            if p is not None and p.is_meta:
                _replace(p, _shard_of(full, p, tp), holders)
            if p is not None:
                done.add(n)
    for module in modules:
        for m in module.modules():
            if isinstance(m, CausalSelfAttention) and m.rotary:
                m.cos, m.sin = rotary_tables(cfg.seq_len, cfg.head_dim)
    missing = sorted(set(wanted) - done)
    if missing:
        raise RuntimeError(f"parameters without an initial value: {missing}")


def _holders(modules) -> dict[int, list[tuple[nn.Module, str]]]:
    """Where each parameter object is registered (a tied weight is in two modules)."""
    found: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in modules:
        for m in module.modules():
            for key, p in m._parameters.items():
                if p is not None:
                    found.setdefault(id(p), []).append((m, key))
    return found


def _replace(old: nn.Parameter, value: torch.Tensor, holders) -> None:
    """A real parameter in place of the meta one, with its marks (``tp_dim`` …), in every
    module that holds it (a meta tensor's data cannot be assigned in place)."""
    new = nn.Parameter(value, requires_grad=old.requires_grad)
    new.__dict__.update(old.__dict__)
    for m, key in holders.get(id(old), []):
        m._parameters[key] = new


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``, KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _shard_of(full: torch.Tensor, param: nn.Parameter, tp: tuple[int, int]) -> torch.Tensor:
    """This rank's part of ``full`` laid out as ``param`` (padding rows stay zero)."""
    _, dim, blocks = tp_blocks(param, *tp)
    if dim is None:
        return full.clone()
    local = torch.zeros(param.shape, dtype=full.dtype)
    for start, length, global_start in blocks:
        local.narrow(dim, start, length).copy_(full.narrow(dim, global_start, length))
    return local
