"""What one rank of ``paracube train`` does: validate, join the mesh, train, report."""

from __future__ import annotations

import os
import sys
import time

from paracube import inject
from paracube.config import TrainConfig
from paracube.divergence import check_step
from paracube.metrics import StepMetrics
from paracube.options import RunOptions
from paracube.outputs import MetricsWriter
from paracube.validate import validate


def train_rank(cfg: TrainConfig, run: RunOptions) -> None:
    """One rank of a training job: join the job the launcher started and train ``cfg``.

    Run by ``paracube train`` on every rank (locally through the elastic launcher, or as
    a torchrun rank); rank 0 prints and writes the metrics. Raises a
    :class:`~paracube.errors.ParacubeError` for a refused job (exit 2), a diverged run
    (exit 3), a failed collective or an unwritable record (exit 1).
    """
    import torch
    import torch.distributed as dist

    from paracube.data.corpus import build_corpus
    from paracube.engine import Trainer
    from paracube.failures import name_failures
    from paracube.heartbeat import Heartbeat
    from paracube.launch import launched_world_size
    from paracube.mesh.layout import MeshLayout
    from paracube.mesh.mesh import ProcessMesh, init_distributed

    threads = run.threads or default_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(threads)
    cfg = after_restart(cfg, run)
    validate(cfg, launched_world_size(), run=run)  # every rank, before any collective
    corpus = build_corpus(cfg.data, cfg.model.seq_len, cfg.val_fraction)
    device = init_distributed(run.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    inject.activate(run.inject, rank)
    heartbeat = Heartbeat(dist.distributed_c10d._get_default_store(), rank, world)
    try:
        where = MeshLayout(pp=cfg.parallel.pp, dp=cfg.parallel.dp, tp=cfg.parallel.tp).where
        with name_failures(rank, where, 0, "start-up", heartbeat):
            mesh = ProcessMesh(cfg.parallel, device, run.timeout_s)
            trainer = Trainer(cfg, mesh, corpus)
        trainer.heartbeat = heartbeat
        if cfg.checkpoint.resume is not None:
            _resume(trainer, cfg)
        elif cfg.checkpoint.init_from is not None:
            from paracube.checkpoint.export import init_from, read_exported

            init_from(trainer, read_exported(cfg.checkpoint.init_from)[1])
        _train(trainer, cfg, run, threads)
    finally:
        heartbeat.close()


def restart_count() -> int:
    """How often the launcher has restarted this job's ranks (torch's elastic agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def after_restart(cfg: TrainConfig, run: RunOptions) -> TrainConfig:
    """A restarted job resumes from the newest complete checkpoint of its --save-dir (if
    any) and appends to its metrics; the first attempt runs as asked."""
    restart = restart_count()
    if not restart or cfg.checkpoint.save_dir is None:
        return cfg
    from dataclasses import replace

    from paracube.checkpoint.store import complete_checkpoints

    found = complete_checkpoints(cfg.checkpoint.save_dir)
    if os.environ.get("RANK", "0") == "0":
        where = f"resuming from {found[-1]}" if found else "no checkpoint yet: starting over"
        print(f"paracube: restart {restart} of {run.max_restarts}: {where}", flush=True)
    checkpoint = replace(cfg.checkpoint, resume=str(found[-1]) if found else None, init_from=None)
    if not found:
        checkpoint = replace(checkpoint, init_from=cfg.checkpoint.init_from)
    return cfg.replace(checkpoint=checkpoint, metrics_mode="append")


def _resume(trainer, cfg: TrainConfig) -> None:
    from paracube.checkpoint.store import load, resolve

    path = resolve(cfg.checkpoint.resume, cfg.checkpoint.save_dir)  # type: ignore[arg-type]
    meta = load(trainer, path)
    if trainer.mesh.global_rank == 0:
        streams = "" if meta["rng_restored"] else " (another layout: random streams seeded afresh)"
        print(f"paracube: resumed from {path} at step {meta['step']}{streams}", flush=True)


def _save_due(trainer, cfg: TrainConfig) -> bool:
    ck = cfg.checkpoint
    every = ck.every is not None and trainer.step % ck.every == 0
    return ck.save_dir is not None and (trainer.step == cfg.steps or every)


def _save(trainer, cfg: TrainConfig, saver) -> None:
    from paracube.checkpoint.store import save

    if trainer.heartbeat is not None:
        trainer.heartbeat.at(trainer.step, "checkpoint save")
    root, keep = cfg.checkpoint.save_dir or "", cfg.checkpoint.keep_last
    with trainer.naming_failures("checkpoint save"):
        if saver is None:
            save(trainer, root, keep)
        else:
            saver.save(trainer, root, keep)


def _train(trainer, cfg: TrainConfig, run: RunOptions, threads: int) -> None:
    from paracube import report
    from paracube.profiling import StepProfiler
    from paracube.ranktimes import StragglerWatch

    lead = trainer.mesh.global_rank == 0
    header = _run_header(trainer, cfg, run, threads)
    watch = StragglerWatch(header["peers"], header["where"], cfg.straggler_threshold)
    writer = MetricsWriter(cfg.metrics if lead else None, cfg.metrics_mode)
    history: list[StepMetrics] = []
    bar = None
    saver = None
    if cfg.checkpoint.async_save and cfg.checkpoint.save_dir is not None:
        from paracube.checkpoint.store import AsyncSaver

        saver = AsyncSaver()
    try:
        first_val = trainer.evaluate() if cfg.eval_every else None
        if lead:
            print(report.banner(cfg, trainer, first_val), flush=True)
        bar = report.progress_bar(cfg, lead, trainer.step)
        start = time.perf_counter()
        profiler = StepProfiler(run.profile, run.profile_dir, trainer.mesh.global_rank)
        while not trainer.finished:
            with profiler.around(trainer.step):
                m = trainer.train_step()
            # under --dp-mode ps the workers' steps are not aligned: evaluated at the end only
            aligned = trainer.ps_worker is None and trainer.step % (cfg.eval_every or 1) == 0
            if cfg.eval_every and (aligned or trainer.finished):
                m.val_loss = trainer.evaluate()
                if lead:
                    line = f"paracube: step {trainer.step} loss {m.loss:.4f}, validation loss {m.val_loss:.4f}"
                    bar.write(line, file=sys.stdout) if bar is not None else print(line, flush=True)
            if not history:
                m.run = header
            if trainer.finished:  # the last step: its phases on every rank, once
                m.timeline = {"step": m.step, "spans": _gather_objects(trainer.last_spans)}
                m.ps_staleness = trainer.staleness_distribution()
            for s in watch.update(m.step, m.ranks) if m.ranks else []:  # none under ps
                if lead:
                    line = f"paracube: straggler: {s.line()}"
                    bar.write(line, file=sys.stdout) if bar is not None else print(line, flush=True)
            if watch.active:
                m.stragglers = [{**vars(s), "line": s.line()} for s in watch.active.values()]
            if m.dp_split_changed and lead:
                line = (
                    f"paracube: --dp-balance auto: from step {m.step + 1} the data-parallel ranks "
                    f"take {trainer.batches.split.describe()} of each global batch "
                    f"(was {' / '.join(map(str, m.dp_split or []))})"
                )
                bar.write(line, file=sys.stdout) if bar is not None else print(line, flush=True)
            history.append(m)
            writer.write_line(m.to_json(), m.step)
            check_step(m, cfg, trainer.scaler)  # every rank: the values are global
            if _save_due(trainer, cfg):
                _save(trainer, cfg, saver)
            if bar is not None:
                bar.set_postfix(loss=f"{m.loss:.4f}", tok_s=f"{m.tokens_per_s:,.0f}", refresh=False)
                bar.update(1)
        trainer.drain()
        if saver is not None:
            with trainer.naming_failures("checkpoint save"):
                saver.wait()  # the last checkpoint in flight is committed before the end
    finally:
        if bar is not None:
            bar.close()
        writer.close()
        trainer.batches.close()
    if lead:
        print(report.summary(history, first_val, time.perf_counter() - start), flush=True)
        if history[-1].ps_staleness:
            print(report.staleness(history[-1].ps_staleness), flush=True)
        for s in watch.seen:
            print(f"paracube: straggler: {s.line()}", flush=True)
        if run.predict:
            local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            import torch

            on_gpu = trainer.mesh.device.type == "cuda"
            device_name = torch.cuda.get_device_name(trainer.mesh.device) if on_gpu else None
            print(report.prediction(cfg, history, threads, local_ranks, device_name), flush=True)


def _run_header(trainer, cfg: TrainConfig, run: RunOptions, threads: int) -> dict:
    """What ran, for ``paracube diagnose``: the model, the layout, every rank's place."""
    import socket
    from dataclasses import asdict

    from paracube.planner.layout import Layout

    layout = trainer.mesh.layout
    world = layout.world_size
    hosts = _gather_objects(socket.gethostname())
    coords = [layout.coords(r) for r in range(world)]
    peers: dict[int, list[int]] = {}
    for r, c in enumerate(coords):
        peers.setdefault(c["pp"], []).append(r)  # the ranks of one stage do the same work
    return {
        "model": asdict(cfg.model),
        "layout": {"pp": cfg.parallel.pp, "dp": cfg.parallel.dp, "tp": cfg.parallel.tp},
        # what the planner needs to predict this run (diagnose sets it beside the measured)
        "planner_layout": asdict(Layout.from_config(cfg)),
        "precision": cfg.precision,
        "local_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "micro_batch": cfg.micro_batch,
        "grad_accum": cfg.grad_accum,
        "global_batch": cfg.global_batch,
        "zero": cfg.zero,
        "threads": threads,
        "straggler_threshold": cfg.straggler_threshold,
        "data_workers": cfg.data_workers,
        "prefetch": cfg.prefetch,
        "inject": run.inject.describe(),
        "coords": coords,
        "hosts": hosts,
        "where": [f"{layout.where(r)}, host {hosts[r]}" for r in range(world)],
        "peers": list(peers.values()),
    }


def _gather_objects(obj) -> list:
    """``obj`` from every rank (a one-off: the run's header, the last step's timeline)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def default_threads(local_ranks: int) -> int:
    """One rank per core: ``cores // local ranks`` threads each, at least 1."""
    from paracube.resources import usable_cores

    return max(1, usable_cores() // max(1, local_ranks))
