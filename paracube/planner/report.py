"""What ``paracube plan`` prints: the ranked table, the reasoning, JSON, the launch command."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from paracube.choices import ELEMENT_BYTES, FUSED_ATTENTION, state_bytes_per_parameter
from paracube.config import ModelConfig
from paracube.pipeline.schedules import get_schedule
from paracube.planner import hardware as hw
from paracube.planner.hardware import GPU
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import FRAGMENTATION, peak_memory
from paracube.planner.pipeline_layout import is_layout, stages_of
from paracube.planner.published import TrackRecord
from paracube.planner.search import Candidate, SearchResult, at_memory_edge
from paracube.planner.stages import chunk_runs
from paracube.planner.time_model import Cluster, StepEstimate, at_precision, estimate

GB = 1e9


def seconds_text(value: float) -> str:
    """Seconds as the plan's texts print them: three figures, never in exponent notation —
    thousands grouped, below a millisecond in milliseconds.

    >>> seconds_text(0.0164), seconds_text(1683.2), seconds_text(9.95e-05), seconds_text(12.0)
    ('0.0164 s', '1,683 s', '0.0995 ms', '12 s')
    """
    if abs(value) >= 1000:
        return f"{value:,.0f} s"
    if 0 < abs(value) < 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


# How --explain says a planned pipeline split cuts the stages (every split but the engine's)
_PLANNED_ONLY = "; planned only: paracube train cuts by --balance."
SPLIT_STORY = {
    "even": "Stages cut as Megatron cuts them (even: equal blocks per stage, the embedding and "
    "head on top, so a heavy head slows the last stage)" + _PLANNED_ONLY,
    "even-ends": "Stages cut as Megatron cuts them (even-ends: equal blocks per stage, the "
    "embedding and the loss each in a block's place)" + _PLANNED_ONLY,
    "torchtitan": "Stages cut as torchtitan cuts them (the embedding and the head a layer "
    "each, the layers dealt as evenly as they go, the first stages taking the rest)"
    + _PLANNED_ONLY,
}
SHARDED_STATES = {
    1: "optimizer states",
    2: "optimizer states and gradients",
    3: "optimizer states, gradients and parameters",
}


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
    lines += _layout_reasons(best, cfg, cluster, precision)
    lines.append(recompute_tradeoff(cfg, best.layout, cluster, precision))
    lines.append(_predicted(best, cluster, precision, local=_local(cfg)))
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


def _layout_reasons(best, cfg: ModelConfig, cluster: Cluster, precision: str) -> list[str]:
    """One line per parallel dimension the best layout uses: what it costs and buys."""
    L = best.layout
    lines = []
    if L.tp == 1 and L.pp == 1:
        lines.append(_data_parallel_reason(best))
    if L.tp > 1:
        lines.append(_tensor_parallel_reason(best, cfg, cluster))
    if L.cp > 1:
        lines.append(_context_parallel_reason(best, cfg))
    if getattr(cfg, "moe", False):
        lines.append(_experts_reason(best, cfg))
    if getattr(cfg, "mla", False) or getattr(cfg, "mtp_layers", 0) or _local(cfg) or _capped(cfg):
        lines.append(_architecture_reason(cfg, L))
    if L.pp > 1:
        lines.append(_pipeline_reason(best, cfg))
    if L.zero:
        lines.append(_zero_reason(best, cfg, cluster, precision))
    if L.offload:
        lines.append(_offload_reason(best, cfg, cluster, precision))
    if L.recompute != "none":
        lines.append(_recompute_reason(best))
    if (L.tp > 1 or L.pp > 1) and L.dp > 1:
        lines.append(_replicas_reason(best))
    return lines


def _data_parallel_reason(best) -> str:
    """A layout of data parallelism alone: what crosses the network, and when."""
    L, t = best.layout, best.time
    dtype = "in fp32" if L.grad_reduce == "fp32" else "in the compute dtype"
    hides = " (what sticks out, and the compute it slows while it hides)."
    if L.zero >= 3:
        # FSDP: no GPU holds the whole model, and the network carries parameters as well
        holder = (
            f"each GPU holds 1/{L.shard_group} of its states"
            if not L.shard
            else f"each group of {L.shard} GPUs holds a replica, sharded among them"
        )
        return (
            f"- Data parallelism alone, the model sharded ({holder}; ZeRO-3: below): every GPU "
            f"gathers each block's parameters as it runs it and reduce-scatters its gradients "
            f"({dtype}), "
            + (
                "overlapped with the compute: "
                if L.overlap_grad_reduce
                else "after each backward: "
            )
            + f"{seconds_text(t.dp_exposed)} of a {seconds_text(t.step_time)} step"
            + (hides if L.overlap_grad_reduce else ".")
        )
    if L.zero == 2 and L.microbatches > 1:  # no full gradients kept to accumulate into
        when = f"in each of the {L.microbatches} micro-batches' backwards (ZeRO-2: below), " + (
            "overlapped with them" if L.overlap_grad_reduce else "after each of them"
        )
    else:
        when = "once per step, " + (
            "overlapped with the last backward"
            if L.overlap_grad_reduce
            else "after the last backward"
        )
    if L.zero:  # each rank steps its slice: the others' updated parameters come back
        when += ", and the updated parameters after the step"
    return (
        "- The model's states fit on one GPU (with ZeRO where shown), so every GPU holds a replica"
        + (" (of all but the experts: below)" if L.ep > 1 else "")
        + (" and gradients cross" if L.zero else " and only gradients cross")
        + f" the network ({dtype}), {when}: "
        + f"{seconds_text(t.dp_exposed)} of a {seconds_text(t.step_time)} step"
        + (hides if L.overlap_grad_reduce else ".")
    )


def _tensor_parallel_reason(best, cfg: ModelConfig, cluster: Cluster) -> str:
    """Tensor parallelism: its collectives, and why it stays inside a node."""
    L, t = best.layout, best.time
    return (
        f"- Tensor parallel {L.tp} splits every layer's matrices; it needs "
        + (
            "the attention's collectives and the token dispatcher's"
            if getattr(cfg, "moe", False)
            else "four collectives"
        )
        + f" per layer and micro-batch ({seconds_text(t.tp_comm)} per step here), so it stays inside a node on "
        f"{cluster.intra.name} ({cluster.intra.bandwidth / GB:.0f} GB/s) — across nodes "
        f"({cluster.inter.bandwidth / GB:.0f} GB/s) the same traffic would take "
        f"{cluster.intra.bandwidth / cluster.inter.bandwidth:.0f}× longer."
    )


def _context_parallel_reason(best, cfg: ModelConfig) -> str:
    """Context parallelism: each rank's share of a sequence, and its ring."""
    L, t = best.layout, best.time
    return (
        f"- Context parallel {L.cp} gives each rank {cfg.seq_len // L.cp} of every sequence's "
        f"{cfg.seq_len} tokens (Megatron-Core's ring attention: keys and values pass round the "
        f"{L.cp} ranks while the attention core runs): {seconds_text(t.cp_comm)} per step not hidden. "
        "Planned only: paracube train does not run it."
    )


