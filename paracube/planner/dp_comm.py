"""Data parallelism's communication time for one rank (pure math): the gradient
reduction in the dtype it is reduced in — an all-reduce, or ZeRO's reduce-scatter, with
ZeRO-3's parameter all-gathers unit by unit — on the group's link (:func:`dp_link`: NVLink
inside a node, across nodes k members' rails), overlapped with the backward of the last
micro-batch: only what sticks out is counted, and never less than the last bucket
(:func:`last_bucket_time`, each stack's buckets: :func:`bucket_elements`); ZeRO-1/2's
all-gather of the updated parameters after the step (:func:`param_sync_time`); hybrid
sharding's all-reduce across the replicas (:func:`hybrid_exposed_time`); a compressed
reduction (:func:`compressed_reduction`). What hides slows the compute it runs beside
(:data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN`). One owner,
:func:`dp_exposed_time`, which :mod:`paracube.planner.time_model` adds to each rank's step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from paracube.choices import gradient_bytes
from paracube.config import ModelConfig
from paracube.models import shapes
from paracube.planner.collectives import (
    OVERLAP_SLOWDOWN,
    group_link,
    half_ring,
    node_crossings,
    ring,
)
from paracube.planner.hardware import GPU, Interconnect
from paracube.planner.layout import Layout

if TYPE_CHECKING:
    from paracube.planner.time_model import Cluster


def reduction_time(
    params: float, layout: Layout, link: Interconnect, elem: int, blocks: int = 0
) -> float:
    """Seconds of one rank's gradient reduction over ``params`` elements on ``link``, once per
    step: a ring all-reduce of the gradients in the dtype they are reduced in (``elem``-byte
    weights; :func:`~paracube.choices.gradient_bytes`) — under ZeRO-1 too, unless it reduces
    them as Megatron-Core's distributed optimizer does (``grad_sync="reduce-scatter"``: each
    bucket reduce-scattered, ``_ParamAndGradBucketGroup.start_grad_sync``, each rank keeping
    only the slice it steps); under ZeRO-2 a reduce-scatter (half a
    ring: each rank keeps only its slice); under ZeRO-3 that, plus the backward's and the
    forward's parameter all-gathers (half a ring each, in the weights' dtype), unit by unit
    over the rank's ``blocks`` (:func:`zero3_collectives`). The reduce-scatters of the
    micro-batches before the last: :func:`scatter_time`."""
    grads = params * gradient_bytes(elem, layout.grad_reduce)
    n = layout.grad_group
    if layout.zero == 1 and layout.grad_sync == "reduce-scatter":
        return half_ring(grads, n, link)
    if layout.zero < 2:
        return ring(grads, n, link)
    scatter = scatter_time(params, layout, link, elem, blocks)
    if layout.zero == 2:
        return scatter
    forward, backward, _ = zero3_collectives(blocks)
    gathers = 2 * half_ring(params * elem, n, link)
    return (
        scatter
        + gathers
        + unit_latency(layout, link, forward)
        + unit_latency(layout, link, backward)
    )


def zero3_collectives(blocks: int) -> tuple[int, int, int]:
    """(forward all-gathers, backward all-gathers, reduce-scatters) of one micro-batch under
    ZeRO-3 for a rank of ``blocks`` blocks: one per unit — each block, and the root (the
    embedding, final norm and head), which stays gathered from its forward to the end of the
    backward, so the backward gathers the blocks only (paracube's ``data_parallel/zero3.py``,
    whose ledger counts exactly these: ``tests/test_zero.py``; FSDP's auto-wrapped blocks
    under its root, Zhao et al. 2023 §3). ``blocks`` 0: the rank's parameters as one unit."""
    if blocks <= 0:
        return 1, 1, 1
    return blocks + 1, blocks, blocks + 1


def unit_latency(layout: Layout, link: Interconnect, collectives: int) -> float:
    """The latency a ZeRO-3 pass over a rank's parameters adds by being cut into
    ``collectives`` rings (:func:`zero3_collectives`): a half ring's (n − 1) latency steps for
    each one after the first, whose are in the pass's own half ring. 0 below ZeRO-3."""
    if layout.zero != 3 or collectives <= 1:
        return 0.0
    return (collectives - 1) * (layout.grad_group - 1) * link.latency * link.pair_cost_ratio


