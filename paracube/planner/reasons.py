"""Why the planner's best layout, one sentence per parallel dimension it uses: what each
costs and buys, in the step's own figures — ``paracube plan --explain``'s reasoning
(:func:`paracube.planner.report.explain` prints it with the prediction and the alternatives)."""

from __future__ import annotations

from paracube.choices import ELEMENT_BYTES, FUSED_ATTENTION, state_bytes_per_parameter
from paracube.config import ModelConfig
from paracube.pipeline.schedules import get_schedule
from paracube.planner.hardware import GB
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.pipeline_layout import is_layout, stages_of
from paracube.planner.search import Candidate
from paracube.planner.stages import chunk_runs
from paracube.planner.time_model import Cluster, StepEstimate, estimate


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


def layout_reasons(best, cfg: ModelConfig, cluster: Cluster, precision: str) -> list[str]:
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
    if (
        getattr(cfg, "mla", False)
        or getattr(cfg, "mtp_layers", 0)
        or attends_locally(cfg)
        or soft_capped(cfg)
    ):
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


def attends_locally(cfg) -> bool:
    """Whether a plan's model attends over a window or in chunks shorter than its sequence
    (a factory's config may be another kind of model)."""
    return bool(getattr(cfg, "local_span", 0))


def soft_capped(cfg) -> bool:
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
    if attends_locally(cfg):
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
    if soft_capped(cfg):
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
        remainder = (
            ", and of each fp32 main weight the 16 bits the bf16 parameter lacks"
            if precision == "bf16" and L.master_weights == "optimizer"
            else ""
        )
        return (
            f" (Adam's two moments in bf16, as Megatron-Core's precision-aware optimizer keeps "
            f"them{remainder}: {w} + {g} + {o} bytes a parameter)"
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