_MIXTURE_PLANNED_ONLY = "Planned only: paracube train builds dense models."


def _block_list(blocks: tuple[int, ...]) -> str:
    """Block indices as runs: (0, 1, 2, 7) → "0–2, 7"."""
    runs = chunk_runs(blocks)
    return ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def _experts_reason(best, cfg: ModelConfig) -> str:
    """A mixture of experts: where the experts are, and the all-to-alls that reach them."""
    L, t = best.layout, best.time
    shared = (
        f" and a shared expert of {cfg.shared_expert_ffn:,} every token passes (split by tp, "
        "its own collectives, reduced with the attention's weights)"
        if cfg.shared_expert_ffn
        else ""
    )
    dense = (
        f"; blocks {_block_list(cfg.dense_layers)} dense (one MLP of {cfg.dense_ffn or cfg.ffn_hidden:,}, "
        "no experts, no all-to-alls)"
        if cfg.dense_layers
        else ""
    )
    head = (
        f"- A mixture of {cfg.experts} experts, {cfg.experts_per_token} per token{shared}{dense}: "
    )
    if L.ep == 1:
        return (
            head + "every rank holds all of them (no expert parallelism). " + _MIXTURE_PLANNED_ONLY
        )
    if L.folded:  # Megatron-Core's parallel folding
        split = "each expert whole" if L.etp == 1 else f"each split over {L.etp}"
        where = (
            f"folded at etp={L.etp}: over {L.ep} consecutive ranks of the stage's "
            f"tp × cp × dp = {L.tp * L.cp * L.dp}, {split}"
        )
    else:
        where = f"{cfg.experts} over {L.ep} of the {L.dp} data-parallel ranks"
    return (
        head + f"expert parallel {L.ep} gives each rank {cfg.experts // L.ep} of every block's "
        f"experts ({where}), and every token goes to its experts' ranks and back in four "
        "all-to-alls per block and micro-batch"
        + _dispatch_words(cfg, L)
        + ", "
        + (
            "beside another micro-batch's compute (combined 1F1B), what it cannot cover"
            if L.ep_comm_overlap
            else "waited for"
        )
        + f": {seconds_text(t.ep_comm)} per step. "
        + _MIXTURE_PLANNED_ONLY
    )


