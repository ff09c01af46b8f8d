"""The planner against published large-scale training runs (pure math, seconds).

The runs, their sources and the counting are in ``paracube/planner/published.py``.

    python benchmarks/bench_planner_published.py --out benchmarks/results/planner_published.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json
from paracube.planner.published import evaluate, runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/planner_published.json")
    args = p.parse_args()
    results = [evaluate(r) for r in runs()]
    write_json(
        args.out,
        {
            "benchmark": "planner_published",
            "source": "paracube/planner/published.py",
            "rows": results,
        },
    )
    print(
        "| source | model | seq | GPUs | tp×pp×dp | batch | b | recompute | FLOPs counted "
        "| published TFLOP/s/GPU | predicted | predicted ÷ published | note |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|---|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r['source']} | {r['model']} | {r['seq_len']} | {r['gpus']} | {r['layout']} | "
            f"{r['batch']} | {r['micro_batch']} | {r['recompute']} | {r['counting']} | "
            f"{r['published_tflops']} | {r['predicted_tflops']} | {r['ratio']:.2f} | {r['note']} |"
        )
    print("\n| stack | runs | predicted ÷ published | median | within ±15 % | beyond ±30 % |")
    print("|---|---:|---|---:|---:|---:|")
    for stack in dict.fromkeys(r["stack"] for r in results):
        print(summary(stack, [r["ratio"] for r in results if r["stack"] == stack]))
    print(summary("all", [r["ratio"] for r in results]))


def summary(name: str, ratios: list[float]) -> str:
    within = sum(abs(x - 1) <= 0.15 for x in ratios)
    beyond = sum(abs(x - 1) > 0.30 for x in ratios)
    median = sorted(ratios)[len(ratios) // 2]
    return (
        f"| {name} | {len(ratios)} | {min(ratios):.2f}–{max(ratios):.2f} | {median:.2f} | "
        f"{within} | {beyond} |"
    )


if __name__ == "__main__":
    main()
