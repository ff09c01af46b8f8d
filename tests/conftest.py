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


# Modules whose tests run in pytest's own process — the planner's searches, configs, a model
# on one rank — and start no ranks (a test of theirs that takes the pools fixture does, and
# is left out). ``make test`` runs these two at a time on the machine's two cores
# (pytest-xdist, ``-m in_process``), then the rest one at a time: those start ranks, whose
# collectives, stalls and timeouts must not share the cores with another test.
IN_PROCESS_PREFIX = "test_plan"  # test_plan_cli, test_plan_megatron, test_planner_*
IN_PROCESS = {
    "test_config",
    "test_gpu_calibration",
    "test_docs",
    "test_api_checks",
    "test_bad_inputs",
    "test_buckets",
    "test_data",
    "test_eager_traffic",
    "test_layout",
    "test_model",
    "test_saved_activations",
    "test_schedules",
}


def pytest_collection_modifyitems(config, items):
    """Tests of the :data:`IN_PROCESS` modules and the planner's carry
    ``@pytest.mark.in_process``; GPU-only checks carry ``@pytest.mark.cuda`` and are skipped
    on CPU machines."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        in_process = module in IN_PROCESS or module.startswith(IN_PROCESS_PREFIX)
        if in_process and "pools" not in item.fixturenames:
            item.add_marker(pytest.mark.in_process)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
