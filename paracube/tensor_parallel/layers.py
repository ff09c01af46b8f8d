"""Megatron-style sharded layers (Shoeybi et al. 2019, §3).

Each layer is built *from the full layer* (``from_linear`` / ``from_embedding``): the
full weight was initialised from the seed, and every rank keeps its slice, so the sharded
model starts equal to the serial one. Sharded parameters carry ``tp_dim`` (the dim they
are split along) so that gradient norms, checkpoints and parity tests can reassemble them.

Shapes: B batch, T sequence (T/tp under sequence parallelism), H hidden, O outputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paracube.comm import autograd as C
from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.weight_grad import DefersWeightGrad, linear

# How a layer's input is prepared / its output finished (None: nothing, the plan did it).
INPUT_MODES = (None, "copy", "gather_sp")
OUTPUT_MODES = ("reduce", "reduce_scatter_sp")


def _shard(
    t: torch.Tensor, dim: int, group, sections: tuple[int, ...] | None = None
) -> nn.Parameter:
    """This rank's shard of ``t`` along ``dim``. A fused tensor made of ``sections`` (e.g.
    q | k | v) is split section by section, so the shard is [q_i | k_i | v_i]."""
    rank, world = dist.get_rank(group), ops.group_size(group)
    sections = sections or (t.shape[dim],)
    if sum(sections) != t.shape[dim] or any(s % world for s in sections):
        raise ValueError(f"cannot split sections {sections} of dim {dim} into {world} equal shards")
    parts = [part.chunk(world, dim=dim)[rank] for part in t.detach().split(list(sections), dim=dim)]
    p = nn.Parameter(torch.cat(parts, dim=dim).clone())
    mark(p, tp_dim=dim, tp_sections=tuple(s // world for s in sections))
    return p


def mark(p: nn.Parameter, **facts: object) -> None:
    """Record how tensor parallelism treats ``p`` on the parameter itself, where norms,
    checkpoints and parity tests read it: ``tp_dim`` (split along), ``tp_sections`` (of a
    fused projection), ``tp_vocab`` (true rows before padding), ``sequence_parallel``
    (replicated but fed T/tp tokens: its gradient is partial)."""
    for name, value in facts.items():
        setattr(p, name, value)


def pad_vocab(t: torch.Tensor, world: int) -> torch.Tensor:
    """``t`` (V, ...) with zero rows appended up to a multiple of ``world`` — Megatron's
    vocabulary padding, so that any vocabulary (GPT-2's 50,257) splits over any tp. The
    padded rows are never looked up (tokens < V) and their logits are masked out of the
    loss, so they get no gradient and stay zero."""
    rows = t.shape[0]
    padded = -(-rows // world) * world
    if padded == rows:
        return t
    return torch.cat([t.detach(), t.new_zeros((padded - rows, *t.shape[1:]))])


def _vocab_shard(t: torch.Tensor, group) -> nn.Parameter:
    """This rank's rows of the (padded) vocabulary; remembers the true size for unsharding."""
    p = _shard(pad_vocab(t, ops.group_size(group)), 0, group)
    mark(p, tp_vocab=t.shape[0])
    return p


def unshard(parts: list[torch.Tensor], dim: int, sections: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`_shard`: every rank's shard (in rank order) → the full tensor."""
    split = [part.split(list(sections), dim=dim) for part in parts]  # [rank][section]
    return torch.cat(
        [torch.cat([s[j] for s in split], dim=dim) for j in range(len(sections))], dim=dim
    )


def _replicated(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


class _TPModule(nn.Module):
    def __init__(self, group, ledger: CommLedger | None):
        super().__init__()
        self.group, self.ledger = group, ledger
        self.tp_rank, self.tp_size = dist.get_rank(group), ops.group_size(group)

    def _prepare_input(self, x: torch.Tensor, mode: str | None) -> torch.Tensor:
        if mode == "copy":
            return C.copy_to_tp(x, self.group, self.ledger)
        if mode == "gather_sp":
            return C.gather_from_sp(x, self.group, self.ledger)
        return x


class _LinearWithInputCollective(torch.autograd.Function):
    """Y = prep(X)·Wᵀ + b, where prep is f (identity; all-reduce of dX in backward) or the
    sequence all-gather (reduce-scatter of dX in backward).

    Fused so that the backward can overlap its collective with computation, as Megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication``: dX = dY·W is computed first, its
    reduction launched asynchronously, then dW = dYᵀ·X is computed while it travels.

    Under sequence parallelism the layer keeps its input's sequence shard (B, T/tp, H) for
    backward, not the gathered (B, T, H), and gathers it again there while dX is computed —
    Korthikanti et al. 2022, §4.2.2: every activation a block keeps is 1/tp of the sequence,
    for one more all-gather per such layer in backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, mode, group, ledger, store=None):
        full = C.gather_sequence(x, group, ledger) if mode == "gather_sp" else x  # (B, T, H)
        ctx.save_for_backward(x, weight)  # under "gather_sp" the shard (B, T/tp, H)
        # The parameter object itself, for a deferred W pass: a saved tensor comes back as a
        # different object under saved-tensor hooks, whose .grad the optimizer never sees.
        ctx.weight = weight
        ctx.mode, ctx.group, ctx.ledger, ctx.has_bias = mode, group, ledger, bias is not None
        ctx.store, ctx.bias = store, bias
        return F.linear(full, weight, bias)  # (B, T, O/tp)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        if ctx.mode == "gather_sp":  # the input again, beside dX's GEMM
            gathering = C.gather_sequence_async(x, ctx.group, ctx.ledger)
        grad_in = grad_out.matmul(weight)  # (B, T, H): this rank's share of dX
        if ctx.mode == "gather_sp":
            full = gathering.wait()  # (B, T, H)
            pending = C.reduce_scatter_sequence_async(grad_in, ctx.group, ctx.ledger)
        else:
            full = x
            pending = ops.all_reduce(grad_in, ctx.group, ctx.ledger, tag="tp", async_op=True)
        if ctx.store is not None and ctx.store.active:  # zero-bubble I pass: dW in its W
            ctx.store.push(grad_out, full, ctx.weight, ctx.bias)
            return pending.wait(), None, None, None, None, None, None
        g2 = grad_out.reshape(-1, grad_out.shape[-1])  # (B·T, O/tp)
        grad_weight = g2.t().matmul(full.reshape(-1, full.shape[-1]))  # (O/tp, H), overlapped
        grad_bias = g2.sum(0) if ctx.has_bias else None
        return pending.wait(), grad_weight, grad_bias, None, None, None, None


@torch.compiler.disable  # its collectives outside a compiled block's trace (comm.autograd)
def _linear_with_input_collective(x, weight, bias, mode, group, ledger, store):
    return _LinearWithInputCollective.apply(x, weight, bias, mode, group, ledger, store)


class _ParallelLinear(_TPModule, DefersWeightGrad):
    """What the column- and row-parallel linears share: construction from a full layer,
    and a ``weight_grad_store`` through which a zero-bubble pipeline defers their weight
    gradients (:mod:`paracube.weight_grad`)."""

    @classmethod
    def from_linear(cls, linear: nn.Module, group, ledger=None, **kw):
        """From an ``nn.Linear`` (weight (out, in)), or a GPT-2 style ``Conv1D`` (weight
        (in, out), ``nf`` outputs): its weight is transposed into the Linear layout."""
        weight: torch.Tensor
        if isinstance(linear, nn.Linear):
            weight = linear.weight
        elif hasattr(linear, "nf") and hasattr(linear, "nx"):  # transformers' Conv1D
            weight = linear.get_parameter("weight").T
        else:
            raise TypeError(
                f"{cls.__name__}.from_linear needs an nn.Linear or a Conv1D, got "
                f"{type(linear).__name__}: shard its linear submodules instead"
            )
        return cls(weight, linear.bias, group, ledger, **kw)  # type: ignore[call-arg, arg-type]


class ColumnParallelLinear(_ParallelLinear):
    """Y = X·Aᵀ with A split by rows (output features): rank i computes Y_i = X·A_iᵀ.

    Input (B, T, H) replicated — or, under sequence parallelism, (B, T/tp, H) gathered
    here; output (B, T, O/tp), or (B, T, O) with ``gather_output``. ``sections`` splits a
    fused projection part by part (q | k | v → each rank gets q_i | k_i | v_i).
    ``input_mode``: ``"copy"`` (f), ``"gather_sp"``, or ``None`` when the caller already
    prepared the input.
    """

    def __init__(
        self,
        weight,
        bias,
        group,
        ledger=None,
        *,
        gather_output=False,
        input_mode="copy",
        sections=None,
        vocab: bool = False,
    ):
        super().__init__(group, ledger)
        assert input_mode in INPUT_MODES
        # (O/tp, H); an LM head (``vocab``) is padded to a multiple of tp rows first
        self.weight = _vocab_shard(weight, group) if vocab else _shard(weight, 0, group, sections)
        self.bias = _shard(bias, 0, group, sections) if bias is not None else None  # (O/tp,)
        self.gather_output, self.input_mode = gather_output, input_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_mode is None or self.tp_size == 1:
            y = linear(x, self.weight, self.bias, self.weight_grad_store)
        else:
            y = _linear_with_input_collective(
                x,
                self.weight,
                self.bias,
                self.input_mode,
                self.group,
                self.ledger,
                self.weight_grad_store,
            )
        return C.gather_from_tp(y, self.group, self.ledger) if self.gather_output else y

    def extra_repr(self) -> str:
        shard = tuple(self.weight.shape)
        return f"shard={shard}, tp={self.tp_size}, input={self.input_mode}, gather={self.gather_output}"


class RowParallelLinear(_ParallelLinear):
    """Y = Σ_i X_i·A_iᵀ with A split by columns (input features).

    Input (B, T, H/tp) — the output of a column-parallel layer — or full (B, T, H) split
    here if ``input_is_parallel=False``. The partial products are summed by an all-reduce
    (output (B, T, O)), or by a reduce-scatter along the sequence under sequence
    parallelism (output (B, T/tp, O)); the bias is added once, after the sum.
    """

    def __init__(
        self, weight, bias, group, ledger=None, *, input_is_parallel=True, output_mode="reduce"
    ):
        super().__init__(group, ledger)
        assert output_mode in OUTPUT_MODES
        self.weight = _shard(weight, 1, group)  # (O, H/tp)
        self.bias = _replicated(bias) if bias is not None else None  # (O,)
        if self.bias is not None and output_mode == "reduce_scatter_sp":
            mark(self.bias, sequence_parallel=True)  # sees only this rank's tokens: partial grads
        self.input_is_parallel, self.output_mode = input_is_parallel, output_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = C.scatter_to_tp(x, self.group, self.ledger)
        # (B, T, O): this rank's share of the sum over the input columns.
        partial = linear(x, self.weight, None, self.weight_grad_store)
        if self.output_mode == "reduce_scatter_sp":
            y = C.reduce_scatter_to_sp(partial, self.group, self.ledger)  # (B, T/tp, O)
        else:
            y = C.reduce_from_tp(partial, self.group, self.ledger)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"shard={tuple(self.weight.shape)}, tp={self.tp_size}, output={self.output_mode}"


class VocabParallelEmbedding(_TPModule):
    """Embedding table split by vocabulary rows: rank i holds rows [i·V/tp, (i+1)·V/tp)
    of the vocabulary padded to a multiple of tp (:func:`pad_vocab`).

    Tokens outside a rank's range look up zeros there; an all-reduce sums the one real
    row per token. Tokens (B, T) → (B, T, H).

    What the split embedding carries over from the module it replaces: its padding row
    (``padding_idx``: looked up as any row, but given no gradient — the rank that holds it
    passes its local index to ``F.embedding``), and a scale its lookup multiplies by
    (``embed_scale``: Gemma's √hidden, transformers' ``GemmaTextScaledWordEmbedding``,
    applied in the weights' dtype as it applies it).
    """

    def __init__(self, weight, group, ledger=None, *, padding_idx=None, scale=None):
        super().__init__(group, ledger)
        self.weight = _vocab_shard(weight, group)  # (V_padded/tp, H)
        self.vocab_start = self.tp_rank * self.weight.shape[0]
        local_pad = None if padding_idx is None else padding_idx - self.vocab_start
        self.padding_idx = (
            local_pad if local_pad is not None and 0 <= local_pad < len(self.weight) else None
        )
        self.register_buffer(
            "scale", None if scale is None else scale.detach().clone(), persistent=False
        )

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, group, ledger=None) -> VocabParallelEmbedding:
        """From an ``nn.Embedding`` (or a subclass that only scales its lookup by
        ``embed_scale``); refused where the split table would look up otherwise — row
        renormalisation (``max_norm``), frequency-scaled or sparse gradients, or a lookup of
        the subclass's own — rather than train another embedding."""
        own_lookup = type(emb).forward is not nn.Embedding.forward and not hasattr(
            emb, "embed_scale"
        )
        unkept = [
            name
            for name, differs in (
                ("max_norm", emb.max_norm is not None),
                ("scale_grad_by_freq", emb.scale_grad_by_freq),
                ("sparse", emb.sparse),
                (f"{type(emb).__name__}.forward", own_lookup),
            )
            if differs
        ]
        if unkept:
            raise TypeError(
                f"{cls.__name__}.from_embedding cannot split an embedding with "
                f"{', '.join(unkept)}: the vocabulary-parallel lookup would compute another "
                "embedding; keep it whole (no VocabEmbedding in the plan)"
            )
        return cls(
            emb.weight, group, ledger, padding_idx=emb.padding_idx,
            scale=getattr(emb, "embed_scale", None),
        )  # fmt: skip

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(
            local.masked_fill(outside, 0), self.weight, self.padding_idx
        )  # (B, T, H)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        out = C.reduce_from_tp(rows, self.group, self.ledger)
        return out if self.scale is None else out * self.scale.to(self.weight.dtype)

    def extra_repr(self) -> str:
        return (
            f"shard={tuple(self.weight.shape)}, vocab_start={self.vocab_start}, tp={self.tp_size}"
        )
