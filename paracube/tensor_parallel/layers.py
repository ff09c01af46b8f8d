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

# How a layer's input is prepared / its output finished (None: nothing, the plan did it).
INPUT_MODES = (None, "copy", "gather_sp")
OUTPUT_MODES = ("reduce", "reduce_scatter_sp")


def _shard(t: torch.Tensor, dim: int, group) -> nn.Parameter:
    rank, world = dist.get_rank(group), ops.group_size(group)
    if t.shape[dim] % world:
        raise ValueError(f"cannot split dim {dim} of size {t.shape[dim]} into {world} equal shards")
    p = nn.Parameter(t.detach().chunk(world, dim=dim)[rank].clone())
    p.tp_dim = dim
    return p


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


class ColumnParallelLinear(_TPModule):
    """Y = X·Aᵀ with A split by rows (output features): rank i computes Y_i = X·A_iᵀ.

    Input (B, T, H) replicated — or, under sequence parallelism, (B, T/tp, H) gathered
    here; output (B, T, O/tp), or (B, T, O) with ``gather_output``.
    """

    def __init__(self, weight, bias, group, ledger=None, *, gather_output=False, input_mode="copy"):
        super().__init__(group, ledger)
        assert input_mode in INPUT_MODES
        self.weight = _shard(weight, 0, group)  # (O/tp, H)
        self.bias = _shard(bias, 0, group) if bias is not None else None  # (O/tp,)
        self.gather_output, self.input_mode = gather_output, input_mode

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, ledger=None, **kw) -> "ColumnParallelLinear":
        return cls(linear.weight, linear.bias, group, ledger, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(self._prepare_input(x, self.input_mode), self.weight, self.bias)  # (B, T, O/tp)
        return C.gather_from_tp(y, self.group, self.ledger) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"shard={tuple(self.weight.shape)}, tp={self.tp_size}, input={self.input_mode}, gather={self.gather_output}"


class RowParallelLinear(_TPModule):
    """Y = Σ_i X_i·A_iᵀ with A split by columns (input features).

    Input (B, T, H/tp) — the output of a column-parallel layer — or full (B, T, H) split
    here if ``input_is_parallel=False``. The partial products are summed by an all-reduce
    (output (B, T, O)), or by a reduce-scatter along the sequence under sequence
    parallelism (output (B, T/tp, O)); the bias is added once, after the sum.
    """

    def __init__(self, weight, bias, group, ledger=None, *, input_is_parallel=True, output_mode="reduce"):
        super().__init__(group, ledger)
        assert output_mode in OUTPUT_MODES
        self.weight = _shard(weight, 1, group)  # (O, H/tp)
        self.bias = _replicated(bias) if bias is not None else None  # (O,)
        if self.bias is not None and output_mode == "reduce_scatter_sp":
            self.bias.sequence_parallel = True  # sees only this rank's tokens: grads are partial
        self.input_is_parallel, self.output_mode = input_is_parallel, output_mode

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, ledger=None, **kw) -> "RowParallelLinear":
        return cls(linear.weight, linear.bias, group, ledger, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = C.scatter_to_tp(x, self.group, self.ledger)
        partial = F.linear(x, self.weight)  # (B, T, O), this rank's share of the sum
        if self.output_mode == "reduce_scatter_sp":
            y = C.reduce_scatter_to_sp(partial, self.group, self.ledger)  # (B, T/tp, O)
        else:
            y = C.reduce_from_tp(partial, self.group, self.ledger)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"shard={tuple(self.weight.shape)}, tp={self.tp_size}, output={self.output_mode}"


class VocabParallelEmbedding(_TPModule):
    """Embedding table split by vocabulary rows: rank i holds rows [i·V/tp, (i+1)·V/tp).

    Tokens outside a rank's range look up zeros there; an all-reduce sums the one real
    row per token. Tokens (B, T) → (B, T, H).
    """

    def __init__(self, weight, group, ledger=None):
        super().__init__(group, ledger)
        self.weight = _shard(weight, 0, group)  # (V/tp, H)
        self.vocab_start = self.tp_rank * self.weight.shape[0]

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, group, ledger=None) -> "VocabParallelEmbedding":
        return cls(emb.weight, group, ledger)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight)  # (B, T, H)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        return C.reduce_from_tp(rows, self.group, self.ledger)

    def extra_repr(self) -> str:
        return f"shard={tuple(self.weight.shape)}, vocab_start={self.vocab_start}, tp={self.tp_size}"
