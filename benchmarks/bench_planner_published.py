"""The planner against published large-scale runs: Megatron-LM's weak-scaling table.

Narayanan et al. 2021 (SC21), Table 1: GPT models from 1.7B to 1T parameters on up to
3,072 A100-80GB (DGX A100: 8 GPUs per node, NVLink 3 inside, 8 × HDR InfiniBand per node),
sequence 2048, vocabulary 51,200, full activation recomputation, 1F1B schedule, with the
tensor-, pipeline- and data-parallel sizes and global batch the paper lists, and achieved
TFLOP/s per GPU counted with the paper's Eq. 3 (which includes the recomputed forward).
For each row the planner evaluates that layout (`paracube plan --layout ... --schedule 1f1b
--recompute full`, choosing the micro-batch itself) and its predicted step time is turned
into TFLOP/s with the same Eq. 3. Nothing in the planner is fitted to these numbers.

    python benchmarks/bench_planner_published.py --out benchmarks/results/planner_published.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_json  # noqa: E402

# heads, hidden, layers, tp, pp, GPUs, global batch, achieved TFLOP/s per GPU (SC21 Table 1)
SC21 = [
    (24, 2304, 24, 1, 1, 32, 512, 137), (32, 3072, 30, 2, 1, 64, 512, 138),
    (32, 4096, 36, 4, 1, 128, 512, 142), (48, 6144, 40, 8, 1, 256, 1024, 135),
    (64, 8192, 48, 8, 2, 512, 1536, 138), (80, 10240, 60, 8, 4, 1024, 1792, 140),
    (96, 12288, 80, 8, 8, 1536, 2304, 148), (128, 16384, 96, 8, 16, 1920, 2160, 155),
    (128, 20480, 105, 8, 35, 2520, 2520, 163), (160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200


def eq3_flops(batch: int, layers: int, hidden: int) -> float:
    """SC21 Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), with full recomputation."""
    return 96 * batch * SEQ * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/planner_published.json")
    args = p.parse_args()
    rows = []
    for heads, hidden, layers, tp, pp, gpus, batch, published in SC21:
        dp = gpus // (tp * pp)
        cmd = [sys.executable, "-m", "paracube", "plan", "--layers", str(layers), "--hidden", str(hidden),
               "--heads", str(heads), "--vocab", str(VOCAB), "--seq", str(SEQ), "--gpus", str(gpus),
               "--gpus-per-node", "8", "--gpu", "a100-80gb", "--global-batch", str(batch),
               "--layout", f"dp={dp},tp={tp},pp={pp}", "--schedule", "1f1b", "--recompute", "full", "--json"]
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        best = out["candidates"][0]
        predicted = eq3_flops(batch, layers, hidden) / best["time"]["step_time"] / gpus / 1e12
        rows.append({"hidden": hidden, "layers": layers, "tp": tp, "pp": pp, "dp": dp, "gpus": gpus, "batch": batch,
                     "micro_batch": best["layout"]["micro_batch"], "published_tflops": published,
                     "predicted_tflops": round(predicted, 1), "ratio": round(predicted / published, 3)})
    write_json(args.out, {"benchmark": "planner_published", "source": "Narayanan et al. 2021, Table 1", "rows": rows})
    print("| model (h, L) | tp × pp × dp = GPUs | batch | micro-batch (planner) | published TFLOP/s/GPU | predicted | predicted ÷ published |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['hidden']}, {r['layers']} | {r['tp']} × {r['pp']} × {r['dp']} = {r['gpus']} | {r['batch']} | "
              f"{r['micro_batch']} | {r['published_tflops']} | {r['predicted_tflops']} | {r['ratio']:.2f} |")
    ratios = [r["ratio"] for r in rows]
    print(f"\npredicted ÷ published: {min(ratios):.2f}–{max(ratios):.2f}, "
          f"within ±15 % for {sum(abs(x - 1) <= 0.15 for x in ratios)} of {len(ratios)} rows")


if __name__ == "__main__":
    main()
