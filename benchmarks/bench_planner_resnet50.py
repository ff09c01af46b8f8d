"""The planner's ResNet-50 (a model described without layers) against NVIDIA's measured
training throughput (pure math, seconds).

The runs and their source: ``paracube.planner.published.RESNET50_RUNS`` (NVIDIA
DeepLearningExamples, ResNet-50 v1.5 for PyTorch: images/s on 1 and 8 GPUs of a DGX A100 and
of DGX-1s, at the per-GPU batch of its configs). The planner times each at that batch, one
micro-batch per step, data parallel over NVLink.

    python benchmarks/bench_planner_resnet50.py --out benchmarks/results/planner_resnet50.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json
from paracube.planner.published import resnet50_checks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/planner_resnet50.json")
    args = p.parse_args()
    rows = resnet50_checks()
    write_json(
        args.out,
        {"benchmark": "planner_resnet50", "source": "benchmarks/bench_planner_resnet50.py",
         "rows": rows},
    )  # fmt: skip
    print("| system | planned as | batch/GPU | GPUs | published img/s | predicted | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['system']} | {r['precision']} | {r['batch_per_gpu']} | {r['gpus']} | "
            f"{r['published']:,} | {r['predicted']:,} | {r['ratio']:.2f} |"
        )
    by_system: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_system.setdefault(r["system"], {})[r["gpus"]] = r
    print("\n| system | 8-GPU scaling published | predicted |")
    print("|---|---:|---:|")
    for system, r in by_system.items():
        print(
            f"| {system} | {r[8]['published'] / r[1]['published']:.2f}× | "
            f"{r[8]['predicted'] / r[1]['predicted']:.2f}× |"
        )


if __name__ == "__main__":
    main()
