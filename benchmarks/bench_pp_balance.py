"""Pipeline stages cut by each stage's measured speed against the even cut, one stage slowed.

2 ranks × 1 thread, pp = 2 under 1F1B, the ``small`` GPT made ``--layers`` deep (finer
cuts), micro-batch ``--micro-batch`` × ``--microbatches`` per step, fp32; rank 1's compute
slowed ``--factor`` × by ``--inject slow-rank`` (it sleeps in proportion to its own work,
as a slower device would take longer). Variants, interleaved (blocks of ``--steps`` steps
back to back between barriers):

- ``params``: the usual cut, equal parameters per stage (what every stack does);
- ``speed``: ``--balance speed`` — each stage's own measured layer times and memory.

The ideal is the two stages' own speeds summed: the whole model's forward + backward on
rank 0 (its layers timed in the same run, unslowed) gives rank 0's speed alone, rank 1's is
that ÷ factor; no cut, schedule or bubble can beat their sum.

    python benchmarks/bench_pp_balance.py --out benchmarks/results/pp_balance.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved, median_ms, parse_and_spawn, write_json
from paracube import inject
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.inject import Injections
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset
from paracube.models.shapes import chain_names, chain_train_flops
from paracube.ranktimes import compute_seconds

VARIANTS = ("params", "speed")


def flops_share(trainer, model, micro_batch: int) -> float:
    """This rank's share of the model's training FLOPs (the layers of its chunks)."""
    flops = chain_train_flops(model, micro_batch)
    index = {name: i for i, name in enumerate(chain_names(model))}
    mine = [index[n] for chunk in trainer.parallel.module.children() for n in chunk.names]
    return sum(flops[i] for i in mine) / sum(flops)


def worker(rank: int, world: int, args, out: str) -> None:
    inject.activate(Injections(slow_rank=1, slow_factor=args.factor), rank)
    model = preset(args.model, n_layers=args.layers)
    base = TrainConfig(
        model=model,
        parallel=ParallelConfig(pp=world, schedule="1f1b"),
        micro_batch=args.micro_batch,
        grad_accum=args.microbatches,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, model.seq_len)
    mesh = ProcessMesh(base.parallel)
    trainers, build_s = {}, {}
    for name in VARIANTS:
        start = time.perf_counter()
        cfg = base.replace(parallel=base.parallel.replace(balance=name))
        trainers[name] = Trainer(cfg, mesh, corpus)
        build_s[name] = time.perf_counter() - start

    computes: list[list[float]] = []

    def params_step():
        computes.append(compute_seconds(trainers["params"].train_step().ranks or {}))

    variants = {"params": params_step, "speed": lambda: trainers["speed"].train_step()}
    times = interleaved(variants, reps=args.reps, steps=args.steps, blocks=True)
    shares: list = [None] * world
    dist.all_gather_object(shares, flops_share(trainers["params"], model, args.micro_batch))
    if rank != 0:
        return
    tokens = base.global_batch * model.seq_len
    speed = {k: tokens / (median_ms(v) / 1000) for k, v in times.items()}
    own = [tokens * shares[r] / statistics.median(c[r] for c in computes) for r in range(world)]
    ideal = sum(own)
    payload = {
        "model": args.model,
        "layers": args.layers,
        "world": world,
        "slow_factor": args.factor,
        "micro_batch": args.micro_batch,
        "microbatches": args.microbatches,
        "tokens_per_s": {k: round(v, 1) for k, v in speed.items()},
        "ideal_tokens_per_s": round(ideal, 1),
        "own_tokens_per_s": [round(v, 1) for v in own],
        "params_flops_shares": [round(x, 4) for x in shares],
        "speed_vs_params": speed["speed"] / speed["params"],
        "speed_vs_ideal": speed["speed"] / ideal,
        "params_vs_ideal": speed["params"] / ideal,
        "speed_split_description": trainers["speed"].parallel.description,
        "params_split_description": trainers["params"].parallel.description,
        "build_seconds": {k: round(v, 2) for k, v in build_s.items()},
        "blocks_of_steps": len(times["params"]),
        "steps_per_block": args.steps,
    }
    write_json(out, payload)
    print(trainers["params"].parallel.description)
    print(trainers["speed"].parallel.description)
    print("| cut | tokens/s | ÷ params | ÷ ideal |")
    print("|---|---:|---:|---:|")
    for k, v in speed.items():
        print(f"| {k} | {v:,.0f} | {v / speed['params']:.3f} | {v / ideal:.2f} |")
    print(f"| ideal (own speeds summed: {own[0]:,.0f} + {own[1]:,.0f}) | {ideal:,.0f} | | |")
    print(
        f"the speed cut is chosen once, at start-up (it converges there): building its trainer "
        f"took {build_s['speed']:.2f} s against {build_s['params']:.2f} s for the params cut"
    )


if __name__ == "__main__":
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/pp_balance.json",
        reps=4,
        steps=3,
        micro_batch=4,
        microbatches=16,
        layers=12,
        factor=2.0,
    )
