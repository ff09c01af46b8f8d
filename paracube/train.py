"""What one rank of ``paracube train`` does: validate, join the mesh, train, report."""

from __future__ import annotations

import os
import sys
import time

from paracube.config import TrainConfig
from paracube.metrics import MetricsWriter, StepMetrics


def validate_job(cfg: TrainConfig, world_size: int):
    """Everything that can be checked before any collective; returns the corpus."""
    from paracube.data.corpus import build_corpus
    from paracube.engine import check_supported

    cfg.parallel.check_world_size(world_size)
    check_supported(cfg)
    return build_corpus(cfg.data, cfg.model.seq_len, cfg.val_fraction)


def train_rank(cfg: TrainConfig, threads: int, timeout_s: float, predict: bool = False) -> None:
    import torch

    from paracube.engine import Trainer
    from paracube.launch import launched_world_size
    from paracube.mesh.mesh import ProcessMesh, init_distributed

    torch.set_num_threads(threads)
    corpus = validate_job(cfg, launched_world_size())  # every rank, before any collective
    device = init_distributed(timeout_s)
    mesh = ProcessMesh(cfg.parallel, device, timeout_s)
    trainer = Trainer(cfg, mesh, corpus)
    lead = mesh.global_rank == 0
    writer = MetricsWriter(cfg.metrics if lead else None)
    history: list[StepMetrics] = []
    first_val = trainer.evaluate() if cfg.eval_every else None
    if lead:
        from paracube.models.shapes import parameter_count

        n_params = parameter_count(cfg.model)
        print(
            f"paracube: {cfg.model.name} ({n_params:,} parameters), {mesh.layout.describe()}, "
            f"global batch {cfg.global_batch} × {cfg.model.seq_len} tokens "
            f"(micro-batch {cfg.micro_batch} × accum {cfg.grad_accum} × dp {cfg.parallel.dp}); "
            f"data: {corpus.describe()}",
            flush=True,
        )
        extras = [f"ZeRO-{cfg.zero}" if cfg.zero else "", cfg.precision if cfg.precision != "fp32" else "",
                  f"{cfg.recompute} recompute" if cfg.recompute != "none" else ""]
        if any(extras):
            print("paracube: " + ", ".join(e for e in extras if e), flush=True)
        if trainer.pipeline is not None:
            print(f"paracube: {trainer.pipeline_description}", flush=True)
        if first_val is not None:
            print(f"paracube: step 0 validation loss {first_val:.4f}", flush=True)
    bar = _progress(cfg, lead)
    start = time.perf_counter()
    for _ in range(cfg.steps):
        m = trainer.train_step()
        if cfg.eval_every and (trainer.step % cfg.eval_every == 0 or trainer.step == cfg.steps):
            m.val_loss = trainer.evaluate()
            if lead:
                line = f"paracube: step {trainer.step} loss {m.loss:.4f}, validation loss {m.val_loss:.4f}"
                bar.write(line, file=sys.stdout) if bar is not None else print(line, flush=True)
        history.append(m)
        writer.write(m)
        if bar is not None:
            bar.set_postfix(loss=f"{m.loss:.4f}", tok_s=f"{m.tokens_per_s:,.0f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()
    writer.close()
    if lead:
        print(summary(history, first_val, time.perf_counter() - start), flush=True)
    if predict and lead:
        print(prediction(cfg, trainer, history, threads), flush=True)


def prediction(cfg: TrainConfig, trainer, history: list[StepMetrics], threads: int) -> str:
    """The planner's predicted step time and model-state memory next to the measured ones."""
    from paracube.planner import calibrate
    from paracube.planner.layout_memory import Layout, stage_memory
    from paracube.planner.time_model import Cluster, estimate

    data = calibrate.load()
    if data is None:
        return "paracube: --predict: no calibration of this machine; run `paracube plan --calibrate` first"
    rank_gpu, link = calibrate.local_hardware(data, threads, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    par = cfg.parallel
    layout = Layout(dp=par.dp, tp=par.tp, pp=par.pp, micro_batch=cfg.micro_batch, microbatches=cfg.grad_accum,
                    schedule=par.schedule, chunks=par.chunks, sequence_parallel=par.sequence_parallel,
                    zero=cfg.zero, recompute=cfg.recompute)
    est = estimate(cfg.model, layout, Cluster(rank_gpu, par.world_size, link, link), precision=cfg.precision)
    steady = sorted(m.step_time for m in history[1:] or history)
    measured = steady[len(steady) // 2]
    predicted_states = stage_memory(cfg.model, layout, cfg.precision)[0].model_states
    mem = history[-1].memory  # counted where all model states coexist (see Trainer._train_step)
    counted = mem["weights"] + mem["gradients"] + mem["optimizer"]
    line = (
        f"paracube: predicted step {est.step_time * 1e3:.1f} ms, measured median {measured * 1e3:.1f} ms "
        f"(predicted/measured {est.step_time / measured:.2f}); model states on rank 0: predicted "
        f"{predicted_states / 2**20:.2f} MiB, counted {counted / 2**20:.2f} MiB"
    )
    if par.tp == 1 and par.pp == 1:  # activations: the op-by-op formula for paracube's model
        from paracube.models.shapes import model_saved_bytes

        elem = {"fp32": 4, "bf16": 2, "fp16": 2}[cfg.precision]
        want = model_saved_bytes(cfg.model, cfg.micro_batch, elem=elem, recompute=cfg.recompute,
                                 recompute_blocks=cfg.recompute_blocks)
        line += (f"; saved activations per micro-batch: predicted {want / 2**20:.2f} MiB, "
                 f"counted peak {history[-1].memory['activations_peak'] / 2**20:.2f} MiB")
    return line


def _progress(cfg: TrainConfig, lead: bool):
    if not (lead and cfg.progress):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5 if sys.stderr.isatty() else 10.0)


def summary(history: list[StepMetrics], first_val: float | None, wall: float) -> str:
    """Closing report: loss and validation loss from first to last, and where time went."""
    steady = history[1:] or history  # step 0 includes one-off warm-up costs
    total = sum(m.step_time for m in steady)
    phases = {k: sum(m.time.get(k, 0.0) for m in steady) for k in steady[0].time}
    split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in phases.items())
    comm = steady[-1].comm
    grad_bytes = sum(comm.get(k, {"bytes": 0})["bytes"] for k in ("all_reduce/grad", "reduce_scatter/grad"))
    vals = [m.val_loss for m in history if m.val_loss is not None]
    lines = [
        f"paracube: {len(history)} steps in {wall:.1f}s; loss {history[0].loss:.4f} → {history[-1].loss:.4f}",
        f"paracube: median {sorted(m.tokens_per_s for m in steady)[len(steady) // 2]:,.0f} tokens/s; "
        f"time split: {split}; gradient reduction {grad_bytes / 2**20:.2f} MiB/step",
    ]
    if history[-1].loss_scale is not None:
        skipped = sum(1 for m in history if m.skipped)
        lines.append(f"paracube: fp16 loss scale {history[-1].loss_scale:g}; {skipped} step(s) skipped on overflow")
    mem = steady[-1].memory
    if mem:
        mib = {k: v / 2**20 for k, v in mem.items()}
        lines.append(
            f"paracube: memory per rank (rank 0): weights {mib['weights']:.2f} MiB, gradients {mib['gradients']:.2f} MiB, "
            f"optimizer {mib['optimizer']:.2f} MiB, saved activations peak {mib['activations_peak']:.2f} MiB"
            + (f", gathered parameters peak {mib['params_peak']:.2f} MiB" if "params_peak" in mib else "")
        )
    if vals:
        start = f"{first_val:.4f} → " if first_val is not None else ""
        lines.insert(1, f"paracube: validation loss {start}{vals[-1]:.4f}")
    return "\n".join(lines)


def default_threads(local_ranks: int) -> int:
    """One rank per core: ``cores // local ranks`` threads each, at least 1."""
    return max(1, (os.cpu_count() or 1) // max(1, local_ranks))
