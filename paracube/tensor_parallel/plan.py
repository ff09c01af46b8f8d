"""Declarative tensor-parallel plans: module path pattern → style, applied to an unchanged model.

A plan names *where* to shard (``blocks.*.attn.qkv_proj``) and *how* (a style); the model
code knows nothing about it (docs/ARCHITECTURE.md; the same idea as torchtitan's
``parallelize_module`` plans). For the reference GPT (Shoeybi et al. 2019, §3):

- attention is split by heads: the fused q|k|v projection column-parallel (each rank n/tp
  heads), the output projection row-parallel; the MLP is column → row; so each block needs
  one collective at the entry of attention and of the MLP (in the column-parallel layer:
  *f*, or an all-gather along the sequence) and one at their exit (in the row-parallel
  layer: *g*, or a reduce-scatter);
- embedding and LM head are split by vocabulary; the loss is vocabulary-parallel;
- with sequence parallelism (Korthikanti et al. 2022, §4.2.2) the norms and the residual
  stream hold T/tp tokens per rank; their replicated parameters see only their tokens,
  so their gradients are marked ``sequence_parallel`` and summed over the group.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from paracube.comm import autograd as C
from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.config import ModelConfig
from paracube.models.gpt import GPT
from paracube.models.spec import tied_groups
from paracube.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    mark,
    unshard,
)


@dataclass(frozen=True)
class TPContext:
    group: object
    ledger: CommLedger | None
    sequence_parallel: bool = False


class Style:
    """How one matched module is parallelised. Returns the module that replaces it."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        raise NotImplementedError


@dataclass(frozen=True)
class Colwise(Style):
    """nn.Linear → ColumnParallelLinear. ``prepare_input``: apply f / all-gather here
    (False when a ``PrepareInput`` on the parent already did it for several linears);
    ``sections``: the output sizes of a fused projection, split part by part."""

    prepare_input: bool = True
    gather_output: bool = False
    sections: tuple[int, ...] | None = None
    vocab: bool = False  # an LM head: rows padded to a multiple of tp (masked in the loss)

    def apply(self, module, ctx):
        mode = ("gather_sp" if ctx.sequence_parallel else "copy") if self.prepare_input else None
        return ColumnParallelLinear.from_linear(
            module,
            ctx.group,
            ctx.ledger,
            gather_output=self.gather_output,
            input_mode=mode,
            sections=self.sections,
            vocab=self.vocab,
        )


@dataclass(frozen=True)
class Rowwise(Style):
    """nn.Linear → RowParallelLinear (all-reduce, or reduce-scatter under SP)."""

    def apply(self, module, ctx):
        mode = "reduce_scatter_sp" if ctx.sequence_parallel else "reduce"
        return RowParallelLinear.from_linear(module, ctx.group, ctx.ledger, output_mode=mode)


@dataclass(frozen=True)
class VocabEmbedding(Style):
    def apply(self, module, ctx):
        return VocabParallelEmbedding.from_embedding(module, ctx.group, ctx.ledger)


@dataclass(frozen=True)
class PrepareInput(Style):
    """Before the module runs: f on its input (or all-gather the sequence under SP), once
    for all the column-parallel linears inside it. The input is the first positional
    argument, or ``keyword`` when passed by name (Hugging Face passes ``hidden_states=``)."""

    keyword: str = "hidden_states"

    def apply(self, module, ctx):
        fn = C.gather_from_sp if ctx.sequence_parallel else C.copy_to_tp

        def hook(_m, args, kwargs):
            if args:
                return (fn(args[0], ctx.group, ctx.ledger), *args[1:]), kwargs
            if self.keyword not in kwargs:
                raise TypeError(
                    f"{type(module).__name__} was called with neither a positional input nor "
                    f"{self.keyword}=: give PrepareInput(keyword=...) the name its caller uses"
                )
            return args, {**kwargs, self.keyword: fn(kwargs[self.keyword], ctx.group, ctx.ledger)}

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module


