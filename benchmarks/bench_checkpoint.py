"""Checkpoint save and load: paracube vs torch.save and vs DCP on an FSDP2 model.

2 ranks × 1 thread, a GPT wider and deeper than ``small`` (hidden 512, 8 layers: ~29 M
parameters, ~350 MB of fp32 weights and Adam moments), data parallel, fp32 AdamW after
one step (so the optimizer holds its moments). Variants, interleaved:

- paracube ZeRO-0 and ZeRO-1: ``paracube.checkpoint.store.save`` / ``load`` (every rank
  writes its pieces under serial names; ZeRO-1's ranks write half each);
- ``torch.save`` of the consolidated model and optimizer ``state_dict`` by rank 0, and
  ``torch.load(weights_only=True)`` on every rank (what a script without distributed
  checkpointing does);
- DCP directly on an FSDP2 (``fully_shard``) model of the same size, through
  ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``.

Reports seconds and GB/s (the checkpoint's bytes on disk ÷ seconds) per operation.

    python benchmarks/bench_checkpoint.py --out benchmarks/results/checkpoint.json
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist

from common import median_ms, parse_and_spawn, write_json
from paracube.checkpoint.store import load, save
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset


def folder_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def paracube_variant(cfg, corpus, root):
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), corpus)
    trainer.train_step()
    fresh = Trainer(cfg, ProcessMesh(cfg.parallel), corpus)
    target = {}

    def do_save():
        target["path"] = save(trainer, root)

    return do_save, lambda: load(fresh, target["path"]), lambda: str(target["path"])


def torch_save_variant(cfg, root, rank):
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, 256, (2, cfg.model.seq_len))
    lm_loss(model(x), x).backward()
    opt.step()
    path = os.path.join(root, "consolidated.pt")

    def do_save():
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)

    def do_load():
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    return do_save, do_load, lambda: path


def fsdp_variant(cfg, root):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = GPT(cfg.model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, cfg.model.seq_len))
    lm_loss(model(x), x).backward()
    opt.step()
    path = os.path.join(root, "fsdp2")

    def do_save():
        m, o = get_state_dict(model, opt)
        dcp.save({"model": m, "optim": o}, checkpoint_id=path)

    def do_load():
        m, o = get_state_dict(model, opt)
        state = {"model": m, "optim": o}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    return do_save, do_load, lambda: path


def visible_cost(cfg, corpus, root, reps: int, after: int = 2) -> dict[str, float]:
    """Seconds a save adds to training: (save + ``after`` steps [+ wait]) − (``after``
    steps), medians."""
    from paracube.checkpoint.store import AsyncSaver

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), corpus)
    trainer.train_step()
    saver = AsyncSaver()

    def steps():
        for _ in range(after):
            trainer.train_step()

    def sync():
        save(trainer, root)
        steps()

    def background():
        saver.save(trainer, root)
        steps()
        saver.wait()

    times: dict[str, list[float]] = {"steps": [], "sync": [], "async": []}
    for _ in range(reps):
        for name, fn in (("steps", steps), ("sync", sync), ("async", background)):
            times[name].append(timed(fn))
    base = median_ms(times["steps"])
    return {
        "steps_ms": round(base, 1),
        "steps": after,
        "sync_save_cost_ms": round(median_ms(times["sync"]) - base, 1),
        "async_save_cost_ms": round(median_ms(times["async"]) - base, 1),
    }


def worker(rank: int, world: int, args, out: str) -> None:
    model = preset("small", hidden=args.hidden, n_layers=args.layers, n_heads=8)
    base = TrainConfig(
        model=model, parallel=ParallelConfig(dp=world), micro_batch=2, progress=False
    )
    corpus = build_corpus(None, model.seq_len)
    root = tempfile.mkdtemp(prefix="bench-ckpt-") if rank == 0 else None
    shared = [root]
    dist.broadcast_object_list(shared)
    root = shared[0]
    variants = {
        "paracube ZeRO-0": paracube_variant(base, corpus, os.path.join(root, "z0")),
        "paracube ZeRO-1": paracube_variant(base.replace(zero=1), corpus, os.path.join(root, "z1")),
        "torch.save (rank 0, consolidated)": torch_save_variant(base, root, rank),
        "DCP on FSDP2": fsdp_variant(base, root),
    }
    times = {name: {"save": [], "load": []} for name in variants}
    for rep in range(args.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            do_save, do_load, _ = variants[name]
            times[name]["save"].append(timed(do_save))
            times[name]["load"].append(timed(do_load))
    cost = visible_cost(
        base.replace(zero=1), corpus, os.path.join(root, "cost"), args.reps, args.cost_steps
    )
    if rank == 0:
        rows = []
        for name, (_, _, where) in variants.items():
            size = folder_bytes(where()) if os.path.isdir(where()) else os.path.getsize(where())
            row = {"variant": name, "bytes": size}
            for op in ("save", "load"):
                ms = median_ms(times[name][op])
                row[f"{op}_ms"] = round(ms, 1)
                row[f"{op}_gb_per_s"] = round(size / 1e9 / (ms / 1000), 3)
            rows.append(row)
        params = sum(p.numel() for p in GPT(model).parameters())
        write_json(out, {"benchmark": "checkpoint", "parameters": params, "world": world,
                         "reps": args.reps, "torch": torch.__version__, "rows": rows,
                         "visible_cost": cost})  # fmt: skip
        print(f"\nGPT hidden {args.hidden}, {args.layers} layers ({params:,} params), fp32 AdamW, "
              f"{world} ranks × 1 thread, {args.reps} interleaved repetitions\n")  # fmt: skip
        print("| variant | checkpoint MB | save ms | save GB/s | load ms | load GB/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['variant']} | {r['bytes'] / 1e6:.0f} | {r['save_ms']:.0f} | "
                  f"{r['save_gb_per_s']:.2f} | {r['load_ms']:.0f} | {r['load_gb_per_s']:.2f} |")  # fmt: skip
        print(f"\nZeRO-1, one save and the next {args.cost_steps} steps ({cost['steps_ms']:.0f} ms without a "
              f"save): synchronous save +{cost['sync_save_cost_ms']:.0f} ms, --async-save "
              f"+{cost['async_save_cost_ms']:.0f} ms")  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parse_and_spawn(
        __doc__,
        worker,
        "benchmarks/results/checkpoint.json",
        reps=4,
        steps=1,
        hidden=512,
        layers=8,
        world=2,
        cost_steps=2,
    )


if __name__ == "__main__":
    main()
