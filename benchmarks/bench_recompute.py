"""Activation recomputation's price and saving, measured: paracube with ``--recompute``
none / selective / full, and bf16 beside fp32, interleaved in one run.

2 ranks × 1 thread (data parallel), GPT preset ``small``, 8 sequences per rank. Reports
the median step time, the overhead against no recomputation, and the counted peak of
saved activations per rank (saved-tensor hooks, see paracube.memory) next to the op-by-op
formula for paracube's model (paracube.models.shapes).

    python benchmarks/bench_recompute.py --out benchmarks/results/recompute.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


from common import interleaved, median_ms, parse_and_spawn, run_record, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset
from paracube.models.shapes import model_saved_bytes

VARIANTS = {
    "fp32, no recompute": dict(),
    "fp32, selective recompute": dict(recompute="selective"),
    "fp32, full recompute": dict(recompute="full"),
    "bf16, no recompute": dict(precision="bf16"),
}


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
    trainers = {
        name: Trainer(base.replace(count_activations_every=1, **kw), mesh, corpus)
        for name, kw in VARIANTS.items()
    }
    peaks = {}

    def runner(name):
        def step():
            peaks[name] = (
                trainers[name].train_step().memory["activations_peak"]
            )  # counted every step here

        return step

    times = interleaved({n: runner(n) for n in trainers}, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    med = {k: median_ms(v) for k, v in times.items()}
    none = med["fp32, no recompute"]
    rows = []
    for name, kw in VARIANTS.items():
        elem = 2 if kw.get("precision") == "bf16" else 4
        formula = model_saved_bytes(
            base.model, base.micro_batch, elem=elem, recompute=kw.get("recompute", "none")
        )
        rows.append(
            {
                "variant": name,
                "median_ms": round(med[name], 1),
                "time_vs_no_recompute": round(med[name] / none, 3),
                "activations_counted_mib": round(peaks[name] / 2**20, 2),
                "activations_formula_mib": round(formula / 2**20, 2),
            }
        )
    payload = {**run_record("recompute", args.model, world, args), "rows": rows}
    write_json(out, payload)
    print(
        f"\nmodel {args.model}, {world} ranks × 1 thread, batch {args.micro_batch}/rank, "
        f"{args.reps}×{args.steps} interleaved steps per variant\n"
    )
    print(
        "| variant | median ms/step | time ÷ no recompute | saved activations MiB/rank (counted) | (formula) |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['median_ms']:.1f} | {r['time_vs_no_recompute']:.3f} | "
            f"{r['activations_counted_mib']:.2f} | {r['activations_formula_mib']:.2f} |"
        )


def main() -> None:
    parse_and_spawn(
        __doc__, worker, "benchmarks/results/recompute.json", reps=6, steps=4, micro_batch=8
    )


if __name__ == "__main__":
    main()
