"""What one rank of ``paracube train`` does: validate, join the mesh, train, report."""

from __future__ import annotations

import os
import sys
import time

from paracube.config import TrainConfig
from paracube.metrics import MetricsWriter, StepMetrics
from paracube.validate import validate


def train_rank(cfg: TrainConfig, threads: int, timeout_s: float, predict: bool = False) -> None:
    """One rank of a training job: join the job the launcher started and train ``cfg``.

    Run by ``paracube train`` on every rank (locally through the elastic launcher, or as
    a torchrun rank); rank 0 prints and writes the metrics.
    """
    import torch

    from paracube import report
    from paracube.data.corpus import build_corpus
    from paracube.engine import Trainer
    from paracube.launch import launched_world_size
    from paracube.mesh.mesh import ProcessMesh, init_distributed

    torch.set_num_threads(threads)
    validate(cfg, launched_world_size())  # every rank, before any collective
    corpus = build_corpus(cfg.data, cfg.model.seq_len, cfg.val_fraction)
    device = init_distributed(timeout_s)
    mesh = ProcessMesh(cfg.parallel, device, timeout_s)
    trainer = Trainer(cfg, mesh, corpus)
    lead = mesh.global_rank == 0
    writer = MetricsWriter(cfg.metrics if lead else None)
    history: list[StepMetrics] = []
    first_val = trainer.evaluate() if cfg.eval_every else None
    if lead:
        print(report.banner(cfg, trainer, first_val), flush=True)
    bar = report.progress_bar(cfg, lead)
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
        print(report.summary(history, first_val, time.perf_counter() - start), flush=True)
        if predict:
            local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            print(report.prediction(cfg, history, threads, local_ranks), flush=True)


def default_threads(local_ranks: int) -> int:
    """One rank per core: ``cores // local ranks`` threads each, at least 1."""
    return max(1, (os.cpu_count() or 1) // max(1, local_ranks))
