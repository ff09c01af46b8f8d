"""A loader that keeps up: this rank's micro-batches made ahead of the step by background
threads (``--data-workers N``, ``--prefetch K``), so the step waits only for what is not
ready yet — the data time a step reports is that wait.

Batches are a pure function of ``(step, micro-step)`` (:mod:`paracube.data.sampler`), so
workers can make any of them in any order: micro-batch ``(s, k)`` is submitted ``K``
micro-batches before it is asked for, and handed out in order. Threads, not processes:
making a batch is tensor indexing (and, for a slow source, waiting — an injected
``data-delay`` sleeps in the worker), both of which release the GIL. On a GPU the batch
is pinned in the worker and copied without blocking.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from paracube import inject
from paracube.data.batches import RankBatches
from paracube.data.sampler import ShardedBatchSampler
from paracube.mesh.mesh import ProcessMesh


class PrefetchLoader(RankBatches):
    """:class:`RankBatches` served from ``workers`` background threads ``prefetch``
    micro-batches ahead; ``workers=0`` makes each batch when asked, on the training thread."""

    def __init__(
        self,
        sampler: ShardedBatchSampler,
        mesh: ProcessMesh,
        accum: int,
        workers: int = 0,
        prefetch: int = 2,
        split=None,
    ):
        super().__init__(sampler, mesh, accum, split)
        self.workers, self.prefetch = workers, max(prefetch, 1)
        self._pool = ThreadPoolExecutor(workers, "paracube-data") if workers else None
        self._ready: dict[tuple[int, int], Future] = {}
        self._pin = self.device.type == "cuda"

    def micro_batch(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, (b, T) each, of micro-step ``k`` of ``step``."""
        if self._pool is None:
            x, y = self._make(step, k)
        else:
            for key in self._ahead(step, k):
                if key not in self._ready:
                    self._ready[key] = self._pool.submit(self._make, *key, self.split)
            x, y = self._ready.pop((step, k)).result()
            for key in [key for key in self._ready if key < (step, k)]:
                self._ready.pop(key).cancel()  # a jump back (a resumed run): drop the rest
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def set_split(self, split) -> None:
        """Take ``split`` from the next micro-batch on: what was made ahead under the old
        one is dropped (a worker still making one finishes it for nothing)."""
        super().set_split(split)
        for future in self._ready.values():
            future.cancel()
        self._ready.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._ready.clear()

    def _ahead(self, step: int, k: int) -> Iterator[tuple[int, int]]:
        """``(step, k)`` and the ``prefetch`` micro-batches after it, in order."""
        for _ in range(self.prefetch + 1):
            yield step, k
            step, k = (step, k + 1) if k + 1 < self.accum else (step + 1, 0)

    def _make(self, step: int, k: int, split=None) -> tuple[torch.Tensor, torch.Tensor]:
        inject.delay_data()
        x, y = self.host_micro_batch(step, k, split)
        return (x.pin_memory(), y.pin_memory()) if self._pin else (x, y)
