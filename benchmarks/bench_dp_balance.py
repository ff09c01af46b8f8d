"""Uneven data-parallel splits against the even split, with one rank slowed.

2 ranks × 1 thread, the ``small`` GPT, micro-batch 8 (global batch 16), fp32; rank 1's
compute slowed ``--factor`` × by ``--inject slow-rank`` (it sleeps in proportion to its
own work). Variants, interleaved (ABBA, blocks of ``--steps`` steps back to back between
barriers, so each variant's waits for the slow rank are inside its time):

- ``even``: the usual split (8 / 8 windows);
- ``auto``: ``--dp-balance auto``, after ``--settle`` steps to find its split;
- ``weights 2,1``: the split by the injected speeds (11 / 5).

The ideal is the two ranks' own speeds summed — each rank's windows per second of
compute in the even run, without waiting for the other — the figure no split can beat.

    python benchmarks/bench_dp_balance.py --out benchmarks/results/dp_balance.json
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved, median_ms, parse_and_spawn, write_json
from paracube import inject
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.inject import Injections
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset
from paracube.ranktimes import compute_seconds

VARIANTS = {"even": "even", "auto": "auto", "weights 2,1": "2,1"}


def worker(rank: int, world: int, args, out: str) -> None:
    inject.activate(Injections(slow_rank=1, slow_factor=args.factor), rank)
    base = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    trainers = {
        name: Trainer(base.replace(dp_balance=balance), mesh, corpus)
        for name, balance in VARIANTS.items()
    }
    for _ in range(args.settle):  # auto finds its split (window 3, 10 % hysteresis)
        trainers["auto"].train_step()
    last: dict[str, object] = {}

    def runner(name):
        def step():
            last[name] = trainers[name].train_step()

        return step

    computes: list[list[float]] = []

    def even_step():
        m = trainers["even"].train_step()
        computes.append(compute_seconds(m.ranks or {}))

    variants = {n: (even_step if n == "even" else runner(n)) for n in VARIANTS}
    times = interleaved(variants, reps=args.reps, steps=args.steps, blocks=True)
    if rank != 0:
        return
    tokens = base.global_batch * base.model.seq_len
    speed = {k: tokens / (median_ms(v) / 1000) for k, v in times.items()}
    share = base.global_batch // world * base.model.seq_len  # tokens per rank, even split
    own = [share / statistics.median(c[r] for c in computes) for r in range(world)]
    ideal = sum(own)
    payload = {
        "model": args.model,
        "world": world,
        "slow_factor": args.factor,
        "tokens_per_s": {k: round(v, 1) for k, v in speed.items()},
        "auto_split": list(trainers["auto"].batches.split.shares),
        "ideal_tokens_per_s": round(ideal, 1),
        "own_tokens_per_s": [round(v, 1) for v in own],
        "auto_vs_even": speed["auto"] / speed["even"],
        "weights_vs_even": speed["weights 2,1"] / speed["even"],
        "auto_vs_ideal": speed["auto"] / ideal,
        "blocks_of_steps": len(times["even"]),
        "steps_per_block": args.steps,
    }
    write_json(out, payload)
    print("| variant | tokens/s | ÷ even | ÷ ideal |")
    print("|---|---:|---:|---:|")
    for k, v in speed.items():
        print(f"| {k} | {v:,.0f} | {v / speed['even']:.3f} | {v / ideal:.2f} |")
    print(f"| ideal (own speeds summed: {own[0]:,.0f} + {own[1]:,.0f}) | {ideal:,.0f} | | |")
    print(f"auto's split: {payload['auto_split']} windows")


if __name__ == "__main__":
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/dp_balance.json",
        reps=6,
        steps=4,
        micro_batch=8,
        factor=2.0,
        settle=8,
    )