def scatter_time(
    params: float, layout: Layout, link: Interconnect, elem: int, blocks: int = 0
) -> float:
    """Seconds of one micro-batch's gradient reduce-scatter under ZeRO-2/3 (half a ring of
    the gradients). These stages keep no full gradients between micro-batches, so every
    backward reduce-scatters its own — paracube's engine refuses ``no_sync`` there
    (data_parallel/zero3.py, ``accumulates_locally``), as FSDP FULL_SHARD reduce-scatters each
    backward unless asked not to (PyTorch FSDP ``no_sync``: "gradients will be accumulated in
    module variables" — unsharded, which ZeRO-3 exists to avoid) and DeepSpeed's ZeRO-2
    reduces in every backward's hooks."""
    if layout.zero < 2:
        return 0.0
    grads = params * gradient_bytes(elem, layout.grad_reduce)
    scatters = zero3_collectives(blocks)[2]
    return half_ring(grads, layout.grad_group, link) + unit_latency(layout, link, scatters)


def dp_exposed_time(
    layout: Layout,
    cluster: Cluster,
    params: float,
    per_mb: float,
    cfg: ModelConfig | None = None,
    layers: int = 0,
    elem: int = 2,
    root: float | None = None,
) -> float:
    """The step time data-parallel communication costs for a rank of ``params`` parameters:
    the gradient reduction (:func:`reduction_time`) less what hides behind the last backward
    (a compressed reduction: its own volume, plus the work of compressing,
    :func:`compressed_reduction`) — never less than its last bucket, or under ZeRO-3 its
    ``root`` unit (:func:`last_bucket_time`; by default what of ``params`` the ``layers``
    blocks of ``cfg`` do not hold, all of them without); under ZeRO-1/2 the all-gather of the
    updated parameters less what hides behind the next forward; under ZeRO-3 the parameter
    gathers of every micro-batch less what hides behind its compute — and, for what does
    hide, the compute it slows down (:data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN`)."""
    if layout.zero == 3 and layout.shard and layout.replicas > 1:
        return hybrid_exposed_time(layout, cluster, params, per_mb, cfg, layers, elem, root)
    if layout.zero3_per_step:
        return per_step_exposed_time(layout, cluster, params, per_mb, layers, elem)
    g, dp, m = cluster.gpu, layout.grad_group, layout.microbatches
    link = dp_link(layout, cluster)
    waited = waited_gathers(layout, link, params, elem, layers)
    # the first micro-batch's backward gathers hide with the reduction unless waited for
    allreduce = reduction_time(params, layout, link, elem, layers) - waited / m
    blocking = 0.0
    if layout.compress != "none" and dp > 1:
        allreduce, blocking = compressed_reduction(layout, cfg, g, link, params, layers)
    overlapped = g.overlaps_communication and layout.overlap_grad_reduce
    # behind the last micro-batch's backward, when buckets are reduced as they fill — all
    # but the last bucket, which fills when the backward ends: it is always waited for
    hidden = 2 / 3 * per_mb if overlapped else 0.0
    if root is None and layout.zero == 3 and cfg is not None and layers:  # what blocks don't hold
        root = params - layers * shapes.block_params(
            cfg, tp=layout.tp, ep=layout.ep, etp=layout.expert_tp
        )
    last = last_bucket_time(layout, link, params, elem, root)
    exposed = max(allreduce - hidden, last) + blocking
    exposed += waited
    if layout.zero in (1, 2):  # the updated slices, over the ZeRO group (a hybrid one's own)
        gather = param_sync_time(layout, cluster, params, elem, cfg, layers)
    else:  # ZeRO-3: all parameters from every rank's slice
        gather = half_ring(params * elem, dp, link)
    forward = per_mb / 3 if g.overlaps_communication else 0.0  # a micro-batch's forward
    beside_compute = min(allreduce, hidden)  # seconds of collectives running beside compute
    if layout.zero in (1, 2) and dp > 1:
        # after the optimizer step each rank's updated slice is all-gathered back into the
        # full parameters (Rajbhandari et al. 2020, P_os / P_os+g) before the next forward
        # can start; with overlapped reductions (Megatron's --overlap-param-gather) it hides
        # behind the first micro-batch's forward
        behind = forward if layout.overlap_grad_reduce else 0.0
        exposed += max(0.0, gather - behind)
        beside_compute += min(gather, behind)
    if layout.zero == 3:  # parameters re-gathered for every micro-batch's forward and backward,
        # unit by unit, behind its compute (or waited for: waited_gathers)
        forwards = zero3_collectives(layers)[0]
        passes = [gather + unit_latency(layout, link, forwards)]
        if layout.backward_prefetch:
            passes.append(backward_gather_time(layout, link, params, elem, layers))
        for one_pass in passes:
            exposed += (m - 1) * max(0.0, one_pass - forward)
            beside_compute += (m - 1) * min(one_pass, forward)
    if layout.zero >= 2 and dp > 1:
        # every micro-batch before the last reduce-scatters its gradients during its own
        # backward, unit by unit as they are ready, on the link the prefetched gathers use
        scatter = scatter_time(params, layout, link, elem, layers)
        backward = 2 * per_mb / 3 if overlapped else 0.0
        if layout.zero == 3 and layout.backward_prefetch:  # the gathers share the stream
            backward = max(0.0, backward - backward_gather_time(layout, link, params, elem, layers))
        exposed += (m - 1) * max(0.0, scatter - backward)
        beside_compute += (m - 1) * min(scatter, backward)
    return exposed + OVERLAP_SLOWDOWN * beside_compute


