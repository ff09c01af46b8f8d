"""Autograd collectives for the tensor-parallel group, one concern each.

Named after what they do forward / backward (Shoeybi et al. 2019, "Megatron-LM", §3 —
the paper's *f* and *g*; Korthikanti et al. 2022, §4.2.2 for sequence parallelism):

| function              | forward                     | backward                    |
|-----------------------|-----------------------------|-----------------------------|
| copy_to_tp (f)        | identity                    | all-reduce                  |
| reduce_from_tp (g)    | all-reduce                  | identity                    |
| scatter_to_tp         | keep my slice of last dim   | all-gather last dim         |
| gather_from_tp        | all-gather last dim         | keep my slice of last dim   |
| scatter_to_sp         | keep my slice of sequence   | all-gather sequence         |
| gather_from_sp        | all-gather sequence         | reduce-scatter sequence     |
| reduce_scatter_to_sp  | reduce-scatter sequence     | all-gather sequence         |

Activations are (B, T, H): the sequence dim is 1, the split "last dim" is -1. Every
collective goes through :mod:`paracube.comm.ops`, so its bytes land in the ledger under
the given tag. A group of one rank makes each of these the identity.
"""

from __future__ import annotations

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger


def _rank_and_world(group) -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(group), ops.group_size(group)


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    rank, world = _rank_and_world(group)
    return x.chunk(world, dim=dim)[rank].contiguous()


def _fold_ranks(gathered: torch.Tensor, world: int, shard: torch.Size, dim: int) -> torch.Tensor:
    """Every rank's ``shard``-shaped block, in rank order in ``gathered`` (world·s0, ...), as
    one tensor concatenated along ``dim``: the rank axis moved next to ``dim`` and merged
    into it — one copy where a dim before ``dim`` is larger than 1 (the sequence of a
    (B, T, H) activation with B > 1, or the last dim), a view where none is."""
    dim = dim % len(shard)
    stacked = gathered.view(world, *shard).movedim(0, dim)  # (..., world, n, ...)
    return stacked.reshape(*shard[:dim], world * shard[dim], *shard[dim + 1 :])


def _rank_major(x: torch.Tensor, world: int, dim: int) -> tuple[torch.Tensor, torch.Size]:
    """``x`` (..., world·n, ...) laid out as the collectives take it — (world·s0, ...), rank
    r's (..., n, ...) slice of ``dim`` as its r-th block — and that slice's shape: one copy
    where a dim before ``dim`` is larger than 1, none where none is."""
    dim = dim % x.dim()
    n = x.shape[dim] // world
    split = x.reshape(*x.shape[:dim], world, n, *x.shape[dim + 1 :]).movedim(dim, 0)
    shard = split.shape[1:]
    return split.contiguous().view(world * shard[0], *shard[1:]), shard


def _gather(x: torch.Tensor, dim: int, group, ledger, tag) -> torch.Tensor:
    """All-gather along ``dim``: each rank's shard is sent as it lies (the collectives gather
    along dim 0) and the gathered blocks folded into ``dim`` — one copy of the result, where
    moving ``dim`` to the front and back cost a copy of the shard and one of the result."""
    world = ops.group_size(group)
    if world == 1:
        return x
    shard = x.contiguous()
    return _fold_ranks(ops.all_gather(shard, group, ledger, tag=tag), world, shard.shape, dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group, ledger, tag) -> torch.Tensor:
    """Sum over the group and keep this rank's slice of ``dim``: ``x`` is laid out rank by
    rank once (:func:`_rank_major`) and the slice arrives in place."""
    world = ops.group_size(group)
    if world == 1:
        return x
    chunks, shard = _rank_major(x, world, dim)
    return ops.reduce_scatter(chunks, group, ledger, tag=tag).view(shard)


def _all_reduce(x: torch.Tensor, group, ledger, tag) -> torch.Tensor:
    """In place when ``x`` is contiguous (the callers own it); else on a contiguous copy."""
    x = x.contiguous()
    ops.all_reduce(x, group, ledger, tag=tag)
    return x


def gather_sequence(x: torch.Tensor, group, ledger=None, tag: str = "tp") -> torch.Tensor:
    """(B, T/tp, H) → (B, T, H), outside autograd (for fused layers)."""
    return _gather(x, 1, group, ledger, tag)


