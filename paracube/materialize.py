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

import torch
from torch import nn

from paracube.config import ModelConfig
from paracube.models.gpt import CausalSelfAttention, initial_values, rotary_tables
from paracube.tensor_parallel.plan import tp_blocks


class Materializer:
    """Fills meta parameters with their serial initial values, claim by claim, drawing
    :func:`~paracube.models.gpt.initial_values` once in order: a value drawn before it is
    claimed is kept only if this rank will claim it (ZeRO-3 builds its units one by one,
    the root — embedding, final norm, head — last, so the embedding waits)."""

    def __init__(
        self, model: nn.Module, named, cfg: ModelConfig, seed: int, tp, dtype=None, device=None
    ):
        self.cfg, self.tp, self.dtype, self.device = cfg, tp, dtype, device
        self.names = {id(p): n for n, p in named}  # this rank's parameters, by serial name
        self.holders = _holders([model])
        self._values = initial_values(cfg, seed)
        self._drawn: dict[str, torch.Tensor] = {}
        # How many of this rank's parameters take each drawn value (a tied head takes the
        # embedding's): a value is kept until its last claim, then dropped.
        self._claims: dict[str, int] = {}
        for name in self.names.values():
            source = self._source(name)
            self._claims[source] = self._claims.get(source, 0) + 1

    def _source(self, name: str) -> str:
        tied = name == "head.weight" and self.cfg.tie_embeddings
        return "embed.tok.weight" if tied else name

    @torch.no_grad()
    def claim(self, module: nn.Module) -> None:
        """Every meta parameter under ``module`` gets its value; its buffers theirs."""
        for p in list(module.parameters()):
            if p.is_meta and id(p) in self.names:
                source = self._source(self.names[id(p)])
                value = _shard_of(self._value(source), p, self.tp).to(self.device, self.dtype)
                _replace(p, value, self.holders)
                self._claims[source] -= 1
                if not self._claims[source]:
                    del self._drawn[source]
        for m in module.modules():
            if isinstance(m, CausalSelfAttention) and m.rotary and m.cos.is_meta:
                cos, sin = rotary_tables(self.cfg.seq_len, self.cfg.head_dim)
                m.cos, m.sin = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)

    def _value(self, name: str) -> torch.Tensor:
        while name not in self._drawn:
            drawn, value = next(self._values)
            if self._claims.get(drawn):
                self._drawn[drawn] = value
        return self._drawn[name]


def materialize(named, modules, cfg: ModelConfig, seed: int, tp, dtype=None) -> None:
    """Give the meta parameters ``named`` (serial name, this rank's parameter) their
    initial values for ``seed`` under tensor parallelism ``tp = (rank, size)``, in
    ``dtype`` (default fp32), and the ``modules``' rotary tables theirs."""
    root = nn.ModuleList(list(modules))
    Materializer(root, list(named), cfg, seed, tp, dtype).claim(root)
    missing = [n for n, p in root.named_parameters() if p.is_meta]
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