def backward_gather_time(
    layout: Layout, link: Interconnect, params: float, elem: int, blocks: int = 0
) -> float:
    """Seconds of one micro-batch's ZeRO-3 backward all-gathers: half a ring of ``params``
    ``elem``-byte weights over the data-parallel group, unit by unit over the rank's
    ``blocks`` (:func:`zero3_collectives`). Prefetched, they run on the stream the backward's
    reduce-scatters use, and hide behind that backward's compute."""
    one_pass = half_ring(params * elem, layout.grad_group, link)
    return one_pass + unit_latency(layout, link, zero3_collectives(blocks)[1])


def per_step_exposed_time(
    layout: Layout,
    cluster: Cluster,
    params: float,
    per_mb: float,
    layers: int = 0,
    elem: int = 2,
) -> float:
    """The step time ZeRO-3 under a pipeline costs when each stage is gathered once a step
    (``Layout.zero3_per_step``: torchtitan's FSDP2 under PyTorch's pipelining). Its
    parameters are all-gathered unit by unit in the first micro-batch's forward, each unit's
    gather prefetched behind the one before it — hidden behind that forward, slowing it by
    :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN` of what hides — and kept through every micro-batch; its
    gradients are reduce-scattered, unit by unit, only once the stage's last backward is
    done: PyTorch's schedule runs FSDP's post-backward by hand after it
    (torch/distributed/pipelining/stage.py, ``backward_maybe_with_nosync``), so nothing is
    left to hide them behind on the first stage, which finishes last."""
    dp, link = layout.grad_group, dp_link(layout, cluster)
    if dp <= 1:
        return 0.0
    forwards = zero3_collectives(layers)[0]
    gather = half_ring(params * elem, dp, link) + unit_latency(layout, link, forwards)
    scatter = scatter_time(params, layout, link, elem, layers)  # once, after the last backward
    forward = per_mb / 3 if cluster.gpu.overlaps_communication else 0.0
    return max(0.0, gather - forward) + scatter + OVERLAP_SLOWDOWN * min(gather, forward)


def param_sync_time(
    layout: Layout,
    cluster: Cluster,
    params: float,
    elem: int,
    cfg: ModelConfig | None = None,
    layers: int = 0,
) -> float:
    """Seconds ZeRO-1/2 take to bring every rank's updated slice of ``params`` ``elem``-byte
    weights back into the full parameters after the step, over the ZeRO group — every
    data-parallel rank, or under hybrid sharding (``Layout.shard``) one group of consecutive
    ranks, on that group's own link (:func:`~paracube.planner.collectives.group_link`: within a node, NVLink). One ring
    all-gather (``param_sync="all-gather"``: Rajbhandari et al. 2020, P_os), or one
    broadcast from each rank that owns parameters, in turn (``"broadcast"``: InternLM's
    ``HybridZeroOptimizer.broadcast_params``, one ``dist.broadcast`` of each owner's flat
    slice; a rank that owns none skips its turn): the same bytes through each GPU, but every
    broadcast is a chain of its own that fills hop by hop before its bytes stream
    (:func:`chain_fill_time`: each hop's latency and a chunk), so the fill is paid once per
    owner — up to z(z − 1) hops, against a ring all-gather's z − 1 latency steps. The
    owners of a ``cfg`` of ``layers`` blocks: :func:`broadcasting_ranks`; without one, all z."""
    z = layout.shard_group
    if z <= 1:
        return 0.0
    link = group_link(cluster, z, layout.tp)
    if layout.param_sync == "broadcast":
        owners = z if cfg is None else broadcasting_ranks(cfg, z, layout.tp, layers)
        return params * elem / link.bandwidth + owners * chain_fill_time(cluster, z, layout.tp)
    return half_ring(params * elem, z, link)


