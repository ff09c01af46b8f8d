"""The planner's prediction for the run's own layout on this machine, beside the measured
step: the same time model ``paracube plan`` ranks layouts with, fed the calibration
``paracube calibrate`` wrote. Without a calibration there is no prediction (the report
says how to get one)."""

from __future__ import annotations

from dataclasses import replace

NEEDED = ("model", "planner_layout", "threads", "precision")


def planner_prediction(header: dict) -> dict | None:
    """``{"step_time", "tokens_per_s", "one_rank_step_time", "speedup"}`` predicted for
    the run's layout, or None when the run's header or this machine's calibration is
    missing.

    The speed-up is the layout's predicted tokens/s over that of one rank doing the same
    global batch (its m micro-batches × dp, accumulated) — the figure the measured
    speed-up stands beside."""
    if any(k not in header for k in NEEDED):
        return None
    from paracube.config import ModelConfig
    from paracube.planner import local
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import Cluster, estimate

    data = local.load()
    if data is None:
        return None
    fields = ModelConfig.__dataclass_fields__
    model = ModelConfig(**{k: v for k, v in header["model"].items() if k in fields})
    layout = Layout(**header["planner_layout"])
    one_rank = replace(
        layout, dp=1, tp=1, pp=1, chunks=1, zero=0, sequence_parallel=False,
        microbatches=layout.microbatches * layout.dp,
    )  # fmt: skip
    rank_gpu, link = local.local_hardware(data, header["threads"], header.get("local_ranks", 1))
    precision = header["precision"]
    est = estimate(model, layout, Cluster(rank_gpu, layout.gpus, link, link), precision)
    alone = estimate(model, one_rank, Cluster(rank_gpu, 1, link, link), precision)
    return {
        "step_time": est.step_time,
        "tokens_per_s": est.tokens_per_s,
        "one_rank_step_time": alone.step_time,
        "speedup": est.tokens_per_s / alone.tokens_per_s,
    }
