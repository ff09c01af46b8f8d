"""paracube ZeRO-1/2/3 vs torch's ZeroRedundancyOptimizer, FSDP2 and DeepSpeed ZeRO, side by side.

2 ranks × 1 thread, the GPT preset ``small`` (docs/peers.md's model), fp32, AdamW, 8
sequences per rank, gradient clipping and a global-loss all-reduce per step. paracube runs
its engine step (:meth:`paracube.engine.Trainer.train_step`); each peer runs the same work:

- ZeRO-1: torch ``ZeroRedundancyOptimizer`` over DDP (gradients as bucket views), and
  DeepSpeed ``zero_optimization.stage = 1``;
- ZeRO-2: DeepSpeed stage 2;
- ZeRO-3: FSDP2 ``fully_shard`` (each block a unit, resharded after forward; also with
  ``reshard_after_forward=False``, which keeps each unit gathered from its forward to its
  backward) and DeepSpeed stage 3.

DeepSpeed's reduce and all-gather buckets are set to paracube's 25 MiB (its default is
5·10⁸ elements, a 2 GB fp32 buffer that would dominate the memory column).

Model-state bytes per rank are counted the same way for every variant: the storage of
every tensor reachable from the model and the optimizer (parameters, gradients, optimizer
states, flat buffers, partitions, master copies, communication buffers), each storage
once, between steps.

    DS_ACCELERATOR=cpu python benchmarks/bench_zero.py --out benchmarks/results/zero.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from torch import nn

from bench_data_parallel import batch_stream, peer_step
from common import interleaved, median_ms, parse_and_spawn, run_record, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer, build_optimizer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset

PAIRS = {  # paracube stage -> the peers it is compared with
    1: ["torch ZeroRedundancyOptimizer + DDP", "DeepSpeed ZeRO-1"],
    2: ["DeepSpeed ZeRO-2"],
    3: ["FSDP2 fully_shard", "FSDP2 (reshard_after_forward=False)", "DeepSpeed ZeRO-3"],
}
BUCKET_ELEMENTS = int(25 * 2**20 / 4)  # DeepSpeed's buckets at paracube's 25 MiB (fp32)


# -- counting model-state bytes the same way for everyone ---------------------------------


def state_bytes(*roots) -> int:
    """Bytes of every distinct tensor storage reachable from ``roots`` (modules, optimizers,
    engines): parameters and their gradients, optimizer states, flat buffers, partitions."""
    seen_objs: set[int] = set()
    storages: dict[int, int] = {}

    def tensor(t: torch.Tensor) -> None:
        local = getattr(t, "_local_tensor", None)  # DTensor: this rank's shard
        t = local if local is not None else t
        if t.device.type == "meta":
            return
        s = t.untyped_storage()
        if s.nbytes():
            storages[s.data_ptr()] = s.nbytes()

    def walk(obj, depth: int) -> None:
        if depth > 6 or id(obj) in seen_objs:
            return
        seen_objs.add(id(obj))
        if isinstance(obj, torch.Tensor):
            tensor(obj)
            if obj.grad is not None:
                tensor(obj.grad)
            return
        if isinstance(obj, nn.Module):
            for p in obj.parameters():
                walk(p, depth + 1)
            for b in obj.buffers():
                walk(b, depth + 1)
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in (
            "paracube",
            "deepspeed",
            "torch",
        ):
            for v in vars(obj).values():
                walk(v, depth + 1)

    for r in roots:
        walk(r, 0)
    return sum(storages.values())


# -- the peers: the plain training loop of bench_data_parallel.peer_step around each -----------


def zero_redundancy(cfg: TrainConfig, batches):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(cfg.seed)
    model = DDP(GPT(cfg.model), gradient_as_bucket_view=True)
    opt = ZeroRedundancyOptimizer(
        list(model.parameters()),
        optimizer_class=torch.optim.AdamW,
        lr=cfg.lr,
        betas=(0.9, 0.95),
        weight_decay=cfg.weight_decay,
        fused=True,
    )
    return peer_step(model, opt, batches, cfg), (model, opt)


def fsdp2(cfg: TrainConfig, batches, reshard: bool):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    opt = build_optimizer(model, cfg)
    return peer_step(model, opt, batches, cfg), (model, opt)


def deepspeed_zero(cfg: TrainConfig, batches, stage: int):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # adopts the existing process group
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    opt = build_optimizer(model, cfg)
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=opt,
        config={
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            "zero_optimization": {
                "stage": stage,
                "reduce_bucket_size": BUCKET_ELEMENTS,
                "allgather_bucket_size": BUCKET_ELEMENTS,
            },
            "zero_allow_untested_optimizer": True,
        },
    )
    tokens = cfg.global_batch * cfg.model.seq_len

    def step():
        x, y = next(batches)
        loss = lm_loss(engine(x), y, reduction="sum") / tokens
        engine.backward(loss)
        engine.step()
        dist.all_reduce(loss.detach())  # the global loss for the log, as paracube reports

    return step, (engine, engine.optimizer)


# -- the run ---------------------------------------------------------------------------------


def worker(rank: int, world: int, args, out: str) -> None:
    base = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(dp=world),
        micro_batch=args.micro_batch,
        steps=10_000,
        progress=False,
    )
    corpus = build_corpus(None, base.model.seq_len)
    mesh = ProcessMesh(base.parallel)
    variants, holders, skipped = {}, {}, {}
    trainers = {}
    for stage in (0, 1, 2, 3):
        t = Trainer(base.replace(zero=stage), mesh, corpus)
        trainers[stage] = t
        variants[f"paracube ZeRO-{stage}"] = t.train_step
        holders[f"paracube ZeRO-{stage}"] = (t.grad_sync, t.optimizer)
    batches = batch_stream(trainers[0])
    peers = {
        "torch ZeroRedundancyOptimizer + DDP": lambda: zero_redundancy(base, batches),
        "FSDP2 (reshard_after_forward=False)": lambda: fsdp2(base, batches, reshard=False),
        "FSDP2 fully_shard": lambda: fsdp2(base, batches, reshard=True),
    }
    for stage in (1, 2, 3):
        peers[f"DeepSpeed ZeRO-{stage}"] = lambda stage=stage: deepspeed_zero(base, batches, stage)
    for name, make in peers.items():
        try:
            variants[name], holders[name] = make()
        except ImportError as e:
            skipped[name] = f"not installed ({e.name}); see docs/peers.md"
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    states = {name: state_bytes(*objs) for name, objs in holders.items()}
    gathered = [None] * world
    dist.all_gather_object(gathered, states)
    if rank != 0:
        return
    med = {k: median_ms(v) for k, v in times.items()}
    rows = []
    for stage, peer_names in PAIRS.items():
        ours = f"paracube ZeRO-{stage}"
        rows.append(
            {
                "variant": ours,
                "stage": stage,
                "median_ms": round(med[ours], 1),
                "state_mib_per_rank": round(max(g[ours] for g in gathered) / 2**20, 3),
            }
        )
        for peer in peer_names:
            if peer not in med:
                continue
            rows.append(
                {
                    "variant": peer,
                    "stage": stage,
                    "median_ms": round(med[peer], 1),
                    "paracube_speedup": round(med[peer] / med[ours], 3),
                    "state_mib_per_rank": round(max(g[peer] for g in gathered) / 2**20, 3),
                }
            )
    payload = {
        **run_record("zero", args.model, world, args),
        "parameters": sum(p.numel() for p in GPT(base.model).parameters()),
        "paracube_zero0_ms": round(med["paracube ZeRO-0"], 1),
        "rows": rows,
        "skipped": skipped,
    }
    write_json(out, payload)
    print(
        f"\nmodel {args.model} ({payload['parameters']:,} params, fp32 AdamW), {world} ranks × 1 thread, "
        f"batch {args.micro_batch}/rank, {args.reps}×{args.steps} interleaved steps per variant; "
        f"paracube ZeRO-0 {payload['paracube_zero0_ms']} ms\n"
    )
    print(
        "| stage | variant | median ms/step | paracube throughput ÷ peer's | model states MiB/rank |"
    )
    print("|---|---|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['paracube_speedup']:.3f}×" if "paracube_speedup" in r else "—"
        print(
            f"| {r['stage']} | {r['variant']} | {r['median_ms']:.1f} | {ratio} | {r['state_mib_per_rank']:.2f} |"
        )
    for k, why in skipped.items():
        print(f"| | {k} | skipped: {why} | | |")


def main() -> None:
    parse_and_spawn(__doc__, worker, "benchmarks/results/zero.json", reps=6, steps=4, micro_batch=8)


if __name__ == "__main__":
    main()