# NCCL moves a broadcast down its chain one chunk at a time, each rank forwarding a chunk as
# it arrives (src/device/broadcast.h, runRing): a chunk is one step of the Simple protocol's
# buffer — NCCL_BUFFSIZE's default 4 MiB (src/init.cc, DEFAULT_BUFFSIZE) over NCCL_STEPS = 8
# (src/include/device.h) — and a broadcast's chunk is one step (src/include/collectives.h,
# BROADCAST_CHUNKSTEPS 1): 512 KiB.
BROADCAST_CHUNK = 4 * 2**20 / 8


def chain_fill_time(cluster: Cluster, ranks: int, stride: int) -> float:
    """Seconds a broadcast down a chain of ``ranks`` GPUs (consecutive members ``stride`` GPUs
    apart, ordered as :func:`~paracube.planner.collectives.group_link` orders them) takes
    to bring its first chunk to the last rank: each of the ranks − 1 hops pays its step
    latency and one chunk (:data:`BROADCAST_CHUNK`) at its own link's rate per GPU — NVLink
    within a node, the network across
    (:func:`~paracube.planner.collectives.node_crossings` of them). The bytes that follow
    stream behind it.
    A ring all-gather pays no such fill: every rank sends its own slice at once.

    >>> from paracube.planner import hardware as hw
    >>> from paracube.planner.time_model import Cluster
    >>> roce = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"),
    ...                hw.interconnect("roce-4x100"))
    >>> round(chain_fill_time(roce, 8, 1) * 1e6), round(chain_fill_time(roce, 16, 1) * 1e6)
    (39, 176)
    """
    hops = ranks - 1
    crossing = node_crossings(cluster, ranks, stride)
    inter, intra = cluster.inter, cluster.intra
    return crossing * (inter.latency + BROADCAST_CHUNK / inter.bandwidth) + (hops - crossing) * (
        intra.latency + BROADCAST_CHUNK / intra.bandwidth
    )


def broadcasting_ranks(cfg: ModelConfig, z: int, tp: int = 1, layers: int = 0) -> int:
    """How many of a ZeRO group's ``z`` ranks own parameters — and so broadcast — when
    InternLM's ``ParamBcastSyncHandler`` deals a rank of ``layers`` blocks (0: all of
    ``cfg``'s, with the embedding before them and the head after) out tensor by tensor, in
    module order: a rank takes tensors until their count passes 1.01 × the average slice,
    and the tensor that passes it starts the next rank, whose count restarts from 0
    (InternLM/InternLM, ``internlm/solver/optimizer/utils.py``). So a tensor larger than the
    average slice always opens a rank of its own, and once the group outnumbers the model's
    weight matrices — 162 for InternLM-7B: its embedding and head, and per block the fused
    q|k|v, the output projection and SwiGLU's w1, w3 and w2 — the other ranks own nothing.
    Each matrix is counted as InternLM's modules hold it (gate and up apart), its ``tp``
    shard; norms and biases are too small to move the count.

    >>> from paracube.planner.published import internlm_7b
    >>> [broadcasting_ranks(internlm_7b(), z) for z in (8, 64, 1024)]
    [8, 44, 162]
    """
    matrices = [lin.in_features * lin.out_features / tp for lin in shapes.block_linears(cfg)]
    if cfg.activation == "swiglu":  # the fused gate | up as InternLM holds it: w1 and w3
        matrices[2:3] = [matrices[2] / 2, matrices[2] / 2]
    whole = layers in (0, cfg.n_layers)
    sizes = matrices * (layers or cfg.n_layers)
    if whole:
        table = cfg.vocab_size * cfg.hidden / tp
        sizes = [table, *sizes, *([] if cfg.tie_embeddings else [table])]
    share = 1.01 * sum(sizes) / z
    rank, counted, owners = 0, 0.0, set()
    for size in sizes:
        counted += size
        if counted > share and rank < z - 1:
            rank, counted = rank + 1, 0.0
        owners.add(rank)
    return len(owners)


