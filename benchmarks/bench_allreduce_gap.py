"""What a gloo all-reduce adds to a step, by the compute issued between two of them.

``paracube plan --calibrate`` times an all-reduce issued between short computes (four
256³ matmuls, ~1 ms on this CPU) and fits α-β through 4 KiB and 8 MiB. A tensor-parallel
block of the ``small`` preset issues its all-reduces between longer ones (a layer's matmuls,
~10 ms). This measures, at sizes from 4 KiB to 8 MiB, what one all-reduce adds to a step
between either compute (2 gloo ranks × 1 thread; the median of five rounds of ten calls,
the calibration's own method, ``paracube.calibrate._between_computes``), so the two can be
read side by side:

    python benchmarks/bench_allreduce_gap.py --out benchmarks/results/allreduce_gap.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import spawn_world, write_json

SIZES_KIB = (4, 64, 256, 1024, 2048, 8192)


def _measure(rank: int, world: int, out) -> None:
    from paracube.calibrate import _between_computes

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    x, w = torch.randn(1024, 256), torch.randn(256, 1024)

    def short() -> None:  # the calibration's: four 256³ matmuls
        for _ in range(4):
            a @ b

    def layer() -> None:  # a block's worth: three (1024 × 256)·(256 × 1024) matmuls
        for _ in range(3):
            x @ w

    rows = []
    for kib in SIZES_KIB:
        buf = torch.zeros(kib * 256)  # fp32
        rows.append(
            {
                "kib": kib,
                "short_ms": 1e3 * _between_computes(lambda buf=buf: dist.all_reduce(buf), short),
                "layer_ms": 1e3 * _between_computes(lambda buf=buf: dist.all_reduce(buf), layer),
            }
        )
    if rank == 0:
        out.put(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/allreduce_gap.json")
    args = p.parse_args()
    queue = mp.get_context("spawn").SimpleQueue()
    spawn_world(2, _measure, queue)
    rows = queue.get()
    write_json(args.out, {"benchmark": "allreduce_gap", "rows": rows})
    print("| all-reduce | added between short computes (ms) | between layer-sized ones (ms) |")
    print("|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kib']} KiB | {r['short_ms']:.2f} | {r['layer_ms']:.2f} |")


if __name__ == "__main__":
    main()
