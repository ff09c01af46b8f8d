"""The planner's ResNet-50 (a model described without layers) against NVIDIA's measured
training throughput (pure math, seconds).

Published: NVIDIA/DeepLearningExamples, ``PyTorch/Classification/ConvNets/resnet50v1.5/
README.md``, "Training performance results" (pytorch-21.03 NGC container): images/s on 1 and
8 GPUs of a DGX A100 (8 × A100 80GB: TF32 and mixed precision) and of DGX-1s (8 × V100 16GB
and 8 × V100 32GB: FP32 and mixed precision); the per-GPU batch of each from the same
folder's ``configs.yml`` (256, FP32 on DGX-1V 112); mixed precision is apex AMP in fp16.
The planner times each at that per-GPU batch, one micro-batch per step, data parallel over
NVLink (the V100 rows on the catalog's 32 GB V100: memory does not enter the step time).

    python benchmarks/bench_planner_resnet50.py --out benchmarks/results/planner_resnet50.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json
from paracube.planner import hardware as hw
from paracube.planner.generic import generic, search_generic
from paracube.planner.time_model import Cluster

# (system, GPU key, precision as planned, per-GPU batch, {GPUs: published images/s})
PUBLISHED = [
    ("DGX A100 80GB, TF32", "a100-80gb", "tf32", 256, {1: 938, 8: 7248}),
    ("DGX A100 80GB, AMP", "a100-80gb", "fp16", 256, {1: 2470, 8: 16621}),
    ("DGX-1 V100 16GB, FP32", "v100", "fp32", 112, {1: 367, 8: 2855}),
    ("DGX-1 V100 16GB, AMP", "v100", "fp16", 256, {1: 1200, 8: 8322}),
    ("DGX-1 V100 32GB, FP32", "v100", "fp32", 112, {1: 356, 8: 2766}),
    ("DGX-1 V100 32GB, AMP", "v100", "fp16", 256, {1: 1156, 8: 8056}),
]


def predicted(gpu: str, precision: str, batch: int, gpus: int) -> float:
    cluster = Cluster(
        hw.gpu(gpu), 8, hw.interconnect(hw.DEFAULT_INTRA[gpu]), hw.interconnect("ib-hdr")
    )
    model = generic("resnet50")
    assert model is not None
    fixed = {"micro_batch": batch, "zero": 0}
    result = search_generic(model, cluster, gpus, batch * gpus, precision, fixed)
    return result.ranked[0].time.tokens_per_s  # samples/s for a model without tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/planner_resnet50.json")
    args = p.parse_args()
    rows = []
    for system, gpu, precision, batch, measured in PUBLISHED:
        for gpus, images in measured.items():
            rate = predicted(gpu, precision, batch, gpus)
            rows.append(
                {"system": system, "precision": precision, "batch_per_gpu": batch, "gpus": gpus,
                 "published": images, "predicted": round(rate), "ratio": round(rate / images, 3)}
            )  # fmt: skip
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