def hybrid_exposed_time(
    layout: Layout,
    cluster: Cluster,
    params: float,
    per_mb: float,
    cfg: ModelConfig | None = None,
    layers: int = 0,
    elem: int = 2,
    root: float | None = None,
) -> float:
    """The step time hybrid sharding's communication costs (``Layout.shard``): ZeRO-3 within
    each shard group — its gathers and reduce-scatters on that group's link, as
    :func:`dp_exposed_time` times them for a data-parallel group of ``shard`` ranks — and,
    after each unit's reduce-scatter in every backward, an all-reduce of the unit's gradient
    shard across the replicas: PyTorch FSDP's HYBRID_SHARD reduce-scatters in the shard
    group and then all-reduces the shard over the replicate group
    (torch/distributed/fsdp/_runtime_utils.py ``_reduce_grad``; FSDP2's ``foreach_reduce``
    with its all-reduce group), on the stream the reduce-scatters run on, beside the
    backward. One ring per unit over the replicas, tp × shard GPUs apart
    (:func:`~paracube.planner.collectives.group_link`); what the backward leaves free after the group's own gathers and
    reduce-scatter hides it (slowing that compute by :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN` of its
    seconds), the rest is exposed — every micro-batch."""
    view = layout.replace(dp=layout.shard, cp=1, shard=0)  # one shard group, FULL_SHARD
    exposed = dp_exposed_time(view, cluster, params, per_mb, cfg, layers, elem, root)
    g, m, n = cluster.gpu, layout.microbatches, layout.replicas
    link = group_link(cluster, n, layout.tp * layout.shard)
    grads = params / layout.shard * gradient_bytes(elem, layout.grad_reduce)
    units = zero3_collectives(layers)[2]
    allreduce = ring(grads, n, link) + (units - 1) * 2 * (n - 1) * link.latency
    overlapped = g.overlaps_communication and layout.overlap_grad_reduce
    backward = 2 * per_mb / 3 if overlapped else 0.0
    own = dp_link(view, cluster)
    busy = scatter_time(params, view, own, elem, layers)
    if layout.backward_prefetch:  # the backward's gathers share the stream (dp_exposed_time)
        busy += backward_gather_time(view, own, params, elem, layers)
    free = max(0.0, backward - busy)
    return exposed + m * (max(0.0, allreduce - free) + OVERLAP_SLOWDOWN * min(allreduce, free))


def waited_gathers(
    layout: Layout, link: Interconnect, params: float, elem: int, blocks: int = 0
) -> float:
    """Seconds of ZeRO-3 backward all-gathers nothing hides, per step: without backward
    prefetching (FSDP1's ``BACKWARD_POST``) a unit's gather is issued only "after the current
    set of parameters' gradient computation" (PyTorch, ``torch.distributed.fsdp.
    BackwardPrefetch``), so the next unit's backward waits for it — every micro-batch's
    backward waits for all of its rank's parameters, a half ring of ``params`` ``elem``-byte
    weights, unit by unit over its ``blocks`` (:func:`zero3_collectives`). 0 with
    prefetching, or below ZeRO-3."""
    if layout.zero != 3 or layout.backward_prefetch or layout.grad_group == 1:
        return 0.0
    return layout.microbatches * backward_gather_time(layout, link, params, elem, blocks)


def dp_link(layout: Layout, cluster: Cluster) -> Interconnect:
    """The link a data-parallel ring runs at, per GPU (:func:`~paracube.planner.collectives.group_link`): dp × cp ranks,
    tensor-parallel groups between consecutive members."""
    return group_link(cluster, layout.grad_group, layout.tp)


# Megatron-Core's bucket: DistributedDataParallelConfig.bucket_size defaults to
# max(40,000,000, 1,000,000 × the data-parallel size) elements
MEGATRON_BUCKET, MEGATRON_BUCKET_PER_RANK = 40e6, 1e6


# InternLM's configs: hybrid_zero_optimizer reduce_bucket_size = 512 * 1024 * 1024 (elements)
INTERNLM_BUCKET = 512 * 1024 * 1024


