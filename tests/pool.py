"""Persistent gloo worker pools: one world per size, started once per pytest session.

``import torch`` costs ~3 s of CPU per process, so spawning a fresh world for every
test would dominate the suite on 2 cores. Instead each pool keeps ``n`` ranks alive
(one torch thread each) in a gloo process group; a test ships a module-level function
to every rank and gets back each rank's return value.

A task that raises on any rank fails the test with that rank's traceback; a task that
does not finish within its timeout kills the pool (the next test starts a fresh one)
and fails the test — a stuck collective never hangs the suite.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any


def _dumps(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank: int, world: int, init_file: str, tasks, results) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1"
    )
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        before = _groups()
        try:
            results.put((rank, True, _dumps(fn(*args, **kwargs))))
        except BaseException:  # noqa: BLE001 - every failure goes back to the test
            results.put((rank, False, traceback.format_exc()))
        _destroy_groups_since(before)
    dist.destroy_process_group()


def _groups() -> set:
    """The process groups this rank holds now (torch keeps no public list of them: its
    registry, ``distributed_c10d._world.pg_map``, of the pinned torch)."""
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


def _destroy_groups_since(before: set) -> None:
    """Destroy the groups a task made (every ProcessMesh makes one per axis; checkpoint
    writers, twins and tied ends more). Each gloo group keeps three threads, which wake
    while idle — 200 groups' 600 took a fifth of a core doing nothing —, and left alive a
    rank that had run a few hundred tasks held ~900 threads: the suite slowed as it went."""
    import gc

    import torch.distributed as dist
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    for group in _groups() - before:
        dist.destroy_process_group(group)
    _clear_sharding_prop_cache()  # DTensor's cached op shardings hold their meshes
    gc.collect()  # a task's model, hooks and mesh hold each other: freed only by a collection


class WorkerPool:
    """``n`` gloo ranks waiting for functions to run."""

    def __init__(self, world: int):
        self.world = world
        ctx = mp.get_context("spawn")
        fd, self._init_file = tempfile.mkstemp(prefix="paracube-pool-")
        os.close(fd)
        os.unlink(self._init_file)  # FileStore creates it
        self._tasks = [ctx.Queue() for _ in range(world)]
        self._results = ctx.Queue()
        self._stopping = False
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, world, self._init_file, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(world)
        ]
        for p in self._procs:
            p.start()

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def run(self, fn: Callable, *args, timeout: float = 240.0, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order."""
        for q in self._tasks:
            q.put((fn, args, kwargs))
        got: dict[int, Any] = {}
        errors: list[str] = []
        try:
            for _ in range(self.world):
                rank, ok, payload = self._results.get(timeout=timeout)
                if ok:
                    got[rank] = _loads(payload)
                else:
                    errors.append(f"--- rank {rank} ---\n{payload}")
        except queue.Empty:
            self.close(force=True)
            missing = sorted(set(range(self.world)) - set(got))
            raise TimeoutError(
                f"{fn.__name__} did not finish within {timeout}s on ranks {missing}"
            ) from None
        if errors:
            raise AssertionError(f"{fn.__name__} failed:\n" + "\n".join(errors))
        return [got[r] for r in range(self.world)]

    def stop(self) -> None:
        """Ask every rank to leave its loop (close() then waits for them); once."""
        if not self._stopping:
            self._stopping = True
            for q in self._tasks:
                q.put(None)

    def close(self, force: bool = False, deadline: float | None = None) -> None:
        """End the ranks: asked to leave, given until ``deadline`` (time.monotonic(); 10 s
        from now by default) — one deadline for all of them, not one wait each — then
        killed; ``force`` kills at once."""
        if not force:
            self.stop()
            end = time.monotonic() + 10 if deadline is None else deadline
            for p in self._procs:
                p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
        if os.path.exists(self._init_file):
            os.unlink(self._init_file)
