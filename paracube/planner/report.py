"""What ``paracube plan`` prints: the ranked table, the reasoning, JSON, the launch command."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from paracube.choices import FUSED_ATTENTION
from paracube.config import ModelConfig
from paracube.planner import hardware as hw
from paracube.planner.hardware import GB, GPU
from paracube.planner.layout_memory import FRAGMENTATION
from paracube.planner.published import TrackRecord
from paracube.planner.reasons import attends_locally, layout_reasons, seconds_text
from paracube.planner.search import Candidate, SearchResult, at_memory_edge
from paracube.planner.time_model import Cluster, StepEstimate, at_precision, estimate


def describe(layout) -> str:
    text = f"dp={layout.dp} tp={layout.tp} pp={layout.pp}"
    if getattr(layout, "cp", 1) > 1:
        text += f" cp={layout.cp}"
    if getattr(layout, "ep", 1) > 1:
        text += f" ep={layout.ep}"
    if getattr(layout, "etp", 0):
        text += f" etp={layout.etp}"
    text += f" b={layout.micro_batch} m={layout.microbatches}"
    if layout.pp > 1:
        text += f" {layout.schedule}" + (f"×{layout.chunks}" if layout.chunks > 1 else "")
        if getattr(layout, "split", "engine") != "engine":
            text += f" split={layout.split}"
    if layout.zero:
        text += f" zero{layout.zero}"
    if getattr(layout, "shard", 0):
        text += f" hsdp={layout.shard}" if layout.zero == 3 else f" zero-group={layout.shard}"
    if getattr(layout, "param_sync", "all-gather") != "all-gather" and layout.zero in (1, 2):
        text += f" sync={layout.param_sync}"
    if getattr(layout, "grad_sync", "all-reduce") != "all-reduce" and layout.zero == 1:
        text += " rs"
    if getattr(layout, "zero3_per_step", False):
        text += "(per step)"
    if layout.recompute != "none":
        text += f" recompute={layout.recompute}"
        modules = getattr(layout, "recompute_modules", ("core_attn",))
        if layout.recompute == "selective" and modules != ("core_attn",):
            text += f"[{','.join(modules)}]"
        if getattr(layout, "recompute_blocks", None) is not None:
            n = layout.recompute_blocks
            text += f"[first {n} block{'s' if n != 1 else ''}" + (
                " of each stage]" if getattr(layout, "recompute_scope", "model") == "stage" else "]"
            )
    if layout.sequence_parallel:
        text += " sp"
    if getattr(layout, "offload", False):
        text += " offload"
    if getattr(layout, "compress", "none") != "none":
        text += f" compress={layout.compress}"
    if getattr(layout, "grad_reduce", "fp32") != "fp32":
        text += f" grads={layout.grad_reduce}"
    return text


@dataclass(frozen=True)
class Baseline:
    """The fastest layout on fewer GPUs — one, or one node when the model does not fit on
    one — for the same global batch: what every candidate's speed-up is measured against."""

    gpus: int
    best: Candidate

    def speedup(self, c: Candidate) -> float:
        return c.time.tokens_per_s / self.best.time.tokens_per_s

    def efficiency(self, c: Candidate) -> float:
        """Speed-up over the ideal: (GPUs ÷ baseline GPUs) × the baseline's speed."""
        return self.speedup(c) / (c.layout.gpus / self.gpus)


def table(cands: list[Candidate], cluster: Cluster, baseline: Baseline | None = None) -> str:
    plural = "s" if baseline and baseline.gpus > 1 else ""
    extra = f" speed-up vs {baseline.gpus} GPU{plural} (efficiency) |" if baseline else ""
    rows = [
        "| # | layout | memory/GPU | step | tokens (samples)/s | TFLOP/s/GPU | MFU | bubble |"
        + extra,
        "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if baseline else ""),
    ]
    for i, c in enumerate(cands, 1):
        t = c.time
        speed = f" {baseline.speedup(c):.2f}× ({baseline.efficiency(c):.0%}) |" if baseline else ""
        cell = describe(c.layout).replace("|", "\\|")  # an explicit layout's stage bars
        rows.append(
            f"| {i} | {cell} | {c.memory.total / GB:.1f} / {cluster.gpu.memory_bytes / GB:.1f} GB | "
            f"{seconds_text(t.step_time)} | {t.tokens_per_s:,.0f} | {t.tflops_per_gpu:.0f} | {t.mfu:.0%} | "
            f"{t.bubble / t.step_time:.1%} |" + speed
        )
    return "\n".join(rows)


