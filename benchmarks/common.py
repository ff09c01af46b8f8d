"""Shared benchmark plumbing: a local gloo world, interleaved timing, ratio tables.

Method (docs/ARCHITECTURE.md, "Contributing"): paracube and the torch-native peer run side by side in
one run, same model, data, world size and threads, repetitions interleaved (A B B A …)
so that machine noise hits both alike; we report medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_world(world: int, fn: Callable, *args) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks with one thread each."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    mp.spawn(_entry, args=(world, fn, args), nprocs=world, join=True)


def _entry(rank: int, world: int, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def interleaved(
    variants: dict[str, Callable[[], None]],
    reps: int,
    steps: int,
    warmup: int = 2,
    blocks: bool = False,
) -> dict[str, list[float]]:
    """Time ``steps`` calls of each variant per repetition, alternating the order every
    repetition (ABBA); all ranks start each step together (barrier). Returns seconds.

    ``blocks``: time the ``steps`` calls back to back between two barriers and record
    their mean once per repetition — for variants that differ in where the ranks wait for
    each other (a per-step barrier would hide the wait of one and not the other)."""
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            if blocks:
                _barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    variants[name]()
                _barrier()
                times[name].append((time.perf_counter() - start) / steps)
                continue
            for _ in range(steps):
                _barrier()
                start = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - start)
    return times


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def median_ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


def parse_and_spawn(
    doc: str, worker: Callable, out: str, *, reps: int, steps: int, **options
) -> None:
    """The side-by-side benchmarks' command line — ``--model``, each benchmark's own
    options (name → default, typed by the default), ``--reps``, ``--steps``, ``--out`` —
    then ``worker(rank, args, out)`` on a gloo world of ``--world`` ranks where the
    benchmark offers that option, two otherwise."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default="small")
    for name, default in options.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--out", default=out)
    args = p.parse_args()
    spawn_world(getattr(args, "world", 2), worker, args, args.out)


def run_record(benchmark: str, model: str, world: int, args) -> dict:
    """What a side-by-side benchmark's results say of its run: the model, the world of
    ranks × one thread, the per-rank batch, the repetitions, torch and Python."""
    return {
        "benchmark": benchmark,
        "model": model,
        "world": world,
        "threads_per_rank": 1,
        "micro_batch_per_rank": args.micro_batch,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def write_json(path: str, payload: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def ratio_rows(times: dict[str, list[float]], base: str = "paracube") -> list[dict]:
    """Median ms per variant and paracube's throughput relative to it."""
    med = {k: median_ms(v) for k, v in times.items()}
    return [
        {
            "variant": k,
            "median_ms": round(v, 1),
            "paracube_speedup": round(v / med[base], 3),
            "samples": len(times[k]),
        }
        for k, v in med.items()
    ]


def print_table(rows: list[dict], skipped: dict[str, str] | None = None) -> None:
    print("| variant | median ms/step | paracube throughput ÷ variant's |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['median_ms']:.1f} | {r['paracube_speedup']:.3f}× |")
    for k, why in (skipped or {}).items():
        print(f"| {k} | skipped: {why} | |")
