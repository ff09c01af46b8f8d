"""Gradient compression on a bandwidth-limited link: does it pay by the expected factor?

Two ranks × 1 thread, each in its own network namespace, joined by a veth pair
(``benchmarks/netns.py``); the ``small`` GPT, micro-batch 8 per rank, fp32, AdamW. The
engine's step with ``--compress`` none, fp16, powersgd:4 and topk:0.01 (all with error
feedback), interleaved ABBA, is timed twice: on the unshaped link, then with both
directions limited to ``--rate`` Mbit/s by ``tc`` (a token-bucket filter).

The expected shaped step of each variant is its unshaped step plus the time its bytes
take on the link: per direction, a 2-rank ring all-reduce sends the whole buffer and an
all-gather half the gathered size (the ledger counts the buffer and the gathered
tensor), at ``--rate``. It ignores the overlap of the reduction with backward, so it is
an upper bound for the uncompressed step; the table shows both speed-ups over ``none``.
Needs root (namespaces); creates and removes them itself.

    python benchmarks/bench_shaped_link.py --out benchmarks/results/shaped_link.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns
from common import free_port, write_json

OURS = ("none", "fp16", "powersgd:4", "topk:0.01")
PER_DIRECTION = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5}  # 2 ranks


def worker(args) -> None:
    """One rank, inside its namespace: every variant's median step and bytes."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from common import interleaved, median_ms
    from paracube.config import ParallelConfig, TrainConfig
    from paracube.data.corpus import build_corpus
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from paracube.models.presets import preset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    base = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=2),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    trainers = {c: Trainer(base.replace(compress=c), mesh, corpus) for c in OURS}
    comm: dict[str, dict] = {}

    def step_of(c):
        def step():
            comm[c] = trainers[c].train_step().comm

        return step

    times = interleaved({c: step_of(c) for c in OURS}, reps=args.reps, steps=args.steps)
    if dist.get_rank() == 0:
        direction = {
            c: sum(
                v["bytes"] * PER_DIRECTION.get(k.split("/")[0], 0.0)
                for k, v in comm[c].items()
                if k.endswith("/grad")
            )
            for c in OURS
        }
        result = {c: {"median_ms": median_ms(times[c]), "bytes_per_direction": direction[c]}
                  for c in OURS}  # fmt: skip
        Path(args.result).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_phase(args, rate: float | None) -> dict:
    """Shape the link, run both ranks, return rank 0's figures."""
    netns.shape(rate)
    port = free_port()
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, __file__, "--worker", "--result", out.name, "--model", args.model,
                "--micro-batch", str(args.micro_batch), "--reps", str(args.reps),
                "--steps", str(args.steps)]  # fmt: skip
        procs = [
            subprocess.Popen(netns.in_namespace(r, argv), env=netns.rank_env(r, port))
            for r in (0, 1)
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"bench_shaped_link: a rank failed (exit codes {codes})")
        return json.loads(Path(out.name).read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--rate", type=float, default=200.0, help="link rate, Mbit/s each way")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/shaped_link.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    why = netns.available()
    if why is not None:
        print(f"bench_shaped_link: {why}; nothing measured", file=sys.stderr)
        raise SystemExit(2)
    with netns.namespaces():
        free = run_phase(args, None)
        shaped = run_phase(args, args.rate)
    rows = []
    for c in OURS:
        wire_ms = 1000 * free[c]["bytes_per_direction"] * 8 / (args.rate * 1e6)
        rows.append({
            "compress": c, "unshaped_ms": round(free[c]["median_ms"], 1),
            "shaped_ms": round(shaped[c]["median_ms"], 1),
            "expected_shaped_ms": round(free[c]["median_ms"] + wire_ms, 1),
            "mb_per_direction": round(free[c]["bytes_per_direction"] / 1e6, 3),
        })  # fmt: skip
    none = rows[0]
    for r in rows:
        r["speedup"] = round(none["shaped_ms"] / r["shaped_ms"], 2)
        r["expected_speedup"] = round(none["expected_shaped_ms"] / r["expected_shaped_ms"], 2)
    write_json(args.out, {"benchmark": "shaped_link", "model": args.model, "world": 2,
                          "rate_mbit": args.rate, "micro_batch": args.micro_batch, "rows": rows})  # fmt: skip
    print(
        f"\nmodel {args.model}, 2 ranks × 1 thread in network namespaces, link {args.rate:g} Mbit/s each way\n"
    )
    print(
        "| --compress | MB/step each way | unshaped ms | shaped ms | expected ms | speed-up | expected |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['compress']} | {r['mb_per_direction']:.3f} | {r['unshaped_ms']:.0f} | "
              f"{r['shaped_ms']:.0f} | {r['expected_shaped_ms']:.0f} | {r['speedup']:.2f}× | "
              f"{r['expected_speedup']:.2f}× |")  # fmt: skip


if __name__ == "__main__":
    main()
