"""Gradient compressors, as reducers of the flat unit (:mod:`paracube.data_parallel.reducers`).

Each takes a complete unit's gradient buffer (numel,) and leaves the *sum* over the
data-parallel group — or an approximation of it — where the uncompressed reducer would:

- :class:`CastReduce` (``--compress fp16|bf16``): the buffer cast to 16 bits, reduced (an
  all-reduce, or under ZeRO-2/3 a reduce-scatter into the slice), cast back. fp16 is
  scaled by 1/world before the sum, so that a sum of world values cannot overflow where
  each value does not, and back after.
- :class:`TopKReduce` (``--compress topk:RATIO``): each rank sends the ``⌈RATIO·n⌉``
  largest-magnitude entries of (gradient + residual) as (int32 index, value) pairs; a sum
  of sparse vectors with different supports is not a ring all-reduce, so the pairs are
  all-gathered and every rank adds them into a zeroed buffer (Aji & Heafield 2017). With
  error feedback the entries not sent are kept and added to the next step's gradient
  (Stich et al. 2018; Karimireddy et al. 2019): sent + residual = input, exactly.
- :class:`PowerSGDReduce` (``--compress powersgd:RANK``): every matrix-shaped gradient
  M (n×m) is replaced by a rank-r product — P = M·Q, all-reduce P, orthonormalise it,
  Q = Mᵀ·P, all-reduce Q, M ≈ P·Qᵀ — with Q warm-started from the previous step and error
  feedback (Vogels et al. 2019); vectors (biases, norm scales) are all-reduced
  uncompressed, as torch's ``powerSGD_hook`` does.

The residuals and factors are per unit (``unit.index``): state that lives across steps,
so a compressor object belongs to one wrapper. Bytes on the wire are counted by the
collectives themselves (``comm/ops``); :func:`wire_bytes` gives the analytic volume the
tests hold them to.
"""

from __future__ import annotations

import math

import torch

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.reducers import Done, ReduceScatter
from paracube.data_parallel.shards import Waitable, alloc_storage
from paracube.values import compression

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class CastReduce:
    """All-reduce (or reduce-scatter, ``sharded``) in 16 bits."""

    def __init__(self, dtype: str, sharded: bool = False) -> None:
        self.dtype, self.sharded = DTYPES[dtype], sharded
        self._scatter = ReduceScatter() if sharded else None

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        world = ops.group_size(group)
        scale = world if self.dtype == torch.float16 else 1
        low = (unit.buffer / scale if scale > 1 else unit.buffer).to(self.dtype)
        if self.sharded:
            out = torch.empty(unit.hi - unit.lo, dtype=self.dtype, device=low.device)
            ops.reduce_scatter_into(out, low, group, ledger, tag="grad")
            shard = unit.sharded_grad
            alloc_storage(shard)  # released after the previous step
            value = out.to(shard.dtype) * scale
            if unit.shard_fresh:
                shard.copy_(value)
            else:
                shard.add_(value)
            unit.shard_fresh = False
            unit.free()
            return Done(shard)
        ops.all_reduce(low, group, ledger, tag="grad")
        unit.buffer.copy_(low)
        if scale > 1:
            unit.buffer.mul_(scale)
        return Done(unit.buffer)


class TopKReduce:
    """The largest entries of each unit, exchanged as (index, value) pairs."""

    sharded = False

    def __init__(self, ratio: float, error_feedback: bool = True) -> None:
        self.ratio, self.error_feedback = ratio, error_feedback
        self.residual: dict[int, torch.Tensor] = {}

    def k(self, numel: int) -> int:
        return max(1, math.ceil(self.ratio * numel))

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        g = unit.buffer[: unit.numel]
        if self.error_feedback and unit.index in self.residual:
            g.add_(self.residual[unit.index])
        values, indices = select_top_k(g, self.k(unit.numel))
        if self.error_feedback:
            residual = g.clone()
            residual[indices] = 0  # what was not sent waits for the next step
            self.residual[unit.index] = residual
        all_values = ops.all_gather(values, group, ledger, tag="grad")
        all_indices = ops.all_gather(indices.to(torch.int32), group, ledger, tag="grad")
        unit.buffer.zero_()
        unit.buffer.index_add_(0, all_indices.long(), all_values)
        return Done(unit.buffer)