def scaling(best: Candidate, baseline: Baseline) -> str:
    """The best layout's speed-up in the guide's terms: N times the GPUs give
    N / (1 + overhead ÷ ideal), where the ideal step is the baseline's split N ways and the
    overhead is what the step takes beyond it — and which part of the step costs most: the
    overhead is the sum, part by part, of what each takes beyond the baseline's share of it
    (:func:`step_parts`), and the largest of those is named (below the ideal, the layout's
    own largest overhead)."""
    t, n = best.time, best.layout.gpus / baseline.gpus
    ideal = baseline.best.time.step_time / n  # the same global batch, N times the GPUs
    overhead = t.step_time - ideal
    base = step_parts(baseline.best.time)
    beyond_share = {name: seconds - base[name] / n for name, seconds in step_parts(t).items()}
    worst, cost = max(beyond_share.items(), key=lambda kv: kv[1])
    if overhead < 0:  # no part costs more than its share: name the layout's own largest
        worst, cost = largest_overhead(t)
    if worst == "compute":
        # each GPU's smaller micro-batch runs smaller matmuls, at lower tile and wave
        # efficiency than the baseline's
        worst = "the compute beyond the baseline's share (smaller matmuls per GPU)"
    elif worst == "the optimizer step" and best.layout.zero == 0 and best.layout.dp > 1:
        worst = (
            "the optimizer step, which every data-parallel replica runs whole (ZeRO-1 splits it)"
        )
    plural = "s" if baseline.gpus > 1 else ""
    if overhead >= 0:
        beyond = f"{seconds_text(overhead)} beyond it"
    else:  # the baseline itself pays for fitting in fewer GPUs (offload, recomputation, …)
        beyond = (
            f"{seconds_text(-overhead)} below it — more than linear, as the baseline pays to fit in "
            f"{baseline.gpus} GPU{plural} ({baseline_cost(baseline.best, t, n)}) what "
            "this layout does not"
        )
    return (
        f"- Speed-up over {baseline.gpus} GPU{plural} ({describe(baseline.best.layout)}): "
        f"{baseline.speedup(best):.2f}× on {best.layout.gpus}, {baseline.efficiency(best):.0%} "
        f"scaling efficiency — N / (1 + overhead ÷ ideal) with N = {n:g}, the ideal step "
        f"{seconds_text(ideal)} (the baseline's split {n:g} ways) and {beyond}; of "
        f"the step's overheads the largest is {worst} ({seconds_text(cost)})."
    )


def step_parts(t: StepEstimate) -> dict[str, float]:
    """A step's parts by name — the compute and everything beyond it; their sum is its
    step time (:attr:`StepEstimate.step_time`)."""
    return {
        "compute": t.compute,
        "data-parallel communication": t.dp_exposed,
        "tensor-parallel communication": t.tp_comm,
        "the context-parallel ring": t.cp_comm,
        "the experts' all-to-alls": t.ep_comm,
        "pipeline transfers": t.pp_comm,
        "the pipeline bubble": t.bubble,
        "recomputation": t.recompute,
        "the optimizer step": t.optimizer,
    }


def largest_overhead(t: StepEstimate) -> tuple[str, float]:
    """The largest part of a step beyond its compute, by name, with its seconds."""
    parts = step_parts(t)
    del parts["compute"]
    return max(parts.items(), key=lambda kv: kv[1])


