"""Enumerate every valid layout for a model on a cluster, keep those that fit, rank by speed."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

from paracube.choices import (
    ENDS_AS_LAYERS,
    FUSED_ATTENTION,
    PLANNED_RECOMPUTE,
    RECOMPUTE,
    ZERO_STAGES,
)
from paracube.config import ZERO3_WITH_PIPELINE, ModelConfig, compression_with_zero
from paracube.errors import ConfigError
from paracube.pipeline.schedules import SCHEDULES
from paracube.planner.hardware import GPU
from paracube.planner.layout import Layout, expert_refusal
from paracube.planner.layout_memory import StageMemory, peak_memory
from paracube.planner.pipeline_layout import is_layout, stages_of
from paracube.planner.stages import can_cut, layout_shares
from paracube.planner.time_model import Cluster, StepEstimate, estimate

# Layout fields the search enumerates or derives below; every other field (the software)
# is taken from the fixed choices as given, else left at the layout's default (paracube's).
ENUMERATED = {
    "dp", "tp", "pp", "cp", "micro_batch", "microbatches", "schedule", "chunks", "zero",
    "recompute", "recompute_blocks", "sequence_parallel", "ep", "etp",
}  # fmt: skip
TAKEN_AS_FIXED = {f.name for f in fields(Layout)} - ENUMERATED


def software(fixed: dict) -> dict:
    """The fixed choices every candidate layout takes as given (:data:`TAKEN_AS_FIXED`):
    the software facts, offload, compression, the balance — the searches enumerate the rest."""
    return {k: v for k, v in fixed.items() if k in TAKEN_AS_FIXED}


MICRO_BATCH_LIMIT = 32  # micro-batches searched: every divisor of the per-rank batch up to this


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: StageMemory
    time: StepEstimate


@dataclass
class SearchResult:
    ranked: list[Candidate]
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    smallest_misfit: Candidate | None = None  # the least memory among layouts that don't fit
    evaluated: int = 0
    fitting: int = 0  # how many fit; ``ranked`` keeps only the fastest of them

    def add(self, candidate: Candidate) -> None:
        self.ranked.append(candidate)
        self.fitting += 1

    def reject(self, reason: str) -> None:
        """Count one layout left out for ``reason``."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(√n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def micro_batches(per_rank: int, fixed: int | None, limit: int = MICRO_BATCH_LIMIT) -> list[int]:
    """The micro-batch sizes to try for ``per_rank`` samples per data-parallel rank and
    step: a fixed one if it divides them, else every divisor up to ``limit`` (6, 12 and 18
    as published FSDP runs use, not only powers of two).

    >>> micro_batches(24, None), micro_batches(24, 5)
    ([1, 2, 3, 4, 6, 8, 12, 24], [])
    """
    if fixed is not None:
        return [fixed] if per_rank % fixed == 0 else []
    return [b for b in divisors(per_rank) if b <= limit]


