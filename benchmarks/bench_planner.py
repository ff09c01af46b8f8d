"""The planner's predictions against paracube's own measured runs on this machine.

For each of several layouts of the GPT preset ``small`` (2 ranks × 1 thread): calibrates
this machine (`paracube plan --calibrate`) and at once runs `paracube train --predict`, and
tabulates predicted vs measured step time and model-state memory per rank. Calibrating
right before each run keeps a shared machine's drift (its speed moves by 10-25 % over
minutes) out of the comparison.

    python benchmarks/bench_planner.py --out benchmarks/results/planner.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_json

LAYOUTS = {
    "dp=2": ["--dp", "2"],
    "dp=2, accum 2": ["--dp", "2", "--grad-accum", "2"],
    "dp=2 ZeRO-3, accum 4": ["--dp", "2", "--zero", "3", "--grad-accum", "4"],
    "tp=2": ["--tp", "2"],
    "tp=2 + SP": ["--tp", "2", "--sequence-parallel"],
    "pp=2 1f1b m=4": ["--pp", "2", "--microbatches", "4", "--micro-batch", "4"],
    "pp=2 gpipe m=4": [
        "--pp",
        "2",
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--micro-batch",
        "4",
    ],
}
LINE = re.compile(
    r"predicted step ([\d.]+) ms, measured median ([\d.]+) ms .* predicted ([\d.]+) MiB, counted ([\d.]+) MiB"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default="benchmarks/results/planner.json")
    args = p.parse_args()
    env = {**os.environ, "PARACUBE_CALIBRATION": str(Path(tempfile.mkdtemp()) / "calibration.json")}
    rows = []
    for name, flags in LAYOUTS.items():
        cal = subprocess.run(
            [sys.executable, "-m", "paracube", "plan", "--calibrate"],
            env=env,
            capture_output=True,
            text=True,
        )
        print(f"{name}: {cal.stdout.strip()}")
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "paracube",
                "train",
                "--model",
                "small",
                "--steps",
                str(args.steps),
                "--no-progress",
                "--predict",
                *flags,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        match = LINE.search(run.stdout)
        if not match:
            raise SystemExit(f"{name}: no prediction line\n{run.stdout}\n{run.stderr}")
        pred, meas, mem_p, mem_c = map(float, match.groups())
        rows.append(
            {
                "layout": name,
                "predicted_ms": pred,
                "measured_ms": meas,
                "ratio": round(pred / meas, 3),
                "model_states_predicted_mib": mem_p,
                "model_states_counted_mib": mem_c,
                "calibration": cal.stdout.strip(),
                # every measured rate, the unprinted ones too: an outlier is then traceable
                "calibration_data": json.loads(Path(env["PARACUBE_CALIBRATION"]).read_text()),
            }
        )
    write_json(
        args.out,
        {"benchmark": "planner", "model": "small", "rows": rows},
    )
    print(
        "\n| layout | predicted ms/step | measured ms/step | predicted ÷ measured "
        "| model states predicted / counted (MiB) |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['ratio']:.2f} | "
            f"{r['model_states_predicted_mib']:.2f} / {r['model_states_counted_mib']:.2f} |"
        )


if __name__ == "__main__":
    main()