def gather_sequence_async(x: torch.Tensor, group, ledger=None, tag: str = "tp"):
    """Start gathering (B, T/tp, H) into (B, T, H); ``wait()`` returns it."""
    shard = x.contiguous()
    world = ops.group_size(group)
    out = shard.new_empty((world * shard.shape[0], *shard.shape[1:]))
    pending = ops.all_gather_into(out, shard, group, ledger, tag=tag, async_op=True)
    return _Finishing(pending, lambda done: _fold_ranks(done, world, shard.shape, 1))


def reduce_scatter_sequence_async(x: torch.Tensor, group, ledger=None, tag: str = "tp"):
    """Start summing (B, T, H) and keeping this rank's (B, T/tp, H); ``wait()`` returns it."""
    chunks, shard = _rank_major(x, ops.group_size(group), 1)
    pending = ops.reduce_scatter(chunks, group, ledger, tag=tag, async_op=True)
    return _Finishing(pending, lambda done: done.view(shard))


class _Finishing:
    """A pending collective whose ``wait()`` returns its result put in its final shape."""

    def __init__(self, pending, finish) -> None:
        self.pending, self.finish = pending, finish

    def wait(self) -> torch.Tensor:
        return self.finish(self.pending.wait())


# Under ``paracube train --compile`` a block's forward is traced by dynamo; every collective
# here runs outside the trace — a graph break either side — with its ledger and timing as
# eager (torchtitan's compiled TP runs its collectives in the graph as functional ops; ours
# carry Python bookkeeping, so the compiled regions are the compute between them).
_eager = torch.compiler.disable


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.args = (group, ledger, tag)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # The incoming gradient is autograd's own buffer for this edge: reduce it in place.
        return _all_reduce(grad, *ctx.args), None, None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        # Sums the partial products in place (Megatron's _reduce); marked dirty so autograd
        # refuses it if anything still needed the partial values. A view — a compiled
        # region's output is returned as one — is summed on a copy: autograd forbids
        # writing into it.
        if x._base is not None:
            x = x.clone(memory_format=torch.contiguous_format)
        elif x.is_contiguous():
            ctx.mark_dirty(x)
        return _all_reduce(x, group, ledger, tag)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.args = (group, ledger, tag)
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, -1, *ctx.args), None, None, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.group = group
        return _gather(x, -1, group, ledger, tag)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None, None, None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.args = (group, ledger, tag)
        return _split(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, 1, *ctx.args), None, None, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.args = (group, ledger, tag)
        return _gather(x, 1, group, ledger, tag)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, 1, *ctx.args), None, None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.args = (group, ledger, tag)
        return _reduce_scatter(x, 1, group, ledger, tag)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, 1, *ctx.args), None, None, None


@_eager
def copy_to_tp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """f: identity forward, all-reduce of the gradient backward."""
    return _CopyToTP.apply(x, group, ledger, tag)


@_eager
def reduce_from_tp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """g: all-reduce forward, identity backward."""
    return _ReduceFromTP.apply(x, group, ledger, tag)


@_eager
def scatter_to_tp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """Keep this rank's slice of the last dim; all-gather the gradient backward."""
    return _ScatterToTP.apply(x, group, ledger, tag)


@_eager
def gather_from_tp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """All-gather the last dim; keep this rank's slice of the gradient backward."""
    return _GatherFromTP.apply(x, group, ledger, tag)


@_eager
def scatter_to_sp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """(B, T, H) → (B, T/tp, H), this rank's sequence slice; all-gather backward."""
    return _ScatterToSP.apply(x, group, ledger, tag)


@_eager
def gather_from_sp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """(B, T/tp, H) → (B, T, H); reduce-scatter of the gradient backward."""
    return _GatherFromSP.apply(x, group, ledger, tag)


@_eager
def reduce_scatter_to_sp(x, group, ledger: CommLedger | None = None, tag: str = "tp"):
    """(B, T, H) partial sums → (B, T/tp, H) summed slice; all-gather backward."""
    return _ReduceScatterToSP.apply(x, group, ledger, tag)
