"""Gradient compression, side by side with torch DDP's communication hooks, 2 ranks × 1 thread.

The same GPT (``small``), AdamW, the same batches (8 sequences per rank), clipping, from the
same initial weights. paracube runs its engine step with ``--compress`` none, fp16,
powersgd:4 and topk:0.01; the peer is torch DDP without a hook, with ``fp16_compress_hook``
and with ``powerSGD_hook`` (rank 4, error feedback, warm start — the same method). For each:
the median step, the gradient bytes each rank sends per step (paracube: counted by its
ledger; DDP: the same formulas, ``paracube.data_parallel.compress.wire_bytes``, over the
parameters) and the global loss after the same number of steps. On this machine's
loopback the link is not the bottleneck: the table shows the price of compressing and
the bytes saved, the planner (``paracube plan --compress``) says where that pays.

    python benchmarks/bench_compress.py --out benchmarks/results/compress.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from bench_data_parallel import batch_stream, peer_step
from common import interleaved, median_ms, parse_and_spawn, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.data_parallel.compress import wire_bytes
from paracube.engine import Trainer, build_optimizer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT
from paracube.models.presets import preset

OURS = ("none", "fp16", "powersgd:4", "topk:0.01")


def ddp_variant(cfg: TrainConfig, hook: str, batches, losses: dict):
    torch.manual_seed(cfg.seed)
    model = DDP(GPT(cfg.model))
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd:4":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2,
            use_error_feedback=True, warm_start=True,
        )  # fmt: skip
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = build_optimizer(model.module, cfg)
    return peer_step(
        model, optimizer, batches, cfg, lambda loss: losses.__setitem__(f"torch DDP {hook}", loss)
    )


def worker(rank: int, world: int, args, out: str) -> None:
    base = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    trainers = {c: Trainer(base.replace(compress=c), mesh, corpus) for c in OURS}
    losses: dict[str, float] = {}
    sent: dict[str, int] = {}

    def ours(c):
        def step():
            m = trainers[c].train_step()
            losses[f"paracube {c}"] = m.loss
            sent[f"paracube {c}"] = sum(
                v["bytes"] for k, v in m.comm.items() if k.endswith("/grad")
            )

        return step

    variants = {f"paracube {c}": ours(c) for c in OURS}
    for hook in ("none", "fp16", "powersgd:4"):
        variants[f"torch DDP {hook}"] = ddp_variant(
            base, hook, batch_stream(trainers["none"]), losses
        )
    for step in variants.values():  # warm-up: PowerSGD's hook starts compressing at step 2
        step()
        step()
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    shapes = [[tuple(p.shape) for p in GPT(base.model).parameters()]]
    for hook in ("none", "fp16", "powersgd:4"):  # DDP sends what the same formulas say
        spec = "bf16" if hook == "fp16" else hook  # (the 16-bit volume is the same)
        sent[f"torch DDP {hook}"] = (
            4 * sum(torch.Size(s).numel() for s in shapes[0])
            if hook == "none"
            else wire_bytes(spec, shapes, world)
        )
    rows = []
    plain = median_ms(times["paracube none"])
    for name, samples in times.items():
        ms = median_ms(samples)
        rows.append({
            "variant": name, "median_ms": round(ms, 1), "vs_paracube_none": round(plain / ms, 3),
            "grad_bytes_per_step": sent[name], "loss_after": round(losses[name], 4),
        })  # fmt: skip
    steps_done = 2 + args.reps * args.steps
    write_json(out, {"benchmark": "compress", "model": args.model, "world": world,
                     "steps_each": steps_done, "rows": rows})  # fmt: skip
    print(f"\nmodel {args.model}, {world} ranks × 1 thread, every variant {steps_done} steps\n")
    print("| variant | median ms/step | throughput ÷ paracube none | grad MB sent/step | loss |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['median_ms']:.1f} | {r['vs_paracube_none']:.3f} | "
              f"{r['grad_bytes_per_step'] / 1e6:.3f} | {r['loss_after']:.4f} |")  # fmt: skip


if __name__ == "__main__":
    parse_and_spawn(
        __doc__, worker, "benchmarks/results/compress.json", reps=4, steps=5, micro_batch=8
    )
