"""Models that are not transformers, described by three numbers — data parallel only.

A :class:`GenericModel` gives parameters, forward FLOPs per sample and activation bytes
saved per sample; the planner can then size memory and step time for data parallelism
and ZeRO (tensor and pipeline splits need a layer structure it does not have).

ResNet-50 (He et al. 2016, Table 1), derived here from its architecture:
- parameters 25,557,032 (the reference implementation's count);
- forward 4.09 G multiply-adds per 224×224 image = 8.2 GFLOPs;
- activations: every convolution's output is kept for backward three times (conv output
  = batch-norm input, batch-norm output = ReLU input, ReLU output), summed over the
  stem and the 16 bottleneck blocks below, 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from paracube.choices import state_bytes_per_parameter
from paracube.errors import ConfigError
from paracube.planner.dp_comm import dp_exposed_time
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import CONTEXT_BYTES, FRAGMENTATION, StageMemory
from paracube.planner.memory import model_state_bytes
from paracube.planner.time_model import (
    Cluster,
    StepEstimate,
    accumulation_time,
    at_precision,
    gather_copy_time,
    optimizer_time,
)


@dataclass(frozen=True)
class GenericModel:
    name: str
    params: float
    forward_flops_per_sample: float
    activation_values_per_sample: float  # saved for backward
    dataset_samples: int = 0  # one epoch of the dataset it is trained on (0: unknown)


def _resnet50_activation_values() -> float:
    side, values = 112, 112 * 112 * 64 * 3  # stem: 7×7 conv to 112² × 64
    side = 56  # max-pool
    for blocks, width, stride_first in ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)):
        for i in range(blocks):
            if i == 0 and stride_first == 2:
                side //= 2
            values += 3 * side * side * (width + width + 4 * width)  # 1×1, 3×3, 1×1 (×4) convs
        values += 3 * side * side * 4 * width  # the projection shortcut of the first block
    return float(values)


GENERIC: dict[str, GenericModel] = {
    # ImageNet-1k's training set: 1,281,167 images (Russakovsky et al. 2015)
    "resnet50": GenericModel(
        "resnet50", 25_557_032, 2 * 4.09e9, _resnet50_activation_values(), 1_281_167
    ),
}


def generic(name: str) -> GenericModel | None:
    return GENERIC.get(name.lower())


def evaluate(
    model: GenericModel, layout: Layout, cluster: Cluster, precision: str = "bf16"
) -> tuple[StageMemory, StepEstimate]:
    if layout.tp != 1 or layout.pp != 1:
        raise ConfigError(
            f"{model.name} is described without layers: data parallel only (tp = pp = 1)"
        )
    cluster = at_precision(cluster, precision)  # fp32: the CUDA cores' rate, not the tensor cores'
    g, dp, b, m = cluster.gpu, layout.dp, layout.micro_batch, layout.microbatches
    w, gr, o = state_bytes_per_parameter(
        precision, layout.grad_reduce, layout.master_weights, layout.moments
    )
    states = model_state_bytes(
        model.params, layout.zero, dp, weight_bytes=w, grad_bytes=gr, optimizer_bytes=o
    ).total
    acts = model.activation_values_per_sample * w * b
    memory = StageMemory("all", states, acts, CONTEXT_BYTES + FRAGMENTATION * (states + acts))
    # compute: all FLOPs at the sustained tensor-core rate, plus the element-wise passes
    # (batch-norm, ReLU) reading and writing the saved activations, forward and backward
    flops = 3 * model.forward_flops_per_sample * b
    per_mb = flops / (g.peak_flops * g.sustained_fraction) + 3 * 2 * acts / g.memory_rate
    # the data-parallel collectives as a transformer's are charged (one owner: the reduction
    # less what hides behind the last backward, its last bucket, ZeRO-1/2's all-gather of the
    # updated parameters after the step, ZeRO-3's gathers for every micro-batch), the
    # parameters taken as one unit: the model is described without layers
    exposed = dp_exposed_time(layout, cluster, model.params, per_mb, None, 0, w)
    optimizer = optimizer_time(layout, g, model.params, w)
    # each micro-batch's gradients brought into the buffer they are reduced from
    compute = m * (per_mb + gather_copy_time(layout, g, model.params, 0.0, w)) + accumulation_time(
        layout, g, model.params, 0.0, w
    )
    step = compute + exposed + optimizer
    samples = dp * b * m
    tflops = 3 * model.forward_flops_per_sample * samples / (step * dp) / 1e12
    est = StepEstimate(
        compute=compute,
        recompute=0.0,
        tp_comm=0.0,
        pp_comm=0.0,
        bubble=0.0,
        dp_exposed=exposed,
        optimizer=optimizer,
        tokens_per_s=samples / step,
        tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / g.peak_flops,
        hardware_tflops_per_gpu=tflops,  # nothing is recomputed: every FLOP executed counts
    )
    return memory, est


# The software a model described without layers is planned under: how its gradients are
# reduced and accumulated (the search also fixes micro-batches and ZeRO stage). A fixed
# choice beyond these and off its default (the attention kernel, the loss, compression, …)
# describes layers it has not: refused with the reason, never matched against nothing.
GENERIC_SOFTWARE = (
    "overlap_grad_reduce",
    "grad_reduce",
    "backward_prefetch",
    "grad_accumulation",
    "param_gather",
    "grad_sync",
    "grad_bucket",
    "optimizer_kernel",
    "clip_scale",
)


def search_generic(
    model: GenericModel, cluster: Cluster, gpus: int, global_batch: int, precision: str, fixed: dict
):
    """Data-parallel layouts over all ``gpus``: micro-batch and ZeRO stage."""
    from paracube.planner.search import Candidate, SearchResult, micro_batches, rank

    searched = {"dp", "micro_batch", "microbatches", "zero", *GENERIC_SOFTWARE}
    defaults = {f.name: f.default for f in fields(Layout)}
    unmodelled = sorted(k for k, v in fixed.items() if k not in searched and v != defaults.get(k))
    if unmodelled:
        raise ConfigError(
            f"{', '.join(f'{k}={fixed[k]!r}' for k in unmodelled)}: {model.name} is described "
            "without layers (parameters, FLOPs and activations per sample); the planner fixes "
            f"only its micro-batch, ZeRO stage and {', '.join(GENERIC_SOFTWARE)}: drop the rest"
        )
    result = SearchResult(ranked=[])
    if global_batch % gpus:
        result.reject("global batch not divisible by dp")
        return result
    per_gpu = global_batch // gpus
    # every micro-batch dividing a GPU's samples (an image is small beside a sequence: no cap)
    sizes = micro_batches(per_gpu, fixed.get("micro_batch"), limit=per_gpu)
    if not sizes:
        result.reject(
            f"--micro-batch {fixed['micro_batch']} does not divide the {per_gpu} samples per "
            f"GPU ({global_batch} ÷ {gpus})"
        )
    for b in sizes:
        for zero in (0, 1, 2, 3) if gpus > 1 else (0,):
            layout = Layout(
                dp=gpus,
                micro_batch=b,
                microbatches=global_batch // (gpus * b),
                zero=zero,
                **{k: fixed[k] for k in GENERIC_SOFTWARE if k in fixed},  # as fixed
            )
            if any(getattr(layout, k) != v for k, v in fixed.items()):
                continue
            result.evaluated += 1
            mem, est = evaluate(model, layout, cluster, precision)
            if mem.total > cluster.gpu.memory_bytes:
                result.reject("does not fit in GPU memory")
                if (
                    result.smallest_misfit is None
                    or mem.total < result.smallest_misfit.memory.total
                ):
                    result.smallest_misfit = Candidate(layout, mem, est)
                continue
            result.add(Candidate(layout, mem, est))
    rank(result.ranked, cluster.gpu.memory_bytes)
    return result
