"""The cost of per-rank timing: one all-gather of 11 float64 per rank per step.

2 ranks × 1 thread, the ``small`` GPT data parallel, fp32 (the issue's yardstick: the
gather must cost < 1 % of a ``small`` step). Variants, interleaved (ABBA):

- ``step, timings gathered``: ``Trainer.train_step`` as ``paracube train`` runs it;
- ``step, timings not gathered``: the same step with :func:`paracube.ranktimes.gather`
  replaced by a local stand-in (this rank's vector only). Steps are timed in blocks of
  ``--steps`` back to back between two barriers: the gather makes rank 0 wait for the
  slower rank inside its step, where without it the wait lands in the next step's
  gradient all-reduce — a per-step barrier would count that wait for one variant only;
- ``gather alone`` and torch's ``all_gather_into_tensor`` of the same 11 float64 alone
  (after a barrier): the collective's own cost, paracube's counted path beside torch's.

Also reports the gather's seconds as the ledger counted them inside the real steps.

    python benchmarks/bench_timing_gather.py --out benchmarks/results/timing_gather.json
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist

from common import interleaved, median_ms, parse_and_spawn, write_json
from paracube import ranktimes
from paracube.comm.ledger import CommLedger
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.presets import preset


def worker(rank: int, world: int, args, out: str) -> None:
    cfg = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), build_corpus(None, cfg.model.seq_len))
    gather = ranktimes.gather
    counted: list[float] = []  # the ledger's seconds for the gather inside each real step

    def step_gathered():
        counted.append(trainer.train_step().comm["all_gather/timing"]["seconds"])

    def step_local():
        ranktimes.gather = lambda v, ledger, device=None: {  # type: ignore[assignment]
            name: [x] for name, x in zip(ranktimes.FIELDS, v)
        }
        try:
            trainer.train_step()
        finally:
            ranktimes.gather = gather

    vector = [0.01 * i for i in range(len(ranktimes.FIELDS))]
    ledger = CommLedger()
    mine = torch.tensor(vector, dtype=torch.float64)
    out_buf = torch.empty(world * len(vector), dtype=torch.float64)
    steps = {"step, timings gathered": step_gathered, "step, timings not gathered": step_local}
    alone = {
        "gather alone (paracube)": lambda: gather(vector, ledger),
        "all_gather_into_tensor alone (torch)": lambda: dist.all_gather_into_tensor(out_buf, mine),
    }
    times = interleaved(steps, reps=args.reps, steps=args.steps, blocks=True)
    times.update(interleaved(alone, reps=args.reps, steps=args.steps))
    if rank != 0:
        return
    med = {k: median_ms(v) for k, v in times.items()}
    step = med["step, timings not gathered"]
    payload = {
        "model": args.model,
        "world": world,
        "micro_batch": args.micro_batch,
        "median_ms": {k: round(v, 4) for k, v in med.items()},
        "blocks_of_steps": len(times["step, timings gathered"]),
        "steps_per_block": args.steps,
        "step_ab_difference_share": (med["step, timings gathered"] - step) / step,
        "gather_alone_share": med["gather alone (paracube)"] / step,
        "gather_counted_in_steps_ms": round(1000 * statistics.median(counted), 4),
        "gather_counted_in_steps_share": 1000 * statistics.median(counted) / step,
        "paracube_gather_vs_torch": med["all_gather_into_tensor alone (torch)"]
        / med["gather alone (paracube)"],
    }
    write_json(out, payload)
    print("| variant | median ms |")
    print("|---|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} |")
    print(
        f"gather alone {payload['gather_alone_share']:.3%} of a step; counted inside steps "
        f"{payload['gather_counted_in_steps_ms']:.3f} ms ({payload['gather_counted_in_steps_share']:.3%}); "
        f"A/B step difference {payload['step_ab_difference_share']:+.2%}; "
        f"paracube's gather ÷ torch's: {1 / payload['paracube_gather_vs_torch']:.3f}"
    )


if __name__ == "__main__":
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/timing_gather.json",
        reps=12,
        steps=10,
        micro_batch=8,
    )
