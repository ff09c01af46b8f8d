"""Turning a (tensor-parallel) model into this rank's pipeline chunks and its schedule."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from paracube.choices import MEASURED_BALANCE
from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.config import TrainConfig
from paracube.models.spec import ModelSpec
from paracube.pipeline.balance import gpt_layer_loads
from paracube.pipeline.partition import describe_split, partition
from paracube.pipeline.schedules import Action, get_schedule
from paracube.pipeline.speed import measured_speed_split
from paracube.pipeline.stage import PipelineChunk, measure_layer_times, split_chain
from paracube.pipeline.zero_bubble import make_deferrable
from paracube.weight_grad import WeightGradStore


@dataclass
class PipelinePlan:
    chunks: list[PipelineChunk]
    actions: list[Action]
    store: WeightGradStore | None
    description: str  # the split and each stage's estimated load


def build_pipeline(
    spec: ModelSpec,
    cfg: TrainConfig,
    pp_rank: int,
    sample: torch.Tensor | None = None,
    ledger: CommLedger | None = None,
    device: torch.device | None = None,
) -> PipelinePlan:
    """Split the model's chain of layers into ``pp × chunks`` stages and keep this rank's.

    With ``balance="time"`` every rank measures each layer on ``sample`` and the slowest
    measurement wins (all-reduce MAX), so all ranks agree on one split; ``"speed"`` keeps
    each stage's own times and memory (:mod:`paracube.pipeline.speed`).
    """
    par = cfg.parallel
    p, v, m = par.pp, par.chunks, cfg.grad_accum
    names, layers = spec.chain_names, spec.chain
    unit = _per_micro_batch if par.balance in MEASURED_BALANCE else _load
    if par.balance == "speed":
        assert sample is not None, "the speed balance times the layers on a sample micro-batch"
        here = device or torch.device("cpu")
        bounds, load = measured_speed_split(layers, sample, cfg, pp_rank, here, ledger)
    else:
        if par.balance == "time":
            assert sample is not None, "the time balance times the layers on a sample micro-batch"
            times = torch.tensor(measure_layer_times(layers, sample), dtype=torch.float64)
            ops.all_reduce(times, None, ledger, tag="balance", op=dist.ReduceOp.MAX)
            load = lambda part, layer: float(times[layer])  # noqa: E731
        else:
            load = gpt_layer_loads(
                cfg.model, par.balance, micro_batch=cfg.micro_batch, p=p, schedule=par.schedule,
                m=m,
            )  # fmt: skip
        bounds = partition(len(layers), p * v, load)
    chunks = split_chain(layers, names, bounds, p, pp_rank)
    store = None
    schedule = get_schedule(par.schedule)
    if schedule.splits_backward:
        store = WeightGradStore()
        for chunk in chunks:
            make_deferrable(chunk, store)
    actions = schedule.build(p, m, v)[pp_rank]
    text = (
        f"pipeline split by {par.balance} ({par.schedule}, {m} micro-batches):\n"
        + describe_split(names, bounds, load, p, unit)
    )
    return PipelinePlan(chunks, actions, store, text)


def _per_micro_batch(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f} ms per micro-batch (forward + backward, measured)"


def _load(x: float) -> str:
    return f"load {x:,.3g}"