def _local(cfg) -> bool:
    """Whether a plan's model attends over a window or in chunks shorter than its sequence
    (a factory's config may be another kind of model)."""
    return bool(getattr(cfg, "local_span", 0))


def _capped(cfg) -> bool:
    """Whether a plan's model soft-caps its attention scores or its logits (Gemma 2's)."""
    return bool(getattr(cfg, "attention_softcap", 0) or getattr(cfg, "logit_softcap", 0))


def _softcap_words(cfg: ModelConfig, L: Layout) -> str:
    """Where the plan charges Gemma 2's soft caps: the scores' inside the attention kernel,
    the logits' as passes over this rank's logits (shapes.logit_softcap_bytes)."""
    from paracube.models.shapes import logit_softcap_bytes

    parts = []
    if cfg.attention_softcap:
        kernel = "FlashAttention-3" if L.attention == "fused-v3" else "FlashAttention-2"
        parts.append(
            f"each attention score capped at {cfg.attention_softcap:g} inside {kernel}'s "
            "kernel (its softcap; timed as the kernel without it)"
        )
    if cfg.logit_softcap:
        eager = L.elementwise == "eager"
        fwd, bwd = logit_softcap_bytes(1, eager=eager)
        logits = L.micro_batch * cfg.seq_len * cfg.vocab_size // L.tp
        parts.append(
            f"each logit capped at {cfg.logit_softcap:g} by passes over this rank's "
            f"{logits:,} logits a micro-batch — {fwd} forward and {bwd} backward, each a read "
            f"or a write ({'op by op' if eager else 'fused'}) —, their tanh kept for backward "
            "on the last stage"
        )
    return "logit soft-capping: " + "; ".join(parts)


def _architecture_reason(cfg: ModelConfig, L: Layout) -> str:
    """A latent attention, multi-token prediction modules, a sliding window, soft caps: how
    the plan holds them."""
    parts = []
    if _local(cfg):
        from paracube.models.shapes import local_kernel_keys
        from paracube.planner.layout import local_words

        s = cfg.seq_len
        local = sum(cfg.local_attention(i) for i in range(cfg.n_layers))
        which = (
            f"{local} of the {cfg.n_layers} blocks (one in {cfg.full_attention_every} "
            "attends fully)"
            if local < cfg.n_layers
            else "every block"
        )
        keys = local_kernel_keys(s, cfg.attention_window, cfg.attention_chunk)
        computed = (
            f"a local block's fused attention computes {keys:,.0f} keys a query (every "
            f"128 × 128 tile its mask reaches) where a full one computes {s / 2:,.0f} (the "
            f"causal half of {s:,})"
            if L.attention in FUSED_ATTENTION
            else f"{L.attention} attention computes every score and masks it"
        )
        parts.append(
            f"{local_words(cfg)} in {which}: {computed}; MFU counts the "
            f"{cfg.attended_keys:,.0f} keys its mask keeps"
        )
    if cfg.mla:
        queries = f"queries from a {cfg.q_lora_rank:,} latent, " if cfg.q_lora_rank else ""
        gathered = (cfg.q_lora_rank or cfg.hidden) + cfg.kv_lora_rank + cfg.rope_head_dim
        parts.append(
            f"multi-head latent attention ({queries}keys and values from a "
            f"{cfg.kv_lora_rank:,} latent; heads of {cfg.qk_head_dim} and {cfg.v_dim}): its "
            "down projections are whole on every tensor-parallel rank"
            + (
                f", over the rank's sequence shard, so {gathered:,} values a token are "
                f"gathered rather than {cfg.hidden:,}"
                if L.tp > 1
                else ""
            )
        )
    if cfg.mtp_layers:
        parts.append(
            f"{cfg.mtp_layers} multi-token prediction module"
            + ("s" if cfg.mtp_layers > 1 else "")
            + " on the last stage (a block, a projection and the head's loss again each"
            + (", and a copy of the embedding" if L.pp > 1 else "")
            + ")"
        )
    if _capped(cfg):
        parts.append(_softcap_words(cfg, L))
    text = "; ".join(parts)
    return f"- {text[0].upper()}{text[1:]}."