def baseline_cost(cand: Candidate, faster: StepEstimate, n: float) -> str:
    """What a baseline pays to fit in fewer GPUs that the ``faster`` layout on N times as
    many does not: the part of its step furthest beyond N × the same part of the faster
    one's, named with those seconds — an overhead (an offloaded optimizer step), or compute
    (a smaller micro-batch, more accumulated ones). Its largest overhead could be a part
    both pay alike: a mixture's all-to-alls over N times the blocks per GPU."""
    base, share = step_parts(cand.time), step_parts(faster)
    name, seconds = max(((k, v - n * share[k]) for k, v in base.items()), key=lambda kv: kv[1])
    if name == "compute":
        name = "compute beyond the faster layout's × N: smaller or more micro-batches"
    return (
        f"{name}: {seconds_text(seconds)} beyond {n:g} × this layout's, of its "
        f"{seconds_text(cand.time.step_time)} step"
    )


def explain(
    result: SearchResult, cfg: ModelConfig, cluster: Cluster, gpus: int, precision: str = "bf16"
) -> str:
    """The reasoning behind the best layout, in plain language, with its numbers."""
    best = result.ranked[0]
    lines = [f"Why {describe(best.layout)}:"]
    lines += layout_reasons(best, cfg, cluster, precision)
    lines.append(recompute_tradeoff(cfg, best.layout, cluster, precision))
    lines.append(_predicted(best, cluster, precision, local=attends_locally(cfg)))
    edge = memory_edge(best, cluster, compared=len(result.ranked) > 1)
    if edge:
        lines.append(edge)
    lines += _alternatives(result, cluster.gpu.memory_bytes)
    return "\n".join(lines)


def track_record(record: TrackRecord, stack_name: str, precision: str, gpu_name: str) -> str:
    """How the planner did on the published runs of this stack on this GPU in this precision
    (:func:`paracube.planner.published.track_record`), as a caveat on the plan's figures."""
    return (
        f"- Track record: {record.runs} published run{'s' if record.runs > 1 else ''} of "
        f"{stack_name}'s software on {gpu_name} in {precision}"
        f"{' of mixtures of experts' if record.moe else ''} "
        f"({', '.join(record.sources)}) "
        f"were predicted at {record.low:.2f}–{record.high:.2f}× what they reached, median "
        f"{record.median:.2f}, {record.within} within ±15 % — the spread to read this plan's "
        "figures with (benchmarks/bench_planner_published.py; BENCHMARKS.md)."
    )


def memory_edge(best: Candidate, cluster: Cluster, compared: bool = False) -> str:
    """The caveat of a layout planned at the edge of its GPU's memory
    (:func:`paracube.planner.search.at_memory_edge`, the fragmentation allowance included) —
    the search ranks one first only where no layout as fast has room: there PyTorch's
    caching allocator can run out of cached blocks and free and re-allocate them inside the
    step — "cudaMalloc retries" — which the time model does not charge. Published: 46
    retries made an FSDP step 7.3 s where its twin without them took 5.3 s
    (pytorch/pytorch#104509); expandable segments took a 13B ZeRO-2 step on 8 H100s from
    868 to 729 ms (Lightning-AI/lightning-thunder#420). ``compared``: the layout is the first
    of a search's ranking, so no layout as fast has room. "" with room to spare."""
    capacity = cluster.gpu.memory_bytes
    total = best.memory.total
    if not at_memory_edge(total, capacity):
        return ""
    return (
        f"- At the memory edge: {total / GB:.1f} of the {capacity / GB:.0f} GB "
        f"({total / capacity:.0%}, the planner's {FRAGMENTATION:.0%} fragmentation allowance "
        f"included){', and no layout within 1 % of its speed has more room' if compared else ''}. "
        "There PyTorch's caching allocator can run out of cached blocks and free and "
        "re-allocate them within the step (cudaMalloc retries), which this prediction does "
        "not charge — published FSDP steps "
        "ran 19–38 % slower for it (Lightning-AI/lightning-thunder#420, pytorch/pytorch#104509); "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it, or take a layout with "
        "more room."
    )


