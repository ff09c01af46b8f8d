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
    here = Cluster(rank_gpu, layout.gpus, link, link)
    est = estimate(model, layout, here, precision)
    alone = estimate(model, one_rank, Cluster(rank_gpu, 1, link, link), precision)
    return {
        "step_time": est.step_time,
        "tokens_per_s": est.tokens_per_s,
        "one_rank_step_time": alone.step_time,
        "speedup": est.tokens_per_s / alone.tokens_per_s,
        "better": _better_layout(model, layout, here, est.step_time, header, precision),
    }


BETTER = 0.90  # a layout is offered when predicted at least 10 % faster than the run's


def _better_layout(model, layout, cluster, step_time: float, header: dict, precision: str):
    """The planner's fastest layout for the same model, ranks and global batch, with the
    command that runs it — None unless it is predicted ≥ 10 % faster than the run's."""
    from paracube.planner.report import describe
    from paracube.planner.search import search

    batch = layout.dp * layout.micro_batch * layout.microbatches
    found = search(model, cluster, layout.gpus, batch, precision=precision, top=1).ranked
    if not found or found[0].time.step_time > BETTER * step_time:
        return None
    best = found[0]
    name = header["model"].get("name", "custom")
    return {
        "layout": describe(best.layout),
        "step_time": best.time.step_time,
        "command": " ".join(["paracube train --model", name, *best.layout.to_args(precision)]),
    }