def bucket_elements(layout: Layout, elem: int) -> float:
    """Gradient elements per reduction bucket under ``layout.grad_bucket``
    (:data:`~paracube.choices.GRAD_BUCKETS`): ``layout.bucket_mb`` MiB of gradients in the
    dtype they are reduced in (``ddp``: paracube train's --bucket-mb, 25 by default as PyTorch
    DDP's bucket_cap_mb); Megatron-Core's max(40M, 1M × dp) — larger groups get larger
    buckets so that each collective's 2(dp − 1) latency steps stay small beside its
    transfer time (``megatron``); InternLM's 512M (``internlm``).

    >>> bucket_elements(Layout(dp=96, grad_bucket="megatron"), 2)
    96000000.0
    >>> bucket_elements(Layout(dp=96, grad_reduce="compute"), 2)  # 25 MiB of bf16
    13107200.0
    """
    if layout.grad_bucket == "megatron":
        return max(MEGATRON_BUCKET, MEGATRON_BUCKET_PER_RANK * layout.grad_group)
    if layout.grad_bucket == "internlm":
        return float(INTERNLM_BUCKET)
    return layout.bucket_mb * 2**20 / gradient_bytes(elem, layout.grad_reduce)


def last_bucket_time(
    layout: Layout, link: Interconnect, params: float, elem: int, root: float | None = None
) -> float:
    """The reduction nothing can hide: the last bucket (the first blocks' and the embedding's
    gradients) is complete only when the backward ends. Its ring takes 2(dp − 1) latency
    steps, and under Megatron-Core's buckets its size grows with the group
    (:func:`bucket_elements`), so at fixed work per replica the step slows as replicas are
    added. ZeRO-3 reduces unit by unit rather than in buckets: its last reduce-scatter is the
    root unit's — the embedding, final norm and head, ``root`` of the ``params`` (all of them
    when None: one unit), whose gradients complete with the backward (:func:`zero3_collectives`;
    FSDP's root). Without overlap the whole reduction is exposed anyway (0 here)."""
    if layout.grad_group <= 1 or not layout.overlap_grad_reduce:
        return 0.0
    if layout.zero == 3:
        return scatter_time(params if root is None else min(root, params), layout, link, elem)
    bucket = bucket_elements(layout, elem)
    return reduction_time(min(params, bucket), layout, link, elem)


def compressed_reduction(
    layout: Layout,
    cfg: ModelConfig | None,
    g: GPU,
    link: Interconnect,
    n: float,
    layers: int,
) -> tuple[float, float]:
    """(seconds of the compressed reduction that can overlap the backward, seconds that
    block it) for one rank's gradient of ``n`` elements:

    - fp16/bf16: a ring all-reduce of 2 bytes per element, plus the casts (read and write);
    - topk:R: an all-gather of ⌈R·n⌉ (int32 index, value) pairs from every rank — a ring
      all-gather moves (dp − 1)/dp of the gathered bytes — plus selecting them (four passes
      over the gradient in HBM: magnitude, selection, gather, the residual) and densifying;
    - powersgd:r: per matrix M (n × m) the factors P (n × r) and Q (m × r), each all-reduced
      in turn, and four matmuls of 2·n·m·r FLOPs (Vogels et al. 2019, Algorithm 1: P = MQ,
      Q = MᵀP, the approximation PQᵀ, the error M − PQᵀ), each touching the n × m matrix
      once in HBM — at r ≪ n, m memory-bound (2r FLOPs per 4-byte element): the roofline of
      the two; the vectors whole. paracube runs it in the gradient hook, so it blocks the
      backward: nothing of it hides.
    """
    dp, elem = layout.grad_group, 4  # what the compressors read and write: fp32 gradient buffers
    kind, _, value = layout.compress.partition(":")
    if kind in ("fp16", "bf16"):
        return ring(2 * n, dp, link), 2 * (elem + 2) * n / g.memory_rate
    if kind == "topk":
        k = math.ceil(float(value) * n)
        gathered = dp * k * (4 + elem)
        comm = (dp - 1) / dp * gathered / link.bandwidth + (dp - 1) * link.latency
        work = (4 * elem * n + gathered) / g.memory_rate
        return comm, work
    assert cfg is not None, "PowerSGD's volume needs the model's matrix shapes"
    r = int(value)
    dims = shapes.block_matrix_dims(cfg, layout.tp)
    factors = layers * sum((a + b) * r for a, b in dims)
    matrix_elements = layers * sum(a * b for a, b in dims)
    vectors = max(0.0, n - matrix_elements)  # biases, norms (and what is not a block's)
    comm = ring(elem * factors / 2, dp, link) * 2 + ring(elem * vectors, dp, link)
    flops = layers * sum(4 * 2 * a * b * r for a, b in dims)
    work = max(
        flops / (g.peak_flops * g.sustained_fraction), 4 * elem * matrix_elements / g.memory_rate
    )
    return 0.0, comm + work