def _predicted(best, cluster: Cluster, precision: str = "bf16", local: bool = False) -> str:
    L, t = best.layout, best.time
    fp8 = (
        f" Under fp8 the blocks' linear layers run on the FP8 units "
        f"({cluster.gpu.fp8_flops / 1e12:,.0f} TFLOP/s peak, sustaining "
        f"{cluster.gpu.fp8_units.sustained_fraction:.0%} of it) and "
        "pay the cast-transpose passes that make their operands; MFU counts against the FP8 "
        "peak (as llm-foundry's FP8 tables do), the rest of the step running at half of it."
        if precision == "fp8"
        else ""
    )
    metrics = (
        f" The trainer's {L.logit_metrics} metric{'s' if L.logit_metrics > 1 else ''} over each "
        "micro-batch's logits (a cross-entropy each, beside the loss) are in the step: each "
        "reads and writes the logits again."
        if L.logit_metrics
        else ""
    )
    executed = (
        f" ({t.hardware_tflops_per_gpu:.0f} TFLOP/s executed, the recomputation included)"
        if L.recompute != "none"
        else ""
    )
    return (
        f"- Predicted: {t.tokens_per_s:,.0f} tokens/s, {t.tflops_per_gpu:.0f} TFLOP/s per GPU{executed}, "
        f"MFU {t.mfu:.0%} of a {t.mfu_ceiling:.0%} ceiling — the MFU of the step's compute alone, "
        "in the same count of model FLOPs (attention's s×s in full, as the papers' MFU; causal "
        f"{L.attention} attention executes half of them"
        + ("; a local block's, the keys its mask keeps" if local else "")
        + "). The compute runs "
        f"{UNITS.get(precision, 'the tensor cores')} at "
        f"{sustained(at_precision(cluster, precision).gpu, L.attention)}, each matmul's "
        f"roofline with tile and wave quantization over {cluster.gpu.sms or 'no'} SMs, and the "
        f"memory-bound element-wise work ({ELEMENTWISE_WORDS[L.elementwise]}) and the passes that "
        "bring each micro-batch's gradients into the buffer they are reduced from "
        "(paracube.planner.time_model)." + metrics + fp8
    )


# How the blocks' element-wise ops reach HBM, in words (Layout.elementwise)
ELEMENTWISE_WORDS = {
    "fused": "as fused kernels: what each block keeps for backward, read and written",
    "eager": "as eager PyTorch ops: every op's reads and writes, op by op",
}

# The units a precision's matmuls run on, in words (hardware.GPU.rate); 16-bit and fp8: the
# tensor cores
UNITS = {"fp32": "the FP32 units (CUDA cores)", "tf32": "the tensor cores in TF32"}


def sustained(g: GPU, kernel: str = "fused") -> str:
    """Where the planner's matmul rate for ``g``'s units comes from, and the fused attention
    kernel's, in words (``g`` as the plan's precision sees it: time_model.at_precision;
    ``kernel``: the layout's attention, FlashAttention-3 at its speed-up over the GPU's
    FlashAttention-2 rates)."""
    from paracube.planner.time_model import FUSED_SLOWDOWN

    forward, backward = g.attention_rate, g.attention_backward_rate or g.attention_rate
    name = "FlashAttention-2"
    if kernel == "fused-v3":
        name = "FlashAttention-3"
        forward /= FUSED_SLOWDOWN[kernel][0]
        backward /= FUSED_SLOWDOWN[kernel][1]
    attention = (
        f"{name} at {forward / g.peak_flops:.0%}"
        if g.attention_rate
        else "the attention's matmuls at that rate too"
    )
    if g.attention_rate and backward != forward:
        attention += f", its backward at {backward / g.peak_flops:.0%}"
    if g.measured_sustained:
        return (
            f"the rate measured at the power limit with the whole node busy "
            f"({g.sustained_fraction:.0%} of the peak; {attention})"
        )
    return f"the base clock ({g.sustained_fraction:.0%} of the boost-clock peak; {attention})"


