"""This rank's micro-batches of every step, on its device."""

from __future__ import annotations

import torch

from paracube.data.sampler import ShardedBatchSampler
from paracube.data.split import DataSplit
from paracube.mesh.mesh import ProcessMesh


class RankBatches:
    """The ``accum`` micro-batches of this data-parallel rank's shard of each global batch
    — its share under ``split`` (even unless given; :mod:`paracube.data.split`)."""

    def __init__(
        self,
        sampler: ShardedBatchSampler,
        mesh: ProcessMesh,
        accum: int,
        split: DataSplit | None = None,
    ):
        self.sampler, self.accum = sampler, accum
        self.dp_rank, self.dp_size, self.device = mesh.rank("dp"), mesh.size("dp"), mesh.device
        if split is not None:
            split.check(self.dp_size, sampler.global_batch, accum)
        self.split = split or DataSplit.even(self.dp_size, sampler.global_batch, accum)

    def set_split(self, split: DataSplit) -> None:
        """Take ``split`` from the next micro-batch asked for on; a split that is not
        this run's global batch is refused (it would train on another batch)."""
        split.check(self.dp_size, self.sampler.global_batch, self.accum)
        self.split = split

    def micro_batch(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, (b_r, T) each, of micro-step ``k`` of ``step`` (b_r: this
        rank's micro-batch under the split — b under an even one)."""
        x, y = self.host_micro_batch(step, k)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def host_micro_batch(
        self, step: int, k: int, split: DataSplit | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same, in host memory (what a loader's worker makes), under ``split``
        (default: the current one)."""
        first, count = (split or self.split).rows(self.dp_rank, k)
        return self.sampler.rows(step, first, count)

    def step(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.micro_batch(step, k) for k in range(self.accum)]