def select_top_k(g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` entries of largest magnitude: (values, indices)."""
    indices = torch.topk(g.abs(), k, sorted=False).indices
    return g[indices], indices


class PowerSGDReduce:
    """Rank-r approximations of the matrix-shaped gradients of each unit."""

    sharded = False

    def __init__(self, rank: int, error_feedback: bool = True, seed: int = 0) -> None:
        self.rank, self.error_feedback, self.seed = rank, error_feedback, seed
        self.q: dict[tuple[int, int], torch.Tensor] = {}  # (unit, param) → (m, r), warm
        self.residual: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, unit: FlatUnit, group, ledger: CommLedger | None) -> Waitable:
        world = ops.group_size(group)
        matrices: list[tuple[int, torch.Tensor]] = []
        vectors: list[tuple[int, torch.Tensor]] = []
        for i, view in enumerate(unit.views):
            rows = view.shape[0] if view.dim() >= 2 else 0
            compressible = rows and min(rows, view.numel() // rows) > self.rank
            (matrices if compressible else vectors).append((i, view))
        if vectors:  # biases and norm scales: uncompressed, in one all-reduce
            flat = torch.cat([v.reshape(-1) for _, v in vectors])
            ops.all_reduce(flat, group, ledger, tag="grad")
            at = 0
            for _, v in vectors:
                v.copy_(flat[at : at + v.numel()].view_as(v))
                at += v.numel()
        if not matrices:
            return Done(unit.buffer)
        ms, ps, qs = [], [], []
        for i, view in matrices:
            m = view.reshape(view.shape[0], -1)  # (n, m)
            key = (unit.index, i)
            if self.error_feedback and key in self.residual:
                m.add_(self.residual[key])
            ms.append((key, m))
            qs.append(self._q(key, m.shape[1], m))
            ps.append(m @ qs[-1])  # (n, r)
        _all_reduce_list(ps, group, ledger)
        for p in ps:
            _orthonormalise_(p)
        qs = [m.t() @ p for (_, m), p in zip(ms, ps)]  # (m, r)
        _all_reduce_list(qs, group, ledger)
        for (key, m), p, q in zip(ms, ps, qs):
            approx = p @ q.t()  # ≈ Σ over ranks of M
            if self.error_feedback:
                self.residual[key] = m - approx / world  # this rank's share of what was lost
            self.q[key] = q
            m.copy_(approx)
        return Done(unit.buffer)

    def _q(self, key, columns: int, like: torch.Tensor) -> torch.Tensor:
        """Q warm-started from the previous step (Vogels et al. §3), else the same random
        matrix on every rank (one generator seeded alike)."""
        if key not in self.q:
            gen = torch.Generator().manual_seed(self.seed + 7919 * key[0] + key[1])
            q = torch.randn(columns, self.rank, generator=gen, dtype=like.dtype)
            self.q[key] = q.to(like.device)
        return self.q[key]


def _all_reduce_list(tensors: list[torch.Tensor], group, ledger: CommLedger | None) -> None:
    """Sum the factors of every matrix of the unit with one all-reduce."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    ops.all_reduce(flat, group, ledger, tag="grad")
    at = 0
    for t in tensors:
        t.copy_(flat[at : at + t.numel()].view_as(t))
        at += t.numel()


def _orthonormalise_(p: torch.Tensor) -> None:
    """Orthonormal columns for ``p`` (n, r), in place — by QR, which Gram–Schmidt in
    Vogels et al.'s Alg. 1 computes too."""
    q, _ = torch.linalg.qr(p)
    p.copy_(q)


def make_reducer(spec: str, zero: int, error_feedback: bool = True):
    """The reducer ``--compress spec`` names under ZeRO stage ``zero`` (None: uncompressed)."""
    kind, value = compression(spec)
    if kind == "none":
        return None
    if kind in DTYPES:
        return CastReduce(kind, sharded=zero >= 2)
    if kind == "topk":
        return TopKReduce(value, error_feedback)
    return PowerSGDReduce(int(value), error_feedback)


def wire_bytes(spec: str, units: list[list[tuple[int, ...]]], world: int, elem: int = 4) -> int:
    """The bytes the ledger counts for one reduction of units holding parameters of the
    given shapes (all-reduce and reduce-scatter count the buffer they reduce, an
    all-gather its gathered size — the convention of ``comm/ops``)."""
    kind, value = compression(spec)
    total = 0
    for shapes in units:
        numel = sum(math.prod(s) for s in shapes)
        if kind in DTYPES:  # the whole buffer, padded to a multiple of the group
            total += 2 * -(-numel // world) * world
        elif kind == "topk":
            total += world * math.ceil(value * numel) * (4 + elem)  # int32 index + value
        else:  # powersgd: P (n, r) and Q (m, r) of each matrix, the vectors whole
            r = int(value)
            for s in shapes:
                n, m = (s[0], math.prod(s[1:])) if len(s) >= 2 else (0, 0)
                total += elem * ((n + m) * r if len(s) >= 2 and min(n, m) > r else math.prod(s))
    return total
