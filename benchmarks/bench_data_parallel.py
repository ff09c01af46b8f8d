"""paracube data parallel vs torch DistributedDataParallel, side by side, 2 ranks × 1 thread.

Both train the same GPT (preset ``small``: 4 layers, hidden 256, seq 128 — the model of
docs/peers.md) with AdamW, the same batches (8 sequences per rank), gradient clipping and
a global-loss all-reduce per step. paracube runs its real engine step
(:meth:`paracube.engine.Trainer.train_step`); the peer runs the same work in a plain loop.
Also measured: the single-process step (dp=1, batch 8) for dp=2's weak-scaling efficiency.

    python benchmarks/bench_data_parallel.py --out benchmarks/results/data_parallel.json
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import interleaved, parse_and_spawn, print_table, ratio_rows, run_record, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer, build_optimizer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset


def peer_step(model, optimizer, batches, cfg: TrainConfig, on_loss=None):
    """The same step as paracube's engine, written against torch DDP; ``on_loss`` gets
    each step's global loss."""

    def step():
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y, reduction="sum") / (cfg.global_batch * cfg.model.seq_len)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        optimizer.step()
        total = loss.detach()
        dist.all_reduce(total)  # the global loss for the log, as paracube reports
        if on_loss is not None:
            on_loss(float(total))

    return step


def batch_stream(trainer: Trainer):
    step = 0
    while True:
        yield trainer.batches.micro_batch(step, 0)
        step += 1


def worker(rank: int, world: int, args, out: str) -> None:
    cfg = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world, bucket_mb=args.bucket_mb),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, cfg.model.seq_len)
    mesh = ProcessMesh(cfg.parallel)
    ours = Trainer(cfg, mesh, corpus)
    variants = {"paracube": ours.train_step}
    torch.manual_seed(cfg.seed)
    for name, as_view in (("torch DDP", False), ("torch DDP (grad as bucket view)", True)):
        model = DDP(GPT(cfg.model), gradient_as_bucket_view=as_view)
        variants[name] = peer_step(
            model, build_optimizer(model.module, cfg), batch_stream(ours), cfg
        )
    # dp=1 reference for scaling efficiency: rank 0 alone, same per-rank batch.
    serial = copy.deepcopy(ours.module)
    serial_opt = build_optimizer(serial, cfg)
    serial_batches = batch_stream(ours)

    def single():
        if rank == 0:
            x, y = next(serial_batches)
            serial_opt.zero_grad(set_to_none=True)
            lm_loss(serial(x), y).backward()
            torch.nn.utils.clip_grad_norm_(serial.parameters(), cfg.grad_clip, foreach=True)
            serial_opt.step()

    variants["single process (dp=1)"] = single
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    rows = ratio_rows(times)
    med = {r["variant"]: r["median_ms"] for r in rows}
    base = med["paracube"]
    scaling = med["single process (dp=1)"] / base
    payload = {
        **run_record("data_parallel", args.model, world, args),
        "parameters": sum(p.numel() for p in ours.module.parameters()),
        "bucket_mb": args.bucket_mb,
        "rows": rows,
        "throughput_ratio_vs_ddp": round(med["torch DDP"] / base, 3),
        "weak_scaling_efficiency_dp2": round(scaling, 3),
    }
    write_json(out, payload)
    print(
        f"\nmodel {args.model} ({payload['parameters']:,} params), {world} ranks × 1 thread, "
        f"batch {args.micro_batch}/rank, {args.reps}×{args.steps} interleaved steps per variant\n"
    )
    print_table(rows)
    print(f"\nparacube ÷ torch DDP throughput: {payload['throughput_ratio_vs_ddp']:.3f}×")
    print(f"dp=2 weak-scaling efficiency (T_dp1 / T_dp2 at equal batch per rank): {scaling:.2f}")


def main() -> None:
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/data_parallel.json",
        reps=6,
        steps=5,
        micro_batch=8,
        bucket_mb=25.0,
    )


if __name__ == "__main__":
    main()
