"""The planner's choice against NVIDIA's tuned recipes (pure math, seconds).

For each model of NVIDIA's DGX Cloud benchmarking tables (``paracube.planner.published.
DGXC_TABLES``: the recipes' layouts, global batches and measured step times on H100), at the
table's smallest GPU count in BF16: the layout the planner proposes when asked for NeMo's
software (``--stack nemo``: its facts, the choices it runs, context parallelism searched),
its predicted throughput, and the recipe's own layout as the planner times it and as it ran.

    python benchmarks/bench_planner_recipes.py --out benchmarks/results/planner_recipes.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json
from paracube.planner import hardware as hw
from paracube.planner.published import DGXC_TABLES, evaluate, runs
from paracube.planner.search import search
from paracube.planner.stacks import search_options, stack
from paracube.planner.time_model import Cluster


def shape(tp: int, pp: int, cp: int, vp: int, b: int) -> str:
    return (
        f"TP {tp} × PP {pp}"
        + (f" × CP {cp}" if cp > 1 else "")
        + (f" × VP {vp}" if vp > 1 else "")
        + f", b {b}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/planner_recipes.json")
    args = p.parse_args()
    h100 = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    published = {
        (r["cfg"].name, r["gpus"]): r
        for r in runs()
        if r["source"] == "DGX Cloud benchmarking (BF16)"
    }
    rows = []
    for cfg, tp, pp, cp, vp, b, _, scales in DGXC_TABLES:
        gpus, batch, *_ = scales[0]
        found = search(cfg, h100, gpus, batch, precision="bf16", fixed=stack("nemo"), top=1,
                       **search_options("nemo"))  # fmt: skip
        best = found.ranked[0]
        L = best.layout
        recipe = evaluate(published[(cfg.name, gpus)])
        rows.append(
            {
                "model": cfg.name,
                "gpus": gpus,
                "batch": batch,
                "recipe": shape(tp, pp, cp, vp, b),
                "recipe_published_tflops": recipe["published_tflops"],
                "recipe_predicted_tflops": recipe["predicted_tflops"],
                "recipe_note": recipe["note"],
                "planner": shape(L.tp, L.pp, L.cp, L.chunks, L.micro_batch)
                + (f", recompute {L.recompute}" if L.recompute != "none" else "")
                + (", optimizer offloaded" if L.offload else ""),
                "planner_predicted_tflops": round(best.time.tflops_per_gpu, 1),
                "same_tp_pp_cp": (L.tp, L.pp, L.cp) == (tp, pp, cp),
            }
        )
    write_json(args.out, {"benchmark": "planner_recipes", "rows": rows})
    print(
        "| model | GPUs | recipe (NVIDIA) | its TFLOP/s/GPU: published / predicted "
        "| planner's choice (--stack nemo) | predicted | same TP × PP × CP |"
    )
    print("|---|---:|---|---|---|---:|---|")
    for r in rows:
        note = f" ({r['recipe_note']})" if r["recipe_note"] else ""
        print(
            f"| {r['model']} | {r['gpus']} | {r['recipe']} | {r['recipe_published_tflops']:.0f} / "
            f"{r['recipe_predicted_tflops']:.0f}{note} | {r['planner']} | "
            f"{r['planner_predicted_tflops']:.0f} | {'yes' if r['same_tp_pp_cp'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
