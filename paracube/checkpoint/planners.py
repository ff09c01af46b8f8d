"""torch.distributed.checkpoint planners over :class:`~paracube.checkpoint.pieces.Piece` s.

DCP's default planners take a state dict of whole tensors, DTensors or ShardedTensors;
paracube's pieces are none of these (a ZeRO slice of a fused q|k|v shard is several
rectangles of the global tensor), so the planners are told the rectangles directly:

- saving, each owned piece is one ``SHARD`` write item of its global tensor at its
  offsets — DCP's coordinator merges every rank's items into the checkpoint's metadata;
- loading, each held piece asks DCP's resharding helper
  (``create_read_items_for_chunk_list``) which saved chunks overlap it, and the data is
  copied straight into the piece's view of the optimizer's storage.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from paracube.checkpoint.pieces import Piece
from paracube.errors import ConfigError


class PieceSavePlanner(DefaultSavePlanner):
    def __init__(self, pieces: list[Piece]) -> None:
        super().__init__(flatten_state_dict=False)
        self.pieces = {(p.key, p.offsets): p for p in pieces if p.owner}

    def create_local_plan(self) -> SavePlan:
        items = []
        for (key, offsets), p in self.pieces.items():
            chunk = ChunkStorageMetadata(torch.Size(offsets), p.tensor.shape)
            items.append(
                WriteItem(
                    index=MetadataIndex(key, torch.Size(offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=chunk,
                        properties=TensorProperties.create_from_tensor(p.tensor),
                        size=torch.Size(p.global_shape),
                    ),
                )
            )
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        offset = write_item.index.offset
        assert offset is not None  # every item of this planner has one
        return self.pieces[(write_item.index.fqn, tuple(offset))].tensor


class PieceLoadPlanner(DefaultLoadPlanner):
    def __init__(self, pieces: list[Piece], where: str) -> None:
        super().__init__(flatten_state_dict=False, allow_partial_load=True)
        self.by_key: dict[str, list[Piece]] = defaultdict(list)
        for p in pieces:
            self.by_key[p.key].append(p)
        self.where = where

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        items = []
        for key, pieces in self.by_key.items():
            md = saved.get(key)
            if not isinstance(md, TensorStorageMetadata):
                raise ConfigError(
                    f"{self.where}: holds no tensor {key!r}: a checkpoint of another model?"
                )
            if tuple(md.size) != pieces[0].global_shape:
                raise ConfigError(
                    f"{self.where}: {key} is {tuple(md.size)} in the checkpoint but "
                    f"{pieces[0].global_shape} in this model: a checkpoint of another model shape"
                )
            chunks = [ChunkStorageMetadata(torch.Size(p.offsets), p.tensor.shape) for p in pieces]
            found = create_read_items_for_chunk_list(key, md, chunks)
            covered = sum(math.prod(r.lengths) for r in found)
            if covered != sum(p.tensor.numel() for p in pieces):
                raise ConfigError(f"{self.where}: {key} is only partly in the checkpoint")
            items.extend(found)
        self.plan = LoadPlan(items)
        return self.plan

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        assert index.index is not None
        return self.by_key[index.fqn][index.index].tensor
