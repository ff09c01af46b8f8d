"""What a layer of the reference GPT weighs when pipeline stages are balanced.

``load(part, layer)`` for :func:`paracube.pipeline.partition.partition`, by the
``--balance`` choice, from the model's arithmetic (:mod:`paracube.models.shapes`):

- ``params``: parameters (the head counted even when tied: its stage holds a copy);
- ``flops``: forward + backward FLOPs per micro-batch;
- ``memory``: fp32 weights, gradients and Adam states (16 bytes per parameter) plus the
  activations the layer keeps per micro-batch times the micro-batches in flight on the
  part's rank at the schedule's peak (1F1B: p − rank; GPipe: m — Narayanan et al. 2021),
  so memory balance moves layers away from the early stages.

``time`` is measured on the ranks instead (:func:`paracube.pipeline.stage.measure_layer_times`);
``speed`` keeps each stage's own measured times and memory (:mod:`paracube.pipeline.speed`).
"""

from __future__ import annotations

from collections.abc import Callable

from paracube.choices import BALANCE
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.pipeline.schedules import get_schedule

ADAM_FP32_BYTES = 16  # fp32 weight, gradient, and Adam's two moments


def gpt_layer_loads(
    cfg: ModelConfig, balance: str, *, micro_batch: int, p: int, schedule: str = "1f1b", m: int = 1
) -> Callable[[int, int], float]:
    if balance not in BALANCE:
        raise ConfigError(f"unknown --balance {balance!r}: choose one of {', '.join(BALANCE)}")
    params = shapes.chain_params(cfg)
    if balance == "params":
        return lambda part, layer: float(params[layer])
    if balance in ("flops", "time", "speed"):  # before they are measured: FLOPs estimate
        flops = shapes.chain_train_flops(cfg, micro_batch)
        return lambda part, layer: float(flops[layer])
    saved = shapes.chain_saved_bytes(cfg, micro_batch)
    sched = get_schedule(schedule)

    def memory(part: int, layer: int) -> float:
        in_flight = sched.in_flight(p, m, stage=part % p)
        return ADAM_FP32_BYTES * params[layer] + saved[layer] * in_flight

    return memory
