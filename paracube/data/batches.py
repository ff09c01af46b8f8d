"""This rank's micro-batches of every step, on its device."""

from __future__ import annotations

import torch

from paracube.data.sampler import ShardedBatchSampler
from paracube.mesh.mesh import ProcessMesh


class RankBatches:
    """The ``accum`` micro-batches of this data-parallel rank's shard of each global batch."""

    def __init__(self, sampler: ShardedBatchSampler, mesh: ProcessMesh, accum: int):
        self.sampler, self.accum = sampler, accum
        self.dp_rank, self.dp_size, self.device = mesh.rank("dp"), mesh.size("dp"), mesh.device

    def micro_batch(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, (b, T) each, of micro-step ``k`` of ``step``."""
        x, y = self.host_micro_batch(step, k)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def host_micro_batch(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same, in host memory (what a loader's worker makes)."""
        return self.sampler.micro_batch(
            step, dp_rank=self.dp_rank, dp_size=self.dp_size, micro_step=k, accum=self.accum
        )

    def step(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.micro_batch(step, k) for k in range(self.accum)]
