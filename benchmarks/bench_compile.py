"""``paracube train --compile`` vs torch DDP (or DTensor TP) with the same blocks compiled,
side by side, 2 ranks × 1 thread.

A Llama-shaped model at the ``small`` preset's size (4 blocks of 256, RMSNorm, SwiGLU of
704, rotary positions, 2 key/value heads) trains with AdamW on the same batches. paracube
runs its engine step with its blocks eager, under inductor's partitioner alone
(``--compile partition``) and under inductor (``--compile inductor``); the peer is torch
DDP over the same GPT with each block ``torch.compile``d by inductor, as torchtitan
compiles its blocks. ``--parallel tp``: tensor parallelism over the 2 ranks instead — paracube's
compiled regions between its eager collectives, against torch DTensor's
``parallelize_module`` (torchtitan's plan: q, k, v, gate and up column-wise, o and down
row-wise, vocabulary-parallel embedding, head and loss) with each block compiled, its
collectives in the graph as functional ops. Reported: the median step, paracube's throughput against each, and
the counted peak of saved activations per rank beside the planner's count for the layout
(``paracube plan --activations compiled``; + 8·b bytes: the token ids are a view of the
sampler's one-column-wider window). Compilation happens in the warm-up, outside the timing.

    python benchmarks/bench_compile.py --out benchmarks/results/compile.json
    python benchmarks/bench_compile.py --parallel tp --out benchmarks/results/compile_tp.json
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from bench_data_parallel import batch_stream, peer_step
from bench_tensor_parallel import dtensor_step
from common import interleaved, parse_and_spawn, print_table, ratio_rows, run_record, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer, build_optimizer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT
from paracube.models.presets import preset
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_memory

MODES = {
    "paracube": "inductor",
    "paracube, eager blocks": "none",
    "paracube, partition": "partition",
}


def llama_small(name: str):
    return replace(
        preset(name),
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        bias=False,
        ffn_hidden=704,
        n_kv_heads=2,
    )


def worker(rank: int, world: int, args, out: str) -> None:
    torch.set_num_threads(1)
    if args.parallel not in ("dp", "tp"):
        raise SystemExit(f"--parallel {args.parallel!r}: choose dp or tp")
    tp = args.parallel == "tp"
    base = TrainConfig(
        model=llama_small(args.model),
        parallel=ParallelConfig(tp=world) if tp else ParallelConfig(dp=world),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
        count_activations_every=1,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    trainers = {
        name: Trainer(base.replace(compile=mode), mesh, corpus) for name, mode in MODES.items()
    }
    peaks: dict[str, int] = {}

    def runner(name):
        def step():
            peaks[name] = trainers[name].train_step().memory["activations_peak"]

        return step

    variants = {name: runner(name) for name in MODES}
    stream = batch_stream(trainers["paracube"])
    if tp:
        peer_name = "torch DTensor TP, compiled blocks"
        variants[peer_name] = dtensor_step(base, stream, compile_blocks=True)
    else:
        peer_name = "torch DDP, compiled blocks"
        torch.manual_seed(base.seed)
        peer = GPT(base.model)
        for block in peer.blocks:
            block.compile()
        model = DDP(peer)
        variants[peer_name] = peer_step(model, build_optimizer(peer, base), stream, base)
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    rows = ratio_rows(times)
    for row in rows:
        name = row["variant"]
        if name in MODES:
            cfg = base.replace(compile=MODES[name])
            planned = stage_memory(cfg.model, Layout.from_config(cfg), cfg.precision)[0]
            row["activations_counted_mib"] = round(peaks[name] / 2**20, 3)
            # + the sampler's wider window, of which the ids are a view (not under tensor
            # parallelism: the vocabulary-parallel embedding keeps its own shifted ids)
            window = 0 if tp else 8 * cfg.micro_batch
            row["activations_planned_mib"] = round((planned.activations + window) / 2**20, 3)
    med = {r["variant"]: r["median_ms"] for r in rows}
    payload = {
        **run_record("compile", f"{args.model}, Llama-shaped", world, args),
        "parallel": f"{args.parallel} {world}",
        "rows": rows,
        "throughput_ratio_vs_peer_compiled": round(med[peer_name] / med["paracube"], 3),
        "compiled_vs_eager_blocks": round(med["paracube, eager blocks"] / med["paracube"], 3),
    }
    write_json(out, payload)
    print(
        f"\nmodel {payload['model']}, {args.parallel} over {world} ranks × 1 thread, "
        f"batch {args.micro_batch}/rank, "
        f"{args.reps}×{args.steps} interleaved steps per variant\n"
    )
    print_table(rows)
    print("\n| variant | saved activations MiB/rank (counted) | (planned) |\n|---|---:|---:|")
    for r in rows:
        if "activations_counted_mib" in r:
            print(
                f"| {r['variant']} | {r['activations_counted_mib']:.3f} | "
                f"{r['activations_planned_mib']:.3f} |"
            )


def main() -> None:
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/compile.json",
        reps=6,
        steps=4,
        micro_batch=8,
        parallel="dp",
    )


if __name__ == "__main__":
    main()