def chunk_counts(p: int, layers: int, fixed: int | None) -> list[int]:
    """Virtual chunks per stage for a chunked (interleaved) schedule: a fixed count, else
    every count from 2 up to one block per chunk (``layers // p``) — the engine's partition
    lets chunks differ by a block, so 3, 5, 6, 12 … are as runnable as 2 and 4."""
    if fixed is not None:
        return [fixed] if fixed >= 2 and layers >= p * fixed else []
    return list(range(2, layers // p + 1))


def _schedules(
    p: int,
    m: int,
    layers: int,
    fixed_chunks: int | None = None,
    reject=None,
    fixed_schedule: str | None = None,
):
    """(schedule, chunks) pairs the engine can run at (p, m), from the registry; a schedule
    another one dominates where both run (same bubble, more memory: GPipe under 1F1B) is
    skipped unless it is the one asked for. With a fixed schedule or fixed chunks, why they
    cannot run is told to ``reject``."""
    if p == 1:
        if fixed_chunks not in (None, 1):
            if reject is not None:
                reject(f"--chunks {fixed_chunks} needs a pipeline (pp > 1)")
            return
        yield "1f1b", 1
        return
    for name, sched in SCHEDULES.items():
        if fixed_schedule is not None and name != fixed_schedule:
            continue
        if fixed_schedule is None and sched.dominated_at(p, m):
            continue
        if fixed_chunks not in (None, 1) and not sched.chunked:
            if reject is not None and fixed_schedule is not None:
                reject(f"--chunks {fixed_chunks} needs an interleaved schedule, not {name}")
            continue
        counts = chunk_counts(p, layers, fixed_chunks) if sched.chunked else [1]
        if not counts and reject is not None:
            if fixed_chunks is not None and fixed_chunks < 2:
                reject(f"--chunks {fixed_chunks}: {name} runs 2 or more chunks per stage")
            elif fixed_chunks is not None:
                reject(f"--chunks {fixed_chunks} needs pp × chunks ≤ {layers} layers")
            else:
                reject(f"{name} needs pp × 2 chunks ≤ {layers} layers")
        for v in counts:
            try:
                sched.check(p, m, v)
            except ConfigError as e:
                asked = fixed_schedule is not None or (fixed_chunks is not None and sched.chunked)
                if asked and reject is not None:
                    reject(str(e))
                continue
            yield name, v


# A search's refusals are counted by reason (SearchResult.rejected): each helper gives its
# reasons to the one callback the search passes down.
Reject = Callable[[str], None]


def candidate_layouts(
    cfg: ModelConfig,
    gpus: int,
    gpus_per_node: int,
    global_batch: int,
    fixed: dict,
    rejected: dict,
    op_recompute: bool = False,
    splits: tuple[str, ...] = (),
):
    """Every layout the engines can run: tp within a node and dividing the heads (the
    vocabulary is padded to a multiple of tp, as Megatron does), pp ≤ layers, the global
    batch divisible into dp × micro-batch × m, schedules whose constraints hold. Context
    parallelism only where ``fixed`` asks for it (paracube's engine does not run it): the
    sequence cut into 2·cp equal chunks, under fused attention. torchtitan's op-level
    checkpointing (``recompute="op"``) only where ``fixed`` asks for it or ``op_recompute``
    (a stack that runs it), under fused attention. ``splits``: the pipeline splits a
    pipelined layout is tried with, where ``fixed`` leaves the split open (a stack that runs
    more than one); () — the fixed split, else the engine's."""

    def reject(reason: str) -> None:
        rejected[reason] = rejected.get(reason, 0) + 1

    check_fixed(fixed)
    tried = splits or (fixed.get("split", "engine"),)
    if cfg.mla and fixed.get("activations") == "megatron" and "recompute_modules" not in fixed:
        # a latent attention's selective recomputation takes its up projections too: under a
        # fused kernel the core alone drops only its log-sum-exp, and the per-head q, k and v
        # the up projections make are its largest saved tensors (Megatron's mla_up_proj)
        fixed = {**fixed, "recompute_modules": ("core_attn", "mla_up_proj")}

    compress_kind = fixed.get("compress", "none").partition(":")[0]
    recomputes: tuple[str, ...] = (
        RECOMPUTE  # op-level checkpointing keeps a fused kernel's output (Layout)
    )
    asked = op_recompute or fixed.get("recompute") in PLANNED_RECOMPUTE
    if asked and fixed.get("attention", "fused") in FUSED_ATTENTION:
        recomputes = RECOMPUTE + PLANNED_RECOMPUTE
    if fixed.get("activations") == "compiled":  # counted kept or recomputed whole (Layout)
        recomputes = tuple(r for r in recomputes if r != "selective")
    total = gpus  # before context parallelism takes its share
    cp = fixed.get("cp", 1)
    if cp > 1:
        if gpus % cp or cfg.seq_len % (2 * cp):
            reject(f"cp={cp} must divide the GPUs and the sequence into 2·cp chunks")
            return
        if fixed.get("attention", "fused") not in FUSED_ATTENTION:
            reject("context parallelism needs fused attention")
            return
        gpus //= cp
    # pipeline stages need a layer each: a block, or under a split that counts them
    # (even-ends, torchtitan's) also the embedding and the loss (BLOOM's pp 72 for 70 blocks)
    layers = cfg.n_layers + (2 if set(tried) & set(ENDS_AS_LAYERS) else 0)
    # an explicit layout of S stages (which may be more than the blocks: a stage may hold
    # only the embedding or the loss) fixes chunks = S / pp on every pipeline degree
    stages = len(stages_of(tried[0])) if is_layout(tried[0]) else 0
    layers = max(layers, stages)
    for tp in _tensor_degrees(cfg, gpus, total, gpus_per_node, fixed, reject):
        for pp in _pipeline_degrees(gpus // tp, layers, fixed, reject):
            shaped = fixed
            if stages:
                if stages % pp or fixed.get("chunks", stages // pp) != stages // pp:
                    reject(f"--pipeline-split {tried[0]!r} names {stages} stages = pp × chunks")
                    continue
                shaped = fixed | {"chunks": stages // pp}
            yield from _layouts_of_shape(
                cfg,
                (tp, pp, gpus // (tp * pp), cp),
                layers,
                global_batch,
                shaped,
                reject,
                recomputes,
                tried,
                compress_kind,
            )


def _tensor_degrees(
    cfg: ModelConfig, gpus: int, total: int, gpus_per_node: int, fixed: dict, reject: Reject
) -> Iterator[int]:
    """The tensor-parallel degrees among the divisors of ``gpus`` (those left after context
    parallelism, of ``total``) that the cluster and the model allow, each other one given to
    ``reject`` with its reason (a degree other than a fixed one silently)."""
    for tp in divisors(gpus):
        if fixed.get("tp", tp) != tp:
            continue  # a fixed degree: the others are not candidates (nor reasons)
        if tp > gpus_per_node:
            reject("tensor parallel larger than a node")
            continue
        if total > gpus_per_node and gpus_per_node % tp:
            # ranks fill nodes in order, tp innermost: a tp that does not divide the node
            # puts some groups across two nodes, on the network, not NVLink
            reject("tensor-parallel groups across nodes (tp must divide the GPUs per node)")
            continue
        widths = (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden, cfg.shared_expert_ffn, cfg.dense_ffn)
        if any(width % tp for width in widths):  # an absent part's 0 divides by any tp
            reject("heads or MLP size not divisible by tp")
            continue
        if fixed.get("sequence_parallel") and tp == 1:
            reject("--sequence-parallel needs tensor parallelism (tp > 1)")
            continue
        yield tp


def _pipeline_degrees(gpus: int, layers: int, fixed: dict, reject: Reject) -> Iterator[int]:
    """The pipeline degrees among the divisors of ``gpus`` (those of one tensor-parallel
    degree) that a model of ``layers`` layers and the fixed schedule allow."""
    for pp in divisors(gpus):
        if fixed.get("pp", pp) != pp:
            continue
        if pp > layers:
            if "pp" in fixed:
                reject(f"pp={pp} is more pipeline stages than the model's {layers} layers")
            continue
        if pp == 1 and fixed.get("schedule", "1f1b") != "1f1b":
            reject(f"--schedule {fixed['schedule']} needs a pipeline (pp > 1)")
            continue
        yield pp


def _layouts_of_shape(
    cfg: ModelConfig,
    shape: tuple[int, int, int, int],
    layers: int,
    global_batch: int,
    fixed: dict,
    reject: Reject,
    recomputes: tuple[str, ...],
    tried: tuple[str, ...],
    compress_kind: str,
) -> Iterator[Layout]:
    """Every layout of one (tp, pp, dp, cp) shape: its micro-batches and schedules, ZeRO
    stages, recomputation and expert-parallel degrees, each refused by name where the
    global batch, the fixed choices or the model do not allow it."""
    tp, pp, dp, cp = shape
    if global_batch % dp:
        reject("global batch not divisible by dp")
        return
    experts = _expert_layouts(cfg, tp, dp, cp, fixed, reject)
    if not experts:
        return
    if fixed.get("zero", 0) and dp * cp == 1:
        # nothing to shard over: the search tries ZeRO 0 alone here, so say why the
        # stage asked for (or --shard-group's ZeRO-3) is not a candidate
        reject(
            f"--zero {fixed['zero']} shards over data-parallel ranks: this layout has "
            "one (dp × cp = 1)"
        )
        return
    taken = software(fixed | {"split": tried[0]})  # every layout of the shape takes them
    sizes = micro_batches(global_batch // dp, fixed.get("micro_batch"))
    if not sizes:
        reject(
            f"--micro-batch {fixed['micro_batch']} does not divide the per-rank batch "
            f"({global_batch} ÷ dp)"
        )
    for b in sizes:
        m = global_batch // (dp * b)
        schedules = _schedules(pp, m, layers, fixed.get("chunks"), reject, fixed.get("schedule"))
        for (schedule, v), zero, recompute, (ep, etp) in itertools.product(
            schedules, ZERO_STAGES if dp * cp > 1 else (0,), recomputes, experts
        ):
            if fixed.get("zero", zero) != zero:
                continue  # another stage than the one asked for: not a candidate
            if zero == 3 and pp > 1 and fixed.get("zero3_pipeline", "none") == "none":
                # paracube's ZeRO-3 composes with tensor parallel, not pipelines
                if fixed.get("zero") == 3:
                    reject(
                        ZERO3_WITH_PIPELINE + "; or plan it as torchtitan runs it "
                        "(--stack torchtitan, or --zero3-pipeline per-step)"
                    )
                continue
            refusal = compression_with_zero(compress_kind, zero)
            if refusal:
                reject(refusal)
                continue
            shard = fixed.get("shard", 0)
            if shard and zero not in (1, 3):
                continue  # hybrid sharding is ZeRO-1's or ZeRO-3's: not the others
            if shard and zero == 3 and pp > 1:
                reject("hybrid sharding under a pipeline is not planned")
                continue
            if shard and (dp * cp) % shard:
                reject(f"--shard-group {shard} does not divide the data-parallel group (dp × cp)")
                continue
            layout = Layout(
                dp=dp,
                tp=tp,
                pp=pp,
                micro_batch=b,
                microbatches=m,
                schedule=schedule,
                chunks=v,
                zero=zero,
                recompute=recompute,
                sequence_parallel=fixed.get("sequence_parallel", True) and tp > 1,
                recompute_blocks=(fixed.get("recompute_blocks") if recompute == "full" else None),
                cp=cp,
                ep=ep,
                etp=etp,
                **taken,
            )
            refusal = layout.model_refusal(cfg)
            if refusal:
                reject(refusal)
                continue
            for made in _split_layouts(cfg, layout, tried, reject):
                if all(getattr(made, k) == val for k, val in fixed.items()):
                    yield made


def _expert_layouts(
    cfg: ModelConfig, tp: int, dp: int, cp: int, fixed: dict, reject: Reject
) -> list[tuple[int, int]]:
    """The (ep, etp) pairs a shape's mixture is tried at: unfolded (etp 0) and, under tensor
    parallelism, folded at etp 1 (Megatron-Core's parallel folding) — every ep dividing the
    experts that :func:`~paracube.planner.layout.expert_refusal` lets the shape hold — or
    the fixed ones, refused by name where the shape or the model cannot take them. A dense
    model: (1, 0)."""
    pairs = [(1, 0)]
    if cfg.moe:
        # folded at etp 1 where it differs from unfolded (tp > 1); at tp too if asked for
        etps = dict.fromkeys((0, 1, tp) if "etp" in fixed else (0, 1) if tp > 1 else (0,))
        pairs = [
            (e, etp)
            for etp in etps
            for e in divisors(tp * cp * dp)
            if cfg.experts % e == 0 and not expert_refusal(e, etp, tp, dp, cp)
        ]
    wanted = [
        (ep, etp) for ep, etp in pairs if fixed.get("ep", ep) == ep and fixed.get("etp", etp) == etp
    ]
    if wanted or not {"ep", "etp"} & fixed.keys():
        return wanted
    ep, etp = fixed.get("ep", 1), fixed.get("etp", 0)
    if not cfg.moe or cfg.experts % ep:  # the model refuses them whatever the shape
        reject(Layout(ep=ep, etp=etp, dp=ep, tp=max(etp, 1)).model_refusal(cfg))
    else:
        reject(expert_refusal(ep, etp, tp, dp, cp, brief=True))
    return []


def check_fixed(fixed: dict) -> None:
    """Fixed choices name layout fields and hold values a layout takes (Layout checks each),
    so a misspelt one is refused rather than matching nothing."""
    known = {f.name for f in fields(Layout)}
    unknown = sorted(set(fixed) - known)
    if unknown:
        raise ConfigError(
            f"fixed {', '.join(map(repr, unknown))}: not a layout choice; choose among "
            f"{', '.join(sorted(known))}"
        )
    probe = dict(fixed)
    ep = probe.get("ep")
    if "dp" not in probe and isinstance(ep, int) and not isinstance(ep, bool) and ep > 0:
        # dp is the search's to choose: whether ep divides it is asked of each layout, not
        # of the default dp = 1 (which would refuse every ep > 1 fixed alone)
        probe["dp"] = ep
    etp = probe.get("etp")
    if isinstance(etp, int) and not isinstance(etp, bool) and etp > 0:
        if "tp" not in probe and etp > 1:
            probe["tp"] = etp  # the same for tp, which etp must equal when above 1
        if "ep" not in probe:  # ep too is the search's: one that folds over tp
            probe["ep"] = probe.get("tp", 1)
            probe.setdefault("dp", 1)
    Layout(**probe)


def _split_layouts(cfg: ModelConfig, layout: Layout, splits: tuple[str, ...], reject: Reject):
    """The layout under each of ``splits`` that can be made and cuts the blocks differently
    from those before it (one split only without a pipeline, where there is nothing to cut)
    — Megatron's even splits only where the layers divide into its virtual stages
    (:func:`~paracube.planner.stages.even_shares` owns the rule); ``reject`` is told why
    when none can."""
    made: list[Layout] = []
    cuts = []
    for split in splits if layout.pp > 1 else splits[:1]:
        if not can_cut(cfg, split, layout.pp, layout.chunks):
            continue
        twin = layout if split == layout.split else layout.replace(split=split)
        if split == "engine" or twin.pp == 1:
            made.append(twin)
            continue
        cut = layout_shares(cfg, twin)
        if cut not in cuts:  # pp 2 without chunks: both even splits cut the same
            cuts.append(cut)
            made.append(twin)
    if not made:
        reject(f"--pipeline-split {' or '.join(splits)}: the layers do not divide into pp × chunks")
    return made


def search(
    cfg: ModelConfig,
    cluster: Cluster,
    gpus: int,
    global_batch: int,
    *,
    precision: str = "bf16",
    fixed: dict | None = None,
    top: int = 10,
    allowed: dict | None = None,
    context_parallel: bool = False,
    hybrid_shard: int = 0,
    op_recompute: bool = False,
    splits: tuple[str, ...] = (),
    offload_zero: tuple[int, ...] | None = None,
) -> SearchResult:
    """Every valid layout of ``cfg`` on ``gpus`` GPUs of ``cluster`` for ``global_batch``
    sequences per step, those that fit in GPU memory ranked fastest first (ties within 1 %
    go to the simpler layout). ``fixed`` pins choices (``{"tp": 8, "zero": 1}``);
    ``allowed`` narrows a choice to the values a stack runs (``{"schedule": ("1f1b",)}``:
    :func:`paracube.planner.stacks.stack_choices`); ``context_parallel`` searches context
    parallelism too, for a stack that runs it (:func:`context_parallel_sizes`), and
    ``hybrid_shard`` hybrid sharding of that ZeRO stage (:func:`with_hybrid_shards`; 0:
    none), ``op_recompute`` torchtitan's op-level checkpointing, and ``splits`` each of these
    pipeline splits in place of the one ``fixed`` names (:func:`candidate_layouts`), and
    ``offload_zero`` the ZeRO stages a stack offloads the optimizer with (None: any); the result
    also counts what was rejected and why, and keeps the leanest layout that did not fit.

    >>> from paracube.models.presets import preset
    >>> from paracube.planner import hardware as hw
    >>> cluster = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"),
    ...                   hw.interconnect("ib-hdr"))
    >>> result = search(preset("gpt3-1.3b"), cluster, gpus=8, global_batch=64)
    >>> best = result.ranked[0]
    >>> best.layout.gpus, best.memory.total < cluster.gpu.memory_bytes
    (8, True)
    """
    result = SearchResult(ranked=[])
    capacity = cluster.gpu.memory_bytes
    fixed = fixed or {}
    allowed = allowed or {}
    if splits:  # the stack's splits are tried, not its one as fixed
        fixed = {k: v for k, v in fixed.items() if k != "split"}
    sizes = context_parallel_sizes(cfg, gpus) if context_parallel and "cp" not in fixed else [1]
    layouts = itertools.chain.from_iterable(
        candidate_layouts(
            cfg, gpus, cluster.gpus_per_node, global_batch, fixed | ({"cp": cp} if cp > 1 else {}),
            result.rejected, op_recompute, splits,
        )
        for cp in sizes
    )  # fmt: skip
    if hybrid_shard and "shard" not in fixed:
        layouts = with_hybrid_shards(layouts, cluster.gpus_per_node, hybrid_shard)
    for layout in layouts:
        outside = [
            f"{k}={getattr(layout, k)}" for k, v in allowed.items() if getattr(layout, k) not in v
        ]
        # a hybrid-sharding twin is made after candidate_layouts checked the model: again
        refusal = layout.model_refusal(cfg) if layout.shard else ""
        if outside or refusal:
            reason = refusal or f"{outside[0]}: not what the stack runs"
            result.reject(reason)
            continue
        fitted = _made_to_fit(cfg, layout, cluster, precision, fixed, offload_zero)
        if fitted is None:
            continue  # it fits without recomputation: that layout is its own candidate
        layout, mem = fitted
        result.evaluated += 1  # a distinct layout (the dominated full-recompute twin is not)
        if mem.total > capacity:
            result.reject("does not fit in GPU memory")
            if result.smallest_misfit is None or mem.total < result.smallest_misfit.memory.total:
                result.smallest_misfit = Candidate(layout, mem, None)  # type: ignore[arg-type]
            continue
        result.add(Candidate(layout, mem, estimate(cfg, layout, cluster, precision)))
    rank(result.ranked, capacity)
    del result.ranked[top * 50 :]
    return result


def _made_to_fit(
    cfg: ModelConfig,
    layout: Layout,
    cluster: Cluster,
    precision: str,
    fixed: dict,
    offload_zero: tuple[int, ...] | None,
) -> tuple[Layout, StageMemory] | None:
    """The layout as the search evaluates it, with its peak memory: with the optimizer in
    host memory (ZeRO-Offload) where only that fits — unless ``fixed`` says whether to
    offload, or the stack offloads only under the ZeRO stages ``offload_zero`` — and, for a
    full recomputation the user did not choose, in as few blocks as still fit
    (:func:`fewest_recomputed`). None for a full-recompute layout that fits without
    recomputation: that layout is a candidate of its own."""
    capacity = cluster.gpu.memory_bytes
    mem = peak_memory(cfg, layout, precision)
    # one data-parallel rank: any ZeRO stage is its whole optimizer (Megatron's distributed
    # optimizer over one rank)
    offloads = offload_zero is None or layout.zero in offload_zero or layout.grad_group == 1
    if (
        mem.total > capacity
        and "offload" not in fixed
        and cluster.gpu.host_link_bandwidth
        and offloads
    ):
        # what does not fit may with the optimizer in host memory (ZeRO-Offload)
        offloaded = layout.replace(offload=True)
        offloaded_mem = peak_memory(cfg, offloaded, precision)
        if offloaded_mem.total <= capacity and host_holds(cfg, offloaded, cluster.gpu, precision):
            layout, mem = offloaded, offloaded_mem
    # a chosen --recompute full means every block (as paracube train takes it)
    user_chose = "recompute" in fixed or "recompute_blocks" in fixed
    if mem.total <= capacity and layout.recompute == "full" and not user_chose:
        return fewest_recomputed(cfg, layout, mem, capacity, precision)
    return layout, mem


def host_holds(cfg: ModelConfig, offloaded: Layout, gpu: GPU, precision: str) -> bool:
    """Whether a GPU's share of its node's host memory holds the states ``offloaded`` moves
    there: what the GPU keeps without offload, less what it keeps with it."""
    kept = peak_memory(cfg, offloaded.replace(offload=False), precision).model_states
    moved = kept - peak_memory(cfg, offloaded, precision).model_states
    return moved <= gpu.host_memory_bytes


def with_hybrid_shards(layouts, gpus_per_node: int, zero: int = 3):
    """Each layout, and after a layout of ZeRO stage ``zero`` whose data-parallel group spans
    nodes its hybrid sharding twin: ZeRO within each node's members of the group (shard =
    GPUs per node ÷ tp, as FSDP's HYBRID_SHARD does by default and InternLM's zero1=8 does
    for ZeRO-1), replicated across nodes."""
    for layout in layouts:
        yield layout
        shard = gpus_per_node // layout.tp
        fits = 1 < shard < layout.grad_group and layout.grad_group % shard == 0
        # not under a pipeline's per-step ZeRO-3, nor for a ZeRO-1 that reduce-scatters:
        # neither is planned in groups (Layout refuses them)
        scattered = layout.zero == 1 and layout.grad_sync == "reduce-scatter"
        if layout.zero == zero and fits and not layout.zero3_per_step and not scattered:
            yield layout.replace(shard=shard)


# Context parallelism is searched only while each rank's chunks keep this many tokens: the
# ring cuts every sequence into 2·cp chunks, and below a few hundred tokens a chunk's
# attention no longer hides the keys and values it passes on (a search bound, not a rule of
# the time model, which times any cp it is given).
MIN_CP_CHUNK = 512


def context_parallel_sizes(cfg: ModelConfig, gpus: int) -> list[int]:
    """The context-parallel sizes searched for a stack that runs it: 1 and every power of
    two dividing the GPUs whose 2·cp chunks split the sequence evenly into
    :data:`MIN_CP_CHUNK` tokens or more."""
    sizes, cp = [1], 2
    while (
        gpus % cp == 0 and cfg.seq_len % (2 * cp) == 0 and cfg.seq_len // (2 * cp) >= MIN_CP_CHUNK
    ):
        sizes.append(cp)
        cp *= 2
    return sizes


def fewest_recomputed(
    cfg: ModelConfig, layout: Layout, mem: StageMemory, capacity: float, precision: str
) -> tuple[Layout, StageMemory] | None:
    """A full-recompute layout that fits, with recomputation in as few of the model's first
    blocks as still fit (the engine's --recompute-blocks): memory falls as blocks are
    added, so the fewest is found by bisection; every block if none fewer fits; None when
    the layout fits without recomputation."""
    if peak_memory(cfg, layout.replace(recompute="none"), precision).total <= capacity:
        return None
    low, high = 0, cfg.n_layers  # high fits (it is every block), low = no recompute
    best = (layout, mem)
    while high - low > 1:
        mid = (low + high) // 2
        trial = layout.replace(recompute_blocks=mid)
        trial_mem = peak_memory(cfg, trial, precision)
        if trial_mem.total <= capacity:
            high, best = mid, (trial, trial_mem)
        else:
            low = mid
    return best


def simplicity(layout: Layout) -> tuple:
    """Fewer moving parts first: no offload, less model parallelism (a pipeline stage
    more is a partition, a bubble and a balance to keep; a ZeRO stage is a sharded
    optimizer), no ZeRO, sharded over the whole group rather than hybrid, the stack's plain
    pipeline split, no recompute, fewer (larger) micro-batches."""
    return (
        layout.offload,
        layout.pp,
        layout.tp,
        layout.zero,
        layout.shard > 0,  # hybrid sharding: a replica group more to reduce over
        layout.split == "even-ends",  # two more flags to set
        ("none", "selective", "op", "full").index(layout.recompute),
        layout.chunks,
        layout.microbatches,
    )


# A layout whose peak memory comes within this share of its GPU's (the fragmentation
# allowance included) is "at the memory edge": there PyTorch's caching allocator can run out
# of cached blocks and free and re-allocate them inside the step — cudaMalloc retries — which
# the time model does not charge (published at 19–38 % of an FSDP step: pytorch/pytorch#104509,
# Lightning-AI/lightning-thunder#420). rank puts such a layout after an equally fast one with
# room; --explain gives it the allocator's caveat (report.memory_edge).
MEMORY_EDGE = 0.05


def at_memory_edge(memory_bytes: float, capacity: float) -> bool:
    """Whether a peak of ``memory_bytes`` on a GPU of ``capacity`` is within
    :data:`MEMORY_EDGE` of it.

    >>> at_memory_edge(76e9, 80e9), at_memory_edge(75.9e9, 80e9)
    (True, False)
    """
    return memory_bytes >= (1 - MEMORY_EDGE) * capacity


def rank(cands: list[Candidate], capacity: float) -> None:
    """Fastest first, in steps of 1 % of the best speed — differences below the model's
    resolution — and within a step the layouts with room before those at the memory edge of
    a GPU of ``capacity`` bytes (:func:`at_memory_edge`: a risk the step time does not
    carry), then the simpler layout first."""
    if not cands:
        return
    best = max(c.time.tokens_per_s for c in cands)
    cands.sort(
        key=lambda c: (
            int((best - c.time.tokens_per_s) / (0.01 * best)),
            at_memory_edge(c.memory.total, capacity),
            simplicity(c.layout),
        )
    )
