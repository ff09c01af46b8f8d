"""paracube pipeline parallel vs torch.distributed.pipelining, side by side, 2 ranks × 1 thread.

pp=2, GPT preset ``small`` (4 layers, hidden 256, seq 128), 4 micro-batches of 4
sequences per step, fused AdamW, gradient clipping over both stages. The model is split
the same way for both (paracube's partition by parameters; for the interleaved schedules
into 2 chunks per rank), and each schedule runs in both libraries: paracube's engine step
(``Trainer.train_step``) against ``PipelineStage`` + ``ScheduleGPipe`` /
``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` with the same loss, and against DeepSpeed's
``PipelineEngine`` (its 1F1B-style schedule; compared with paracube's 1F1B) when installed.
paracube's zero-bubble H1 is timed too (torch has no ZB-H1 for one chunk per rank).

    python benchmarks/bench_pipeline.py --out benchmarks/results/pipeline.json
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist

from common import interleaved, parse_and_spawn, print_table, ratio_rows, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer, make_adamw
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset
from paracube.models.shapes import chain_names
from paracube.pipeline.balance import gpt_layer_loads
from paracube.pipeline.partition import partition
from paracube.pipeline.stage import split_chain

TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
}


def torch_pipelining_step(cfg: TrainConfig, schedule: str, chunks: int, trainer: Trainer):
    import torch.distributed.pipelining as P

    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    names, layers = chain_names(cfg.model), model.layers()
    load = gpt_layer_loads(cfg.model, "params", micro_batch=cfg.micro_batch, p=p, m=cfg.grad_accum)
    mine = split_chain(layers, names, partition(len(layers), p * chunks, load), p, rank)
    tokens_global = cfg.global_batch * cfg.model.seq_len
    stages = [P.PipelineStage(c, c.stage, p * chunks, torch.device("cpu")) for c in mine]
    loss_fn = lambda logits, y: lm_loss(logits, y, reduction="sum") / tokens_global  # noqa: E731
    kind = getattr(P, TORCH_SCHEDULES[schedule])
    sched = kind(
        stages if chunks > 1 else stages[0], cfg.grad_accum, loss_fn=loss_fn, scale_grads=False
    )
    params = [q for c in mine for q in c.parameters()]
    opt = make_adamw([q for q in params if q.dim() >= 2], [q for q in params if q.dim() < 2], cfg)
    step_no = [0]

    def step():
        batches = [trainer.batches.micro_batch(step_no[0], k) for k in range(cfg.grad_accum)]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        opt.zero_grad(set_to_none=True)
        losses = []
        has_first, has_last = (
            any(c.stage == 0 for c in mine),
            any(c.stage == p * chunks - 1 for c in mine),
        )
        if has_first and has_last:
            sched.step(x, target=y, losses=losses)
        elif has_first:
            sched.step(x)
        else:
            sched.step(target=y, losses=losses)
        sq = torch.stack([q.grad.norm() ** 2 for q in params if q.grad is not None]).sum()
        dist.all_reduce(sq)
        norm = float(sq.sqrt())
        if norm > cfg.grad_clip:
            torch._foreach_mul_(
                [q.grad for q in params if q.grad is not None], cfg.grad_clip / (norm + 1e-6)
            )
        opt.step()
        loss = torch.stack(losses).sum() if losses else torch.zeros(())
        dist.all_reduce(loss)  # the step's loss on every rank, as paracube reports it
        step_no[0] += 1

    return step


def deepspeed_step(cfg: TrainConfig, trainer: Trainer):
    """DeepSpeed's PipelineEngine (its own 1F1B-style TrainSchedule) on the same layers,
    split by parameters, with the same fused AdamW and clipping (docs/peers.md: DS_ACCELERATOR=cpu)."""
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed(dist_backend="gloo")  # adopts the existing process group
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    tokens_global = cfg.global_batch * cfg.model.seq_len
    net = PipelineModule(
        layers=model.layers(),
        num_stages=dist.get_world_size(),
        partition_method="parameters",
        loss_fn=lambda logits, y: lm_loss(logits, y, reduction="sum") / tokens_global,
    )
    params = [q for q in net.parameters()]
    opt = make_adamw([q for q in params if q.dim() >= 2], [q for q in params if q.dim() < 2], cfg)
    engine, *_ = deepspeed.initialize(
        model=net,
        optimizer=opt,
        config={
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": cfg.grad_clip,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        },
    )
    step_no = [0]

    def step():
        batches = iter([trainer.batches.micro_batch(step_no[0], k) for k in range(cfg.grad_accum)])
        engine.train_batch(data_iter=batches)
        step_no[0] += 1

    return step


def worker(rank: int, world: int, args, out: str) -> None:
    corpus = build_corpus(None, preset(args.model).seq_len)
    variants = {}

    def config(schedule: str, chunks: int) -> TrainConfig:
        return TrainConfig(
            model=preset(args.model),
            parallel=ParallelConfig(pp=world, schedule=schedule, chunks=chunks),
            micro_batch=args.micro_batch,
            grad_accum=args.microbatches,
            steps=10_000,
            progress=False,
        )

    for schedule, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)):
        cfg = config(schedule, chunks)
        ours = Trainer(cfg, ProcessMesh(cfg.parallel), corpus)
        variants[f"paracube {schedule}"] = ours.train_step
        variants[f"torch.pipelining {schedule}"] = torch_pipelining_step(
            cfg, schedule, chunks, ours
        )
    zb = config("zb-h1", 1)
    variants["paracube zb-h1"] = Trainer(zb, ProcessMesh(zb.parallel), corpus).train_step
    skipped = {}
    try:
        one = config("1f1b", 1)
        variants["DeepSpeed PipelineEngine"] = deepspeed_step(
            one, Trainer(one, ProcessMesh(one.parallel), corpus)
        )
    except ImportError as e:
        skipped["DeepSpeed PipelineEngine"] = f"not installed ({e.name}); see docs/peers.md"
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    rows = []
    for schedule in ("gpipe", "1f1b", "interleaved-1f1b"):
        pair = ratio_rows(
            {k: times[k] for k in (f"paracube {schedule}", f"torch.pipelining {schedule}")},
            base=f"paracube {schedule}",
        )
        rows += pair
    if "DeepSpeed PipelineEngine" in times:
        rows += ratio_rows(
            {k: times[k] for k in ("paracube 1f1b", "DeepSpeed PipelineEngine")},
            base="paracube 1f1b",
        )[1:]
    rows += ratio_rows({"paracube zb-h1": times["paracube zb-h1"]}, base="paracube zb-h1")
    payload = {
        "benchmark": "pipeline",
        "model": args.model,
        "pp": world,
        "threads_per_rank": 1,
        "micro_batch": args.micro_batch,
        "microbatches": args.microbatches,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": rows,
        "skipped": skipped,
    }
    write_json(out, payload)
    print(
        f"\nmodel {args.model}, pp={world}, 2 ranks × 1 thread, {args.microbatches} micro-batches × "
        f"{args.micro_batch} sequences, {args.reps}×{args.steps} interleaved steps per variant"
    )
    print(
        "(each paracube row is 1.000×; the torch row below it is paracube's throughput ÷ torch's)\n"
    )
    print_table(rows, skipped)


def main() -> None:
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/pipeline.json",
        reps=4,
        steps=4,
        micro_batch=4,
        microbatches=4,
    )


if __name__ == "__main__":
    main()