def _dispatch_words(cfg: ModelConfig, layout) -> str:
    """How the dispatcher's all-to-alls carry a token: under DeepEP once to each rank, the
    share of the all-to-all dispatcher's rows that leaves (mp_comm.dispatched_rows)."""
    if layout.ep_dispatch == "alltoall":
        return ""
    from paracube.planner.mp_comm import dispatched_rows

    share = dispatched_rows(cfg, layout) / (cfg.experts_per_token / layout.ep)
    gate = " from the round-robin gate" if layout.router == "round-robin" else ""
    return (
        f" (DeepEP's: a token once to each rank holding any of its experts{gate}, "
        f"{share:.0%} of the rows a copy per expert sends; across nodes once to each node, "
        "which copies it to its ranks over NVLink)"
    )


def _pipeline_reason(best, cfg: ModelConfig) -> str:
    """Pipeline parallelism: its bubble, and how its stages are cut."""
    L, t = best.layout, best.time
    schedule = get_schedule(L.schedule)
    return (
        f"- Pipeline {L.pp} splits the {cfg.n_layers} layers into stages; only activations cross stage "
        f"boundaries. Its bubble costs {seconds_text(t.bubble)} ({t.bubble / t.step_time:.1%} of the step) with "
        f"{L.microbatches} micro-batches under {L.schedule}"
        + (f" with {L.chunks} chunks" if L.chunks > 1 else "")
        + f"; more micro-batches shrink it as {schedule.shrinks_as}"
        + (
            " (F, I, W: a block's forward, input-gradient and weight-gradient passes)."
            if schedule.splits_backward
            else "."
        )
        + _undominated_story(L)
        + _split_story(L)
    )


def _split_story(L: Layout) -> str:
    """How --explain says the stages are cut: a named split's story, or an explicit layout's
    blocks per rank; nothing for the engine's own split."""
    if L.split in SPLIT_STORY:
        return " " + SPLIT_STORY[L.split]
    if not is_layout(L.split):
        return ""
    counts = [sum(stage.count("t") for stage in stages_of(L.split)[r :: L.pp]) for r in range(L.pp)]
    return (
        f" Stages cut by the layout given (Megatron-Core's --pipeline-model-parallel-layout, "
        f"virtual stage k on rank k mod pp): ranks hold {', '.join(map(str, counts))} blocks"
        + _PLANNED_ONLY
    )


def _undominated_story(L: Layout) -> str:
    """Why a schedule another one dominates runs here: the other cannot (GPipe with fewer
    micro-batches than stages, which 1F1B does not run); empty otherwise."""
    schedule = get_schedule(L.schedule)
    if schedule.dominated_by is None:
        return ""
    why = get_schedule(schedule.dominated_by).why_not(L.pp, L.microbatches)
    return (
        f" It runs {schedule.name} because {schedule.dominated_by} cannot here ({why})."
        if why
        else ""
    )


