"""What a gloo all-reduce adds to a step, by the compute issued between two of them.

``paracube plan --calibrate`` times an all-reduce issued between short computes (four
256³ matmuls, ~1 ms on this CPU) and fits α-β through 4 KiB and 8 MiB. A tensor-parallel
block issues its all-reduces between longer ones (the ``small`` preset at 8 sequences and
tp=2: a block's ~30 ms of forward and backward between its four, ~7 ms each). This
measures what one all-reduce of 256 KiB and of 1 MiB adds to a step between computes of
~1, 2.5, 5 and 10 ms (256³ matmuls, as many as take that long here), three times each
(2 gloo ranks × 1 thread; each measurement the median of five rounds of ten calls, the
calibration's own method, ``paracube.calibrate._between_computes``):

    python benchmarks/bench_allreduce_gap.py --out benchmarks/results/allreduce_gap.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import spawn_world, write_json

GAPS_MS = (1.0, 2.5, 5.0, 10.0)
SIZES_KIB = (256, 1024)
REPEATS = 3


def _measure(rank: int, world: int, out) -> None:
    from paracube.calibrate import _between_computes

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(40):
        a @ b
    per_matmul = (time.perf_counter() - start) / 40
    rows = []
    for gap in GAPS_MS:
        # the same count of matmuls on both ranks: rank 0's timing decides it for both
        count = torch.tensor([max(1, round(gap / 1e3 / per_matmul))])
        dist.broadcast(count, 0)

        def compute(n: int = int(count)) -> None:
            for _ in range(n):
                a @ b

        for kib in SIZES_KIB:
            buf = torch.zeros(kib * 256)  # fp32
            added = [
                1e3 * _between_computes(lambda buf=buf: dist.all_reduce(buf), compute)
                for _ in range(REPEATS)
            ]
            rows.append({"gap_ms": gap, "kib": kib, "added_ms": added})
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
    print("| compute between | all-reduce | added to the step (ms), three measurements |")
    print("|---:|---:|---|")
    for r in rows:
        added = ", ".join(f"{x:.2f}" for x in r["added_ms"])
        print(f"| ~{r['gap_ms']:g} ms | {r['kib']} KiB | {added} |")


if __name__ == "__main__":
    main()
