"""Starting a model too large for one rank: build it on the meta device, fill only this
rank's shards.

Every rank used to build the whole fp32 model and then keep its slices (llama2-70b: 280 GB
per rank). Now :func:`paracube.parallelize.parallelize` builds the GPT on the ``meta``
device (shapes, no memory), applies the tensor-parallel plan and the pipeline split to it,
and :func:`materialize` then gives values to the parameters this rank keeps: a parameter
kept whole is drawn in place (:func:`paracube.models.gpt.initial_value`, one generator per
parameter, so the values are the serial model's); a tensor-parallel shard is cut from its
full value drawn into one reused buffer (:func:`~paracube.tensor_parallel.plan.tp_blocks`).
Peak memory: this rank's shards plus the largest full parameter it shards.
"""

from __future__ import annotations

import torch
from torch import nn

from paracube.config import ModelConfig
from paracube.data_parallel.shards import free_storage
from paracube.models.gpt import CausalSelfAttention, initial_value, parameter_shapes, rotary_tables
from paracube.tensor_parallel.plan import tp_blocks


class Materializer:
    """Fills meta parameters with their serial initial values, module by module (ZeRO-3
    claims its units one at a time, each just before slicing it)."""

    def __init__(
        self, model: nn.Module, named, cfg: ModelConfig, seed: int, tp, dtype=None, device=None
    ):
        self.cfg, self.seed, self.tp, self.dtype, self.device = cfg, seed, tp, dtype, device
        self.names = {id(p): n for n, p in named}  # this rank's parameters, by serial name
        self.holders = _holders([model])
        self.shapes = parameter_shapes(cfg)
        self._buffer = torch.empty(0)  # reused for the full values of tensor-parallel shards

    @torch.no_grad()
    def claim(self, module: nn.Module) -> None:
        """Every meta parameter under ``module`` gets its value; its buffers theirs."""
        for p in list(module.parameters()):
            if p.is_meta and id(p) in self.names:
                _replace(p, self.local_value(p), self.holders)
        for m in module.modules():
            if isinstance(m, CausalSelfAttention) and m.rotary and m.cos.is_meta:
                cos, sin = rotary_tables(self.cfg)  # the model's base and scaling
                m.cos, m.sin = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)
        self._buffer = torch.empty(0)

    @torch.no_grad()
    def claim_flat(
        self, params: list[nn.Parameter], padded: int, lo: int, hi: int
    ) -> tuple[list[nn.Parameter], torch.Tensor, torch.Tensor]:
        """A ZeRO-3 unit: ``params`` laid end to end in a flat tensor of ``padded`` elements whose memory
        is released at once; only its ``[lo, hi)`` — this rank's slice — is filled, from
        each overlapping parameter's value in turn. Returns the new parameters (views of
        the flat tensor), the flat tensor and the slice."""
        full = torch.empty(padded, dtype=self.dtype, device=self.device)
        piece = torch.zeros(hi - lo, dtype=self.dtype, device=self.device)
        new, offset = [], 0
        for p in params:
            n = p.numel()
            start, stop = max(offset, lo), min(offset + n, hi)
            if start < stop:
                value = self.local_value(p, temporary=True).flatten()
                piece[start - lo : stop - lo].copy_(value[start - offset : stop - offset])
            # ``.data`` of a new parameter, not a parameter made from the view: the view
            # would share the flat tensor's version counter, and each gather into it would
            # then look to autograd like an in-place change of a saved weight.
            param = _replace(p, torch.empty(0, dtype=full.dtype, device=full.device), self.holders)
            param.data = full[offset : offset + n].view(p.shape)
            new.append(param)
            offset += n
        free_storage(full)  # gathered around each use
        self._buffer = torch.empty(0)
        return new, full, piece

    def local_value(self, p: nn.Parameter, temporary: bool = False) -> torch.Tensor:
        """This rank's initial value of meta parameter ``p`` in the compute dtype: a new
        tensor, or with ``temporary`` possibly a view of the reused buffer, valid until the
        next call. A parameter kept whole is drawn directly; a tensor-parallel shard is cut
        from its full value. Every full value that does not stay is drawn into one buffer
        reused for all of them, so the allocator is not left holding freed full matrices
        between what the rank keeps (glibc kept up to 120 MiB of them on gpt3-125m when
        each had its own)."""
        source = self._source(self.names[id(p)])
        shape = self.shapes[source]
        if not temporary and tp_blocks(p, *self.tp)[1] is None:
            out = torch.empty(shape)
        else:
            if self._buffer.numel() < shape.numel():
                self._buffer = torch.empty(0)  # freed before the larger one is made
                self._buffer = torch.empty(shape.numel())
            out = self._buffer[: shape.numel()].view(shape)
        value = _shard_of(initial_value(self.cfg, self.seed, source, out), p, self.tp)
        return value.to(self.device, self.dtype)

    def _source(self, name: str) -> str:
        tied = name == "head.weight" and self.cfg.tie_embeddings
        return "embed.tok.weight" if tied else name


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


def _replace(old: nn.Parameter, value: torch.Tensor, holders) -> nn.Parameter:
    """A real parameter in place of the meta one, with its marks (``tp_dim`` …), in every
    module that holds it (a meta tensor's data cannot be assigned in place)."""
    new = nn.Parameter(value, requires_grad=old.requires_grad)
    new.__dict__.update(old.__dict__)
    for m, key in holders.get(id(old), []):
        m._parameters[key] = new
    return new


class PeakMemory:
    """How much this process's resident memory peaks above where it stands now: Linux's
    high-water mark (``VmHWM``) is reset to the current size on entry (``clear_refs`` 5),
    so an earlier, freed peak does not hide the growth; where that is not allowed, the
    lifetime peak (``ru_maxrss``) minus the size now — an upper bound."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.start = _status_kib("VmRSS") * 1024

    def growth(self) -> int:
        import resource

        peak = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(peak * 1024 - self.start, 0)


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` size in KiB (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(x.split()[1]) for x in f if x.startswith(field + ":")), 0)
    except OSError:
        return 0


def _shard_of(full: torch.Tensor, param: nn.Parameter, tp: tuple[int, int]) -> torch.Tensor:
    """This rank's part of ``full`` laid out as ``param`` (padding rows stay zero); ``full``
    itself where the rank keeps it whole."""
    _, dim, blocks = tp_blocks(param, *tp)
    if dim is None:
        return full
    local = torch.zeros(param.shape, dtype=full.dtype)
    for start, length, global_start in blocks:
        local.narrow(dim, start, length).copy_(full.narrow(dim, global_start, length))
    return local
