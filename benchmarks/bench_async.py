"""Asynchronous data parallelism against synchronous, with and without a straggler.

2 ranks × 1 thread, the ``--model`` GPT (default ``tiny``) on the embedded corpus, 8
sequences per rank, ``--steps`` steps' worth of samples (global batch × steps) for every
mode, from the same weights: ``sync``, ``stale:1``, ``local-sgd:4``, ``ps`` (unbounded)
and ``ps:2``. Run twice: both ranks at full speed, then rank 1's compute slowed
``--factor`` × (``--inject slow-rank=1:FACTOR``: it sleeps in proportion to its own
work); and sync, stale:1 and ps again at full speed with half the learning rate. For
each: samples per second over the whole run (between barriers) and the validation loss
at the end — the loss at equal samples, against sync at the same learning rate.

The straggler's ideal: each worker at its own speed, nobody waiting — (1 + 1/factor)/2 of
the full-speed synchronous throughput; synchronous modes get 1/factor of it.

    python benchmarks/bench_async.py --out benchmarks/results/async.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch.distributed as dist

from common import spawn_world, write_json
from paracube import inject
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.inject import Injections
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset

MODES = ("sync", "stale:1", "local-sgd:4", "ps", "ps:2")
HALF_LR = ("sync", "stale:1", "ps")  # at full speed, lr ÷ 2: what late gradients ask for


def run_mode(base: TrainConfig, mode: str, mesh: ProcessMesh, corpus) -> dict:
    trainer = Trainer(base.replace(dp_mode=mode), mesh, corpus)
    dist.barrier()
    start = time.perf_counter()
    steps = 0
    while not trainer.finished:
        trainer.train_step()
        steps += 1
    trainer.drain()
    dist.barrier()
    seconds = time.perf_counter() - start
    samples = base.steps * base.global_batch
    out = {"samples_per_s": samples / seconds, "val_loss": trainer.evaluate(), "steps": steps}
    staleness = trainer.staleness_distribution()
    if staleness:
        out["staleness"] = staleness
    return out


def worker(rank: int, world: int, args, out: str) -> None:
    base = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world),
        micro_batch=8,
        steps=args.steps,
        warmup_steps=args.steps // 10,
        eval_batches=args.eval_batches,
        progress=False,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    results: dict[str, dict] = {}
    half = base.replace(lr=base.lr / 2, min_lr=base.min_lr / 2)
    runs = [(m, f, base, "") for f in (1.0, args.factor) for m in MODES]
    runs += [(m, 1.0, half, f", lr {half.lr:g}") for m in HALF_LR]
    for mode, factor, cfg, label in runs:
        inject.activate(Injections(slow_rank=1, slow_factor=factor), rank)
        r = results[f"{mode} @ {factor:g}{label}"] = run_mode(cfg, mode, mesh, corpus) | {
            "mode": mode + label,
            "factor": factor,
            "lr": cfg.lr,
            "label": label,
        }
        if rank == 0:
            print(f"{mode}{label}, slow ×{factor:g}: {r['samples_per_s']:.1f} samples/s, "
                  f"validation {r['val_loss']:.4f}", flush=True)  # fmt: skip
    if rank != 0:
        return
    full = results["sync @ 1"]["samples_per_s"]
    for r in results.values():
        sync = results[f"sync @ {r['factor']:g}{r['label']}"]  # the same lr
        r["vs_sync"] = r["samples_per_s"] / sync["samples_per_s"]
        r["vs_full_speed_sync"] = r["samples_per_s"] / full
        r["val_vs_sync_percent"] = 100 * (r["val_loss"] / sync["val_loss"] - 1)
    ideal = (1 + 1 / args.factor) / 2
    write_json(out, {"benchmark": "async", "model": args.model, "world": world,
                     "steps": args.steps, "factor": args.factor,
                     "straggler_ideal_vs_full_speed_sync": ideal,
                     "rows": list(results.values())})  # fmt: skip
    print(f"\nmodel {args.model}, 2 ranks × 1 thread, {args.steps} steps' samples each; "
          f"ideal with the straggler: {ideal:.2f} of full-speed sync\n")  # fmt: skip
    print(
        "| mode | rank 1 slowed | samples/s | ÷ sync | ÷ full-speed sync | validation loss | vs sync |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results.values():
        print(f"| {r['mode']} | ×{r['factor']:g} | {r['samples_per_s']:.1f} | {r['vs_sync']:.2f} | "
              f"{r['vs_full_speed_sync']:.2f} | {r['val_loss']:.4f} | {r['val_vs_sync_percent']:+.2f} % |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--out", default="benchmarks/results/async.json")
    args = p.parse_args()
    spawn_world(2, worker, args, args.out)


if __name__ == "__main__":
    main()
