"""Global batches of random windows, sharded by data-parallel rank.

Every rank draws the *same* global batch for a step (a generator seeded by ``(seed,
step)``) and keeps its own shard, so the union of the shards is exactly the batch a
single process would train on — the ground truth of every parity test.

Layout of one global batch of ``G = dp × accum × b`` windows::

    (dp, accum, b): rank r takes row r; its micro-step k takes [r, k, :]
"""

from __future__ import annotations

import torch

from paracube.errors import DataError


class ShardedBatchSampler:
    """Draws windows ``tokens[s : s + T + 1]`` → (inputs, targets), each (b, T) int64."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, global_batch: int, seed: int):
        if seq_len <= 0 or global_batch <= 0:
            raise ValueError(
                f"seq_len and global_batch must be positive, got {seq_len} and {global_batch}"
            )
        if tokens.dim() != 1 or tokens.numel() < seq_len + 1:
            raise DataError(
                f"{tokens.numel():,} tokens hold no window of seq_len + 1 = {seq_len + 1}: "
                "use more text or a shorter sequence length"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed
        self.n_starts = tokens.numel() - seq_len  # valid window starts: 0 .. n - T - 1

    def global_starts(self, step: int) -> torch.Tensor:
        """Start offsets of the ``G`` windows of ``step``; identical on every rank."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.n_starts, (self.global_batch,), generator=g)

    def windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + torch.arange(self.seq_len + 1)  # (b, T+1)
        chunk = self.tokens[idx].long()
        return chunk[:, :-1], chunk[:, 1:]

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole global batch of ``step`` (what the serial reference trains on)."""
        return self.windows(self.global_starts(step))

    def micro_batch(self, step: int, *, dp_rank: int, dp_size: int, micro_step: int, accum: int):
        """This rank's ``micro_step``-th micro-batch of ``step`` under an even split."""
        size = self.global_batch // (dp_size * accum)
        return self.rows(step, (dp_rank * accum + micro_step) * size, size)

    def rows(self, step: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows ``first … first + count − 1`` of ``step``'s global batch — a rank's
        micro-batch under any split (:class:`paracube.data.split.DataSplit`)."""
        return self.windows(self.global_starts(step)[first : first + count])