def _alternatives(result: SearchResult, capacity: float) -> list[str]:
    """What was rejected, and how the best layout of another model-parallel shape compares
    (on GPUs of ``capacity`` bytes: an equally fast one may rank lower for its memory)."""
    best = result.ranked[0]
    L = best.layout
    lines = []
    if result.rejected:
        why = "; ".join(
            f"{reason} ({n:,} layout{'s' if n > 1 else ''})"
            for reason, n in sorted(merged_reasons(result.rejected).items(), key=lambda x: -x[1])
        )
        lines.append(f"- Not considered or lost: {why}.")
    other = next((c for c in result.ranked[1:] if (c.layout.tp, c.layout.pp) != (L.tp, L.pp)), None)
    if other is not None:
        ratio = best.time.tokens_per_s / other.time.tokens_per_s
        why_lower = (
            f"being at the memory edge ({other.memory.total / capacity:.0%} of the GPU's memory)"
            if at_memory_edge(other.memory.total, capacity)
            and not at_memory_edge(best.memory.total, capacity)
            else "having more moving parts"
        )
        verdict = (
            f"{ratio:.2f}× slower"
            if ratio >= 1.005
            else f"as fast within the model's 1 % resolution, and ranked lower for {why_lower}"
        )
        lines.append(
            f"- The best layout with another model-parallel shape, {describe(other.layout)}, is {verdict}."
        )
    return lines


# a refusal that opens by naming its value: "cp=2 with a sliding window …"
_NAMED_VALUE = re.compile(r"^(\w+)=([^\s:,;]+)(:? .*)$", re.DOTALL)


def merged_reasons(rejected: dict[str, int]) -> dict[str, int]:
    """The search's refusals with those that differ only in the value they open by merged,
    their counts summed: "cp=2 with …" and "cp=4 with …" as "cp=2 or 4 with …".

    >>> merged_reasons({"cp=2 with a window": 9, "cp=4 with a window": 9, "too big": 1})
    {'cp=2 or 4 with a window': 18, 'too big': 1}
    >>> merged_reasons({"zero=2: not run": 1, "zero=3: not run": 2})
    {'zero=2 or 3: not run': 3}
    """
    groups: dict[tuple[str, str], list[str]] = {}
    counts: dict[tuple[str, str], int] = {}
    for reason, n in rejected.items():
        match = _NAMED_VALUE.match(reason)
        key = (match[1], match[3]) if match else (reason, "")
        groups.setdefault(key, []).append(match[2] if match else "")
        counts[key] = counts.get(key, 0) + n
    merged = {}
    for (name, rest), values in groups.items():
        text = f"{name}={' or '.join(values)}{rest}" if rest else name
        merged[text] = counts[name, rest]
    return merged


def recompute_tradeoff(cfg: ModelConfig, layout, cluster: Cluster, precision: str = "bf16") -> str:
    """What activation checkpointing would trade for this layout in ``precision``: activation
    memory saved against compute added, for selective and for full recomputation."""
    from paracube.planner.layout_memory import stage_memory

    # every block checkpointed or none: the layout's own partial count (recompute_blocks)
    # would make "full" mean its few blocks
    base = layout.replace(recompute="none", recompute_blocks=None)
    mem0 = stage_memory(cfg, base, precision)[0].activations
    t0 = estimate(cfg, base, cluster, precision)
    parts = []
    for how in ("selective", "full"):
        other = base.replace(recompute=how)
        mem = stage_memory(cfg, other, precision)[0].activations
        t = estimate(cfg, other, cluster, precision)
        saved, added = 1 - mem / mem0, t.recompute / t0.compute
        if how == "selective" and saved < 0.005 and layout.attention in FUSED_ATTENTION:
            # selective recomputation drops the attention core's s×s scores and softmax
            # (Korthikanti et al. 2022 §5), which a fused kernel never stores
            parts.append(
                f"selective recompute saves nothing here — fused attention stores no s×s "
                f"scores to drop — for {added:.0%} more compute"
            )
            continue
        parts.append(
            f"{how} recompute cuts activation memory by {saved:.0%} for {added:.0%} more compute"
        )
    return "- Activation checkpointing here: " + "; ".join(parts) + "."