def _main_weights_words(L: Layout, precision: str) -> str:
    """Where a 16-bit run's main weights are, when not beside 16-bit parameters in the
    optimizer (choices.MASTER_WEIGHTS), or Adam's moments in bf16 (choices.MOMENTS): the
    bytes a parameter the states then take."""
    elem = ELEMENT_BYTES[precision]
    w, g, o = state_bytes_per_parameter(precision, L.grad_reduce, L.master_weights, L.moments)
    if L.moments == "bf16":
        return (
            f" (Adam's two moments in bf16, as Megatron-Core's precision-aware optimizer keeps "
            f"them: {w} + {g} + {o} bytes a parameter)"
        )
    if elem == 4 or L.master_weights == "optimizer":
        return ""
    if L.master_weights == "none":
        return (
            f" (pure {precision}: parameters, gradients and Adam's two moments all {8 * elem}-bit, "
            f"{w} + {g} + {o} bytes a parameter, no fp32 copy)"
        )
    if L.zero != 3:
        return ""
    return (
        f" (the fp32 parameters are the main weights, cast as they are gathered: 4 + {g} + "
        f"{o - 4} bytes a parameter, no {8 * elem}-bit shard)"
    )


def _zero_reason(best, cfg: ModelConfig, cluster: Cluster, precision: str) -> str:
    """A ZeRO stage: what it shards over which ranks, the collectives it adds, and the
    replicated twin's fit and step."""
    L, t = best.layout, best.time
    group = (
        f"{L.grad_group} "
        + ("data-parallel" if L.cp == 1 else f"data- and context-parallel ({L.dp} × {L.cp})")
        if not L.shard
        else f"{L.shard} ranks of each hybrid shard group ({L.replicas} replicas of it, "
        + (
            "whose gradient shards are all-reduced across them in every backward)"
            if L.zero == 3
            else f"while the gradients are all-reduced over all {L.grad_group} data-parallel ranks)"
        )
    )
    line = (
        f"- ZeRO-{L.zero} shards {SHARDED_STATES[L.zero]} over the {group}"
        + (" ranks" if not L.shard else "")
        + f": {best.memory.model_states / GB:.1f} GB of model states per GPU"
        + _main_weights_words(L, precision)
        + (
            f" and {best.memory.gathered / GB:.1f} GB of parameters gathered beside them (the "
            "embedding and head through the step, a block with the next one prefetched)"
            if best.memory.gathered
            else ""
        )
        + ", and each "
        f"rank steps 1/{L.shard_group} of the optimizer ({seconds_text(t.optimizer)}); the parameter "
        + (
            f"broadcasts it adds (one from each of its {L.shard_group} ranks that owns "
            "parameters, never more ranks than the model has weight matrices; each a chain "
            "of its own that NCCL fills a 512 KiB chunk per hop before its bytes stream)"
            if L.zero in (1, 2) and L.param_sync == "broadcast"
            else "all-gathers it adds"
        )
        + (
            f", and a gradient reduce-scatter in each of the {L.microbatches} micro-batches' "
            "backwards (no full gradients are kept to accumulate into),"
            if L.zero >= 2 and L.microbatches > 1 and not L.zero3_per_step
            else ""
        )
        + (
            " — once a step under this pipeline, as torchtitan runs FSDP2 with PyTorch's "
            "schedules: each stage gathered in its first forward and kept, its "
            "gradients accumulated whole and reduce-scattered after its last backward, "
            "so while the step runs it holds what ZeRO-1 holds —"
            if L.zero3_per_step
            else ""
        )
        + (
            ", and the gradients reduce-scattered into each rank's slice rather than "
            "all-reduced (Megatron-Core's distributed optimizer: half the ring's traffic),"
            if L.zero == 1 and L.grad_sync == "reduce-scatter" and L.grad_group > 1
            else ""
        )
        + f" are in the {seconds_text(t.dp_exposed)} the data-parallel communication costs"
        + (
            " — without backward prefetching (FSDP1's BACKWARD_POST) every backward waits for "
            "its own gathers, none of them hidden."
            if L.zero == 3 and not L.backward_prefetch
            else "."
        )
    )
    if L.zero == 3 and L.param_gather == "per-parameter" and L.grad_group > 1:
        flat = estimate(cfg, L.replace(param_gather="flat"), cluster, precision)
        line += (
            f" Copying each gathered unit out into its parameters (FSDP2's per-parameter "
            f"sharding) adds {seconds_text(t.compute - flat.compute)} of compute."
        )
    line += " " + _without_zero(best, cfg, cluster, precision)
    return line


