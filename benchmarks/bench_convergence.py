"""Convergence under gradient compression and periodic averaging, against synchronous DP.

2 ranks × 1 thread, the ``--model`` GPT (default ``tiny``) on the embedded corpus, 8
sequences per rank, ``--steps`` steps (default 300) of AdamW with warm-up and cosine decay,
every variant from the same weights and batches: sync, fp16, bf16, powersgd:4 and
topk:0.01 each with and without error feedback, local-sgd:4 and diloco:4. Reports each
variant's final validation loss (the mean of ``--eval-batches`` global batches) against
sync's, and draws the training-loss curves (``--plot``).

    python benchmarks/bench_convergence.py --out benchmarks/results/convergence.json --plot docs/images/convergence.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spawn_world, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset

VARIANTS = {
    "sync": {},
    "fp16": dict(compress="fp16"),
    "bf16": dict(compress="bf16"),
    "powersgd:4": dict(compress="powersgd:4"),
    "powersgd:4, no error feedback": dict(compress="powersgd:4", error_feedback=False),
    "topk:0.01": dict(compress="topk:0.01"),
    "topk:0.01, no error feedback": dict(compress="topk:0.01", error_feedback=False),
    "local-sgd:4": dict(dp_mode="local-sgd:4"),
    "diloco:4": dict(dp_mode="diloco:4"),
}


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
    results = {}
    for name, change in VARIANTS.items():
        trainer = Trainer(base.replace(**change), mesh, corpus)
        start = time.perf_counter()
        curve = [trainer.train_step().loss for _ in range(args.steps)]
        seconds = time.perf_counter() - start
        results[name] = {"curve": curve, "val_loss": trainer.evaluate(), "seconds": seconds}
        if rank == 0:
            print(
                f"{name}: validation {results[name]['val_loss']:.4f} ({seconds:.0f} s)", flush=True
            )
    if rank != 0:
        return
    sync = results["sync"]["val_loss"]
    rows = [
        {"variant": k, "val_loss": round(v["val_loss"], 4),
         "vs_sync_percent": round(100 * (v["val_loss"] / sync - 1), 2),
         "seconds": round(v["seconds"], 1)}
        for k, v in results.items()
    ]  # fmt: skip
    write_json(out, {"benchmark": "convergence", "model": args.model, "world": world,
                     "steps": args.steps, "rows": rows,
                     "curves": {k: v["curve"] for k, v in results.items()}})  # fmt: skip
    print("| variant | validation loss | vs sync |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['val_loss']:.4f} | {r['vs_sync_percent']:+.2f} % |")
    if args.plot:
        _plot(results, args)


def _plot(results, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, r in results.items():
        style = "--" if "no error feedback" in name else "-"
        ax.plot(r["curve"], style, label=f"{name} (val {r['val_loss']:.3f})", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title(f"{args.model}, dp=2: compression and periodic averaging vs sync")
    ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--plot", default=None)
    p.add_argument("--out", default="benchmarks/results/convergence.json")
    args = p.parse_args()
    spawn_world(2, worker, args, args.out)


if __name__ == "__main__":
    main()