def to_json(candidates: list[Candidate], baseline: Baseline | None = None) -> list[dict]:
    """Every figure of each candidate; with a ``baseline``, its speed-up over it and
    the scaling efficiency, as the table's last column."""

    def figures(c: Candidate) -> dict:
        row: dict[str, object] = {
            "layout": asdict(c.layout),
            "memory": {**asdict(c.memory), "total": c.memory.total},
            "time": {
                **asdict(c.time),
                "step_time": c.time.step_time,
                "mfu_ceiling": c.time.mfu_ceiling,  # the --explain line's "of a …% ceiling"
            },
        }
        if baseline is not None:
            row["speedup"] = baseline.speedup(c)
            row["scaling_efficiency"] = baseline.efficiency(c)
        return row

    return [figures(c) for c in candidates]


def model_args(preset_name: str | None, seq_len: int | None = None) -> str:
    """The ``paracube train`` flags that name the planned model: its preset, and the
    sequence length when the plan changed it (``plan --model P --seq N``)."""
    model = f"--model {preset_name}" if preset_name else "--model <preset>"
    return model + (f" --seq-len {seq_len}" if seq_len is not None else "")


def torchrun_command(
    best: Candidate,
    preset_name: str | None,
    gpus_per_node: int,
    precision: str = "bf16",
    seq_len: int | None = None,
) -> str:
    L = best.layout
    nodes = math.ceil(L.gpus / gpus_per_node)
    per_node = min(L.gpus, gpus_per_node)
    model = model_args(preset_name, seq_len)
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 "
        f"-m paracube train {model} {' '.join(L.to_args(precision, gpus_per_node))}"
    )


def resnet50_check(gpu: GPU, precision: str) -> str:
    """What NVIDIA's measured ResNet-50 runs say of a ResNet-50 plan in ``precision`` — the
    planner's images/s against theirs on the same kind of units (:func:`~paracube.planner.
    published.resnet50_checks`), and the runs on ``gpu`` in ``precision`` where there are."""
    from paracube.planner.published import resnet50_checks

    tensor = precision != "fp32"
    rows = resnet50_checks(tensor_cores=tensor)
    low, high = min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)
    text = (
        "Checked against NVIDIA's measured ResNet-50 v1.5 runs (DeepLearningExamples; "
        "python benchmarks/bench_planner_resnet50.py): "
    )
    if tensor:
        text += (
            f"on tensor cores (fp16, tf32) this model gives {low:.2f}–{high:.2f}× their "
            "images/s — it times every convolution at the tensor cores' sustained matmul rate, "
            "which cuDNN's convolutions do not reach, and leaves data loading out — so a real "
            "run may take up to that much longer."
        )
    else:
        text += f"on CUDA cores (fp32) this model gives {low:.2f}–{high:.2f}× their images/s."
    systems: dict[str, list[dict]] = {}  # the runs on this GPU in this precision, by system
    for r in rows:
        if hw.gpu(r["gpu"]).name == gpu.name and r["precision"] == precision:
            systems.setdefault(r["system"], []).append(r)
    for system, runs_ in systems.items():
        measured = " and ".join(
            f"{r['published']:,}" + (" images/s" if i == 0 else "") + f" on {r['gpus']}"
            for i, r in enumerate(runs_)
        )
        planned = " and ".join(f"{r['predicted']:,}" for r in runs_)
        text += (
            f" {system} ({runs_[0]['batch_per_gpu']} images per GPU): {measured} GPUs, "
            f"against {planned} here."
        )
    return text
