"""A job's wall time from the command to its exit: ``paracube train`` (its ranks forked
from a rank server that imported torch, torch._dynamo and paracube once) against the same
job under ``torchrun`` (each rank a fresh interpreter importing them), side by side.

Short jobs (one step of a tiny model) so that start-up and teardown are what is timed;
repetitions interleaved (A B B A …) so that machine noise hits both alike.

    python benchmarks/bench_startup.py --out benchmarks/results/startup.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_json

ROOT = Path(__file__).resolve().parent.parent

# (name, ranks, the job's flags)
JOBS = [
    ("GPT nano, dp 2", 2, ["--dp", "2", "--model", "nano"]),
    ("GPT nano, dp 2 × tp 2", 4, ["--dp", "2", "--tp", "2", "--model", "nano"]),
    (
        "HF Llama (tiny), dp 2 × tp 2 × pp 2",
        8,
        [
            "--dp",
            "2",
            "--tp",
            "2",
            "--pp",
            "2",
            "--microbatches",
            "4",
            "--seq-len",
            "32",
            "--model",
            "hf:examples/models/llama-tiny",
        ],
    ),  # fmt: skip
]
COMMON = ["--steps", "1", "--no-progress", "--eval-every", "0"]


def command(launcher: str, ranks: int, flags: list[str]) -> list[str]:
    if launcher == "paracube":
        return [sys.executable, "-m", "paracube", "train", *flags, *COMMON]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={ranks}", "-m", "paracube", "train", *flags, *COMMON,
    ]  # fmt: skip


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/startup.json")
    args = p.parse_args()
    rows = []
    print("| job | ranks | paracube train (s) | torchrun (s) | torchrun ÷ paracube |")
    print("|---|---:|---:|---:|---:|")
    for name, ranks, flags in JOBS:
        times: dict[str, list[float]] = {"paracube": [], "torchrun": []}
        for rep in range(args.reps):
            order = ["paracube", "torchrun"] if rep % 2 == 0 else ["torchrun", "paracube"]
            for launcher in order:
                times[launcher].append(wall(command(launcher, ranks, flags)))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = dict(job=name, ranks=ranks, **{f"{k}_s": round(v, 2) for k, v in med.items()})
        row["ratio"] = round(med["torchrun"] / med["paracube"], 2)
        rows.append(row)
        print(
            f"| {name} | {ranks} | {med['paracube']:.1f} | {med['torchrun']:.1f} | "
            f"{row['ratio']:.2f}× |"
        )
    write_json(args.out, {"benchmark": "startup", "reps": args.reps, "rows": rows})


if __name__ == "__main__":
    main()