def _recompute_reason(best) -> str:
    """Recomputation: in which blocks, and what it trades for activation memory."""
    L, t = best.layout, best.time
    which = (
        ""
        if L.recompute_blocks is None
        else f" in the model's first {L.recompute_blocks} block"
        f"{'s' if L.recompute_blocks != 1 else ''} (the rest keep their activations)"
    )
    cost = (
        f"trades {seconds_text(t.recompute)} of extra compute"
        if t.recompute > 0
        # the step's parts are its slowest rank's: a stage that is not it recomputes for free
        else "adds nothing to the step (the stage that recomputes is not the slowest) in exchange"
    )
    return (
        f"- {L.recompute.capitalize()} recomputation{which} {cost} for activation memory "
        f"({best.memory.activations / GB:.1f} GB per GPU at the peak)."
    )


def _replicas_reason(best) -> str:
    """Data parallelism beside model parallelism: what its replicas share."""
    L = best.layout
    return f"- Data parallel {L.dp} over the rest of the GPUs " + (
        "replicates this model-parallel group."
        if L.zero < 3
        else "shards this model-parallel group's states over its copies (ZeRO-3, above)."
        if not L.shard
        else f"shards this model-parallel group's states over groups of {L.shard} of its "
        "copies and replicates them across the groups (ZeRO-3 hybrid, above)."
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


def _without_zero(best: Candidate, cfg: ModelConfig, cluster: Cluster, precision: str) -> str:
    """Why the layout shards at all: the same layout with replicated states either does not
    fit (by how much) or fits and is slower or no faster (by its step)."""
    plain = best.layout.replace(zero=0, shard=0)
    memory = peak_memory(cfg, plain, precision).total
    fits = memory <= cluster.gpu.memory_bytes
    other = estimate(cfg, plain, cluster, precision) if fits else None
    return without_zero_text(best, memory, other, cluster.gpu.memory_bytes)


def without_zero_text(
    best: Candidate, memory: float, other: StepEstimate | None, capacity: float
) -> str:
    """The sentence of :func:`_without_zero` for any model: the replicated twin needs
    ``memory`` bytes of the GPU's ``capacity`` and, where it fits, steps as ``other``."""
    if other is None or memory > capacity:
        return (
            f"Without ZeRO this layout would need {memory / GB:.1f} of the "
            f"{capacity / GB:.0f} GB: it is sharded to fit."
        )
    t = best.time
    if other.step_time <= t.step_time:
        return (
            f"Without ZeRO it fits too ({memory / GB:.1f} GB) and is no slower "
            f"({seconds_text(other.step_time)} a step): within the ranking's 1 % either serves."
        )
    parts = {
        "the optimizer step": other.optimizer - t.optimizer,
        "exposed data-parallel communication": other.dp_exposed - t.dp_exposed,
        "compute": other.compute - t.compute,
    }
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    return (
        f"Without ZeRO it fits too ({memory / GB:.1f} GB) at {seconds_text(other.step_time)} a step "
        f"against {seconds_text(t.step_time)}: it is sharded for speed, most of it in {name} "
        f"({seconds_text(seconds)} shorter)."
    )


def _offload_reason(best: Candidate, cfg: ModelConfig, cluster: Cluster, precision: str) -> str:
    """Why the optimizer lives in host memory (ZeRO-Offload), what it frees and what the
    step pays for it — the same layout kept on the GPU as the measure."""
    L, t, g = best.layout, best.time, cluster.gpu
    on_gpu = L.replace(offload=False)
    kept = peak_memory(cfg, on_gpu, precision)
    gpu_step = estimate(cfg, on_gpu, cluster, precision).optimizer
    return (
        f"- The optimizer is offloaded (ZeRO-Offload): its states live in the node's memory and "
        f"its CPU steps them, {(kept.model_states - best.memory.model_states) / GB:.1f} GB off "
        f"each GPU — kept there, this layout would need {kept.total / GB:.1f} of "
        f"{g.memory_bytes / GB:.0f} GB. The step pays {seconds_text(t.optimizer)} for it (gradients to "
        f"the host and new weights back over PCIe, Adam at the host's memory bandwidth) against "
        f"{seconds_text(gpu_step)} on the GPU."
    )


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