@dataclass(frozen=True)
class DivideAttrs(Style):
    """Divide integer attributes by tp — sizes a module's forward reads to split a fused
    output (GPT-2's ``split_size``: each of q, k, v is H/tp wide on a rank)."""

    names: tuple[str, ...]

    def apply(self, module, ctx):
        tp = ops.group_size(ctx.group)
        for name in self.names:
            value = getattr(module, name)
            if value % tp:
                raise ValueError(
                    f"{type(module).__name__}.{name} = {value} is not divisible by tp {tp}"
                )
            setattr(module, name, value // tp)
        return module


@dataclass(frozen=True)
class ScatterOutputSP(Style):
    """Under SP: keep this rank's slice of the module's output sequence (all-gather backward)."""

    def apply(self, module, ctx):
        if ctx.sequence_parallel:
            module.register_forward_hook(
                lambda _m, _args, out: C.scatter_to_sp(out, ctx.group, ctx.ledger)
            )
        return module


@dataclass(frozen=True)
class SequenceSharded(Style):
    """A replicated module (norm) that runs on T/tp tokens under SP: partial gradients."""

    def apply(self, module, ctx):
        if ctx.sequence_parallel:
            for p in module.parameters():
                mark(p, sequence_parallel=True)
        return module


class HeadShared(Style):
    """A replicated module fed this rank's own attention heads (Qwen3's per-head q and k
    norms, after the column-parallel projections): every rank holds the whole weight but
    sees 1/tp of the heads, so its gradient is partial — summed over tp as a
    sequence-sharded norm's is, with or without sequence parallelism."""

    def apply(self, module, ctx):
        for p in module.parameters():
            mark(p, sequence_parallel=True)
        return module


def gpt_plan(cfg: ModelConfig) -> dict[str, Style | tuple[Style, ...]]:
    """The tensor-parallel plan of :class:`paracube.models.gpt.GPT`.

    The fused q|k|v projection is split by heads section by section (each rank n/tp query
    and n_kv/tp key/value heads); SwiGLU's fused gate|up likewise."""
    kv = cfg.n_kv_heads * cfg.head_dim
    up_sections = (cfg.ffn_hidden, cfg.ffn_hidden) if cfg.activation == "swiglu" else None
    # per-head q and k norms run on this rank's heads: whole weights, partial gradients
    qk_norms: dict[str, Style | tuple[Style, ...]] = (
        {"blocks.*.attn.q_norm": HeadShared(), "blocks.*.attn.k_norm": HeadShared()}
        if cfg.qk_norm
        else {}
    )
    return {
        "embed": ScatterOutputSP(),
        "embed.tok": VocabEmbedding(),
        "blocks.*.attn_norm": SequenceSharded(),
        "blocks.*.attn.qkv_proj": Colwise(sections=(cfg.q_dim, kv, kv)),
        **qk_norms,
        "blocks.*.attn.o_proj": Rowwise(),
        "blocks.*.mlp_norm": SequenceSharded(),
        "blocks.*.mlp.up_proj": Colwise(sections=up_sections),
        "blocks.*.mlp.down_proj": Rowwise(),
        "norm": SequenceSharded(),
        "head": Colwise(vocab=True),  # vocab-parallel logits (B, T, V_padded/tp)
    }


Plan = dict[str, "Style | tuple[Style, ...]"]


def apply_plan(model: nn.Module, plan: Plan, ctx: TPContext) -> nn.Module:
    """Apply ``plan`` in its order (a tuple of styles in its own order); every pattern
    must match at least one module.

    Parameters tied by identity before (an embedding and its LM head) are tied again
    after: both are split by vocabulary rows the same way, so they share the shard."""
    tied = tied_groups(model)
    for pattern, styles in plan.items():
        names = [n for n, _ in model.named_modules() if n and fnmatch.fnmatchcase(n, pattern)]
        if not names:
            raise ValueError(f"tensor-parallel plan entry {pattern!r} matches no module")
        for style in styles if isinstance(styles, tuple) else (styles,):
            for name in names:
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                setattr(parent, child, style.apply(getattr(parent, child), ctx))
    for first, *others in tied:
        shared = model.get_parameter(first)
        for name in others:
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            own = getattr(module, attr)
            if own.shape != shared.shape:
                raise ValueError(
                    f"{first} and {name} are tied but the plan shards them differently "
                    f"({tuple(shared.shape)} vs {tuple(own.shape)})"
                )
            setattr(module, attr, shared)
    return model


def parallelize_gpt(model: GPT, ctx: TPContext) -> GPT:
    """Shard a full (seeded) GPT for this rank's place in the tensor-parallel group."""
    if ops.group_size(ctx.group) == 1:
        return model
    apply_plan(model, gpt_plan(model.cfg), ctx)
    return model


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]


@torch.no_grad()
def sync_sequence_parallel_grads(params: list[nn.Parameter], group, ledger=None) -> None:
    """Sum the partial gradients of sequence-sharded replicated parameters over the group
    (one flat all-reduce)."""
    ops.all_reduce_coalesced(
        [p.grad for p in params if p.grad is not None], group, ledger, tag="sp_grad"
    )


@torch.no_grad()
def full_tensor(local: torch.Tensor, param: nn.Parameter, group) -> torch.Tensor:
    """``local`` (a shard shaped like ``param``, e.g. its gradient) at full size: the
    shards of every rank gathered and, for fused projections, put back section by section."""
    dim = getattr(param, "tp_dim", None)
    world = ops.group_size(group)
    if dim is None or world == 1:
        return local.detach().clone()
    gathered = ops.all_gather(local.detach().movedim(dim, 0).contiguous(), group).movedim(0, dim)
    full = unshard(
        list(gathered.chunk(world, dim=dim)),
        dim,
        getattr(param, "tp_sections", (param.shape[dim],)),
    )
    vocab = getattr(param, "tp_vocab", None)
    if vocab is not None:  # drop the vocabulary padding
        full = full.narrow(0, 0, vocab)
    return full.contiguous()


def tp_blocks(param: nn.Parameter, tp_rank: int, tp_size: int):
    """``(global shape, dim, [(local start, length, global start), ...])`` of a local
    parameter; ``dim`` None when it is not split (replicated)."""
    dim = getattr(param, "tp_dim", None)
    shape = list(param.shape)
    if dim is None or tp_size == 1:
        return tuple(shape), None, [(0, shape[0] if shape else 1, 0)]
    sections = getattr(param, "tp_sections", (param.shape[dim],))
    blocks, local, base = [], 0, 0
    for s in sections:  # the rank's part of section j: global rows base + rank·s
        blocks.append((local, s, base + tp_rank * s))
        local, base = local + s, base + s * tp_size
    shape[dim] = base
    vocab = getattr(param, "tp_vocab", None)
    if vocab is not None:  # drop the padding rows
        shape[0] = vocab
        blocks = [(ls, min(n, vocab - gs), gs) for ls, n, gs in blocks if gs < vocab]
    return tuple(shape), dim, blocks


def full_parameters(model: nn.Module, group) -> dict[str, torch.Tensor]:
    """Every parameter at full size, by name — as the serial model names them."""
    return {name: full_tensor(p, p, group) for name, p in model.named_parameters()}
