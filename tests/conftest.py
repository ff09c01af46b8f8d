"""Shared fixtures: persistent worker pools, by world size (see tests/pool.py)."""

from __future__ import annotations

import time

import pytest
import torch

from tests.pool import WorkerPool

torch.set_num_threads(1)  # the serial references run beside the pools on 2 cores


class Pools:
    def __init__(self) -> None:
        self._pools: dict[int, WorkerPool] = {}

    def __call__(self, world: int) -> WorkerPool:
        pool = self._pools.get(world)
        if pool is None or not pool.alive:
            # Idle ranks block on their queue and cost no CPU, only ~250 MB each.
            pool = self._pools[world] = WorkerPool(world)
        return pool

    def close(self) -> None:
        # every pool's ranks leave at once, and all of them share one short wait: idle ranks
        # hold nothing that needs more than destroying their process group
        for pool in self._pools.values():
            pool.stop()
        deadline = time.monotonic() + 5
        for pool in self._pools.values():
            pool.close(deadline=deadline)


@pytest.fixture(scope="session")
def pools():
    p = Pools()
    yield p
    p.close()


def pytest_collection_modifyitems(config, items):
    """GPU-only checks carry ``@pytest.mark.cuda`` and are skipped on CPU machines."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
