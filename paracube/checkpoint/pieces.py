"""This rank's training state as *pieces* of the serial model's tensors.

A checkpoint stores every tensor under the serial model's name and global shape, so that
any layout can read it (torch.distributed.checkpoint reshards on load by intersecting the
saved chunks with the chunks a reader asks for). What a rank holds of a tensor is one or
more rectangles of it (:class:`Piece`), found in two steps:

1. **Tensor parallelism** — a local parameter is the global one split along ``tp_dim``,
   section by section for fused projections (q | k | v: this rank's rows of each section),
   with the vocabulary padding dropped (the padded rows are zeros that never train):
   :func:`~paracube.tensor_parallel.plan.tp_blocks` lists (local start, length, global
   start) along that dim.
2. **Flat slices** — the optimizer holds a range ``[a, b)`` of the local parameter's
   flattened elements (a ZeRO slice, or all of it): :func:`flat_rectangles` cuts a range
   of a row-major (R, C) tensor into at most three rectangles (a partial first row, whole
   rows, a partial last row) — a flat slice is not a ``Shard(0)`` of anything.

Each rectangle is a contiguous run of the range's 1-D data, so a piece's tensor is a view
of the optimizer's own storage: saving reads it in place and loading writes into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from paracube.tensor_parallel.plan import tp_blocks


@dataclass(frozen=True)
class Piece:
    """``tensor`` holds the rectangle ``[offsets, offsets + tensor.shape)`` of the global
    tensor ``key`` (of ``global_shape``); ``owner``: this rank writes it on save (every
    region has exactly one owner; every holder reads it on load)."""

    key: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    tensor: torch.Tensor
    owner: bool


def flat_rectangles(shape: tuple[int, ...], a: int, b: int):
    """The range ``[a, b)`` of a row-major tensor of ``shape`` (1-D or 2-D) as rectangles
    ``(local offsets, sizes, start in the range)``."""
    if len(shape) == 1:
        return [((a,), (b - a,), 0)] if b > a else []
    if len(shape) != 2:
        raise ValueError(f"checkpoint pieces handle 1-D and 2-D tensors, not {tuple(shape)}")
    cols = shape[1]
    rects, at = [], a
    r0, c0 = divmod(a, cols)
    if c0 and at < b:  # the partial first row
        n = min(cols - c0, b - at)
        rects.append(((r0, c0), (1, n), at - a))
        at += n
    full = (b - at) // cols
    if full:
        rects.append(((at // cols, 0), (full, cols), at - a))
        at += full * cols
    if at < b:  # the partial last row
        rects.append(((at // cols, 0), (1, b - at), at - a))
    return rects


def param_pieces(
    key: str,
    param: nn.Parameter,
    data: torch.Tensor,
    a: int,
    tp: tuple[int, int],
    owner: bool,
) -> list[Piece]:
    """The pieces of ``key`` held in ``data`` — the 1-D elements ``[a, a + len(data))`` of
    the local ``param`` flattened — under tensor parallelism ``tp = (rank, size)``."""
    shape, dim, blocks = tp_blocks(param, *tp)
    owner = owner and (dim is not None or tp[0] == 0)  # a replicated tensor: tp rank 0 writes
    pieces = []
    for local_off, sizes, start in flat_rectangles(tuple(param.shape), a, a + data.numel()):
        rect = data[start : start + math.prod(sizes)].view(sizes)
        for view, offsets in _to_global(rect, local_off, sizes, dim, blocks):
            pieces.append(Piece(key, shape, offsets, view, owner))
    return pieces


def _to_global(rect, local_off, sizes, dim, blocks):
    """Split a local rectangle along the tensor-parallel ``dim`` by ``blocks`` and place
    each part in global coordinates."""
    if dim is None:
        yield rect, tuple(local_off)
        return
    lo, hi = local_off[dim], local_off[dim] + sizes[dim]
    for start, length, global_start in blocks:
        a, b = max(lo, start), min(hi, start + length)
        if a >= b:
            continue
        part = rect.narrow(dim, a - lo, b - a)
        offsets = list(local_off)
        offsets[dim] = global_start + (a - start)
        yield part, tuple(offsets)
