"""What the model-parallel dimensions' communication costs a step (pure math): tensor
parallelism's collectives per block and those outside the blocks, a mixture's all-to-alls
between the experts' ranks and how many rows they carry, and the pipeline's sends at its
stage boundaries — each with what the software's overlap (``Layout.tp_comm_overlap``,
``Layout.ep_comm_overlap``) leaves on the step. Built on the rings of
:mod:`paracube.planner.collectives`; :mod:`paracube.planner.time_model` adds them to a
rank's step, as it adds data parallelism's from :mod:`paracube.planner.dp_comm`. The
context-parallel ring, which overlaps the attention core, is the time model's
(``time_model.cp_comm_time``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from paracube.config import ModelConfig
from paracube.planner.collectives import OVERLAP_SLOWDOWN, ring
from paracube.planner.layout import Layout

if TYPE_CHECKING:  # the cluster is the time model's; only its links are read here
    from paracube.planner.time_model import Cluster


def ep_comm_time(cfg: ModelConfig, layout: Layout, cluster: Cluster) -> float:
    """Seconds of a mixture's all-to-alls for one block and micro-batch, forward and
    backward (0 for a dense block or ep = 1): the token dispatcher sends each of the rank's
    N = b·s tokens (its s/cp under context parallelism) to the ranks of its k experts and the
    experts' outputs back — two all-to-alls of k·N 16-bit hidden vectors forward
    (Megatron-Core's MoEAlltoAllTokenDispatcher: dispatch and combine, in bf16 also under
    FP8) and their two in backward, on the compute stream, waited for (the overlap of
    expert-parallel communication came in 2025, --overlap-moe-expert-parallel-comm). The
    ep ranks are tp × cp apart (Megatron-Core's order tp-cp-ep-dp-pp): each sends 1/ep of
    its bytes to every other member — to those on its node over NVLink, to the others
    through its own network port (an all-to-all's bytes do not spread over the node's
    rails as a ring's do) — and pays a latency step per peer. Under tensor parallelism the
    dispatcher sends every token's 1/t slice of the hidden vector (its hidden-parallel
    layout, :func:`moe_tp_rings`): each of the t ranks 1/t of the bytes. Folded
    (:attr:`Layout.folded`), each rank sends its own N/t tokens whole — the same bytes — to
    expert-parallel ranks etp apart (Megatron-Core's expert order etp-ep-edp-pp). DeepEP's
    dispatch (``Layout.ep_dispatch``) sends a token once to each rank it reaches, not once per
    expert — and to another node once, whatever number of its ranks the token reaches
    there: DeepEP's normal kernels forward between the RDMA and the NVLink domain
    (deepseek-ai/DeepEP, README, "Normal kernels with NVLink and RDMA forwarding";
    ``Buffer.get_dispatch_layout`` counts ``num_tokens_per_rdma_rank``, a token once per
    node, and each row sent over RDMA carries the bits of the ranks on that node it is then
    copied to, ``SourceMeta.is_token_in_nvl_rank_bits`` in csrc/kernels/internode.cu).
    :func:`dispatched_rows` counts the rows a token sends to a peer, or to a peer node."""
    ep = layout.ep
    if not cfg.moe or ep <= 1:
        return 0.0
    n = layout.micro_batch * cfg.seq_len
    row = n * cfg.hidden * 2 / layout.tp  # bytes of a row for each of the rank's tokens
    stride = layout.expert_tp if layout.folded else layout.tp * layout.cp
    here = min(ep, max(1, cluster.gpus_per_node // stride))  # members on this rank's node
    local = (here - 1) * dispatched_rows(cfg, layout) * row / cluster.intra.bandwidth
    if here == ep:
        one = local + (ep - 1) * cluster.intra.latency
    else:
        # to each of the (ep − here)/here other nodes of the group, through this rank's port:
        # a row per member reached (all-to-all) or one per node reached (DeepEP)
        nodes = (ep - here) / here
        remote = nodes * dispatched_rows(cfg, layout, here) * row / cluster.inter.bandwidth
        one = max(local, remote) + (ep - 1) * cluster.inter.latency
    return 4 * one


def dispatched_rows(cfg: ModelConfig, layout: Layout, members: int = 1) -> float:
    """Copies of a token's hidden vector its rank's dispatcher sends to ``members``
    consecutive other members of the expert-parallel group (one rank, or a node's), on
    average (E experts, k a token, E/ep on each rank, in order).

    Megatron-Core's all-to-all sends a row per token and expert (``alltoall``):
    members · k/ep. DeepEP sends a token once to each rank — or node — that holds any of its
    experts (``deepep``), which copies it to them there: the chance that the members hold
    one of them — for k of the E experts drawn at random (``top-k``), with H = members · E/ep
    of them held there, 1 − C(E − H, k)/C(E, k); under group-limited routing
    (``cfg.route_groups`` G groups of E/G, ``route_group_topk`` g of them chosen a token,
    DeepSeek-V3's node-limited routing) the g groups drawn at random and k/g experts in each
    — what Megatron-Core's group top-k gives under random scores (the chosen groups are
    those whose top k/g score highest: nearly always each takes k/g) —, so members spanning
    whole groups are reached as 1 − C(G − H·G/E, g)/C(G, g), members within one group as
    g/G · (1 − C(E/G − H, k/g)/C(E/G, k/g)); for the round-robin gate's k consecutive
    experts, the groups of H they span, averaged over tokens, ÷ (ep/members).

    >>> from paracube.models.presets import preset
    >>> qwen3 = preset("qwen3-30b-a3b")  # 128 experts, 8 a token
    >>> round(dispatched_rows(qwen3, Layout(dp=8, ep=8)), 3)
    1.0
    >>> round(dispatched_rows(qwen3, Layout(dp=8, ep=8, ep_dispatch="deepep")), 3)
    0.667
    >>> dispatched_rows(qwen3, Layout(dp=8, ep=8, ep_dispatch="deepep", router="round-robin"))
    0.125
    >>> big = Layout(dp=32, ep=32, ep_dispatch="deepep")  # 4 nodes of 8 members, 4 experts each
    >>> round(dispatched_rows(qwen3, big), 3), round(dispatched_rows(qwen3, big, 8), 3)
    (0.23, 0.907)
    """
    k, experts, ep = cfg.experts_per_token, cfg.experts, layout.ep
    if layout.ep_dispatch == "alltoall":
        return members * k / ep
    held = members * experts // ep  # the members' experts
    if layout.router == "round-robin":  # token i: experts i·k … i·k + k − 1 (mod E)
        spans = [len({(i * k + j) % experts // held for j in range(k)}) for i in range(experts)]
        return sum(spans) / len(spans) / (ep // members)
    if cfg.route_groups:  # group-limited: g of G groups, k/g experts in each
        groups, chosen = cfg.route_groups, cfg.route_group_topk
        size, each = experts // groups, k // chosen
        if held >= size:  # the members hold whole groups (consecutive experts)
            return 1 - math.comb(groups - held // size, chosen) / math.comb(groups, chosen)
        return chosen / groups * (1 - math.comb(size - held, each) / math.comb(size, each))
    return 1 - math.comb(experts - held, k) / math.comb(experts, k)


def overlapped_ep_comm(comm: float, block: float, layout: Layout) -> float:
    """Seconds of one block's all-to-alls (``comm``, forward and backward, per micro-batch)
    left on the step under ``Layout.ep_comm_overlap``: Megatron-Core's combined 1F1B runs
    micro-batch i + 1's forward beside micro-batch i's backward layer by layer, each one's
    dispatch and combine on a stream of their own beside the other's attention and experts
    (DeepSeek-V3's pairing: DeepSeek-AI 2024, its technical report §3.2.1) — what
    ``block`` seconds of a pair's compute cannot cover waits, and the covered rest slows
    the compute it runs beside by
    :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN` of its seconds. Micro-batches
    without a partner — the pipeline's warm-up forwards and cool-down backwards on its first
    rank (2(p − 1) + (v − 1)p of the m·v chunks under interleaving; the first forward and the
    last backward without a pipeline) — wait for theirs."""
    m, v = layout.microbatches, layout.chunks
    unpaired = 1 if layout.pp == 1 else min(2 * (layout.pp - 1) + (v - 1) * layout.pp, m * v)
    share = unpaired / (m * (1 if layout.pp == 1 else v))
    hidden = min(comm, block)
    return share * comm + (1 - share) * (comm - hidden + OVERLAP_SLOWDOWN * hidden)


def blocks_tp_comm(
    cfg: ModelConfig,
    layout: Layout,
    cluster: Cluster,
    layers: int,
    elem: int,
    redone: int,
    gemms: float = 0.0,
) -> float:
    """Tensor-parallel collectives of one step of ``layers`` blocks of ``cfg``'s kind:
    four per block and micro-batch of b·s·h values (Shoeybi et al. 2019), one more
    forward's worth in each of the ``redone`` blocks under full recomputation."""
    m = layout.microbatches
    unredone = layout if layout.recompute == "none" else layout.replace(recompute="none")
    plain = block_tp_comm(cfg, unredone, cluster, elem, gemms)
    comm = m * layers * plain
    redoes = layout.recompute in ("full", "op") or (
        layout.recompute == "selective"
        and selectively_redone_rings(cfg, layout.recompute_modules, layout.tp, layout.expert_tp)
    )
    if redoes:  # what a recomputed block's forward gathers again
        redo = block_tp_comm(cfg, layout, cluster, elem, gemms) - plain
        comm += m * redone * redo
    return comm


def ends_tp_comm(cfg: ModelConfig, layout: Layout, cluster: Cluster, elem: int) -> float:
    """Tensor-parallel collectives of one step outside the blocks: the vocabulary-parallel
    embedding's all-reduce and the head's input gradient, and the loss's two all-reduces of
    (b, s) statistics."""
    t, m = layout.tp, layout.microbatches
    if t == 1:
        return 0.0
    n = layout.micro_batch * cfg.seq_len * cfg.hidden * elem  # b·s·h values
    link = cluster.intra if t <= cluster.gpus_per_node else cluster.inter
    return m * (2 * ring(n, t, link) + 2 * ring(layout.micro_batch * cfg.seq_len * 4, t, link))


def block_tp_comm(
    cfg: ModelConfig, layout: Layout, cluster: Cluster, elem: int, gemms: float = 0.0
) -> float:
    """One block's tensor-parallel collectives for one micro-batch: four of b·s·h values
    (Shoeybi et al. 2019), one more forward's worth under full recomputation; under sequence
    parallelism each an all-gather + reduce-scatter pair, and two more all-gathers in
    backward — the attention's and the MLP's inputs, of which their first linears keep only
    the sequence shard (Korthikanti et al. 2022 §4.2.2; paracube's
    ``_LinearWithInputCollective``, as Megatron's and Transformer Engine's linears) — what
    of them the step waits for: all of it, or under ``Layout.tp_comm_overlap`` what the
    block's matmuls (``gemms`` seconds, forward and backward) cannot hide
    (:func:`overlapped_tp_comm`)."""
    t = layout.tp
    n = layout.micro_batch * cfg.seq_len * cfg.hidden * elem  # b·s·h values
    link = cluster.intra if t <= cluster.gpus_per_node else cluster.inter
    # a recomputed forward redoes its collectives: every block's under full recomputation;
    # under op-level checkpointing too (its kept outputs come after the reductions, the
    # gathers before the first matmuls are redone — charged as full's, an upper bound)
    full = layout.recompute in ("full", "op")
    if cfg.moe:  # the MLP's collectives are the token dispatcher's: moe_tp_rings
        rings = moe_tp_rings(cfg, t, full, layout.expert_tp)
    else:
        rings = 4 * (1.5 if full else 1.0)
        if layout.sequence_parallel:  # pairs of half rings, and the two re-gathers: one ring
            rings += 1
    if cfg.mla:
        rings -= latent_gather_saving(cfg, full)
    if layout.recompute == "selective":
        rings += selectively_redone_rings(cfg, layout.recompute_modules, t, layout.expert_tp)
    comm = rings * ring(n, t, link)
    if layout.sequence_parallel:  # gathers and scatters at the cost the link measured them
        comm *= link.pair_cost_ratio
    if layout.tp_comm_overlap and t > 1:
        comm = overlapped_tp_comm(comm, gemms * (4 / 3 if full else 1.0), t)
    return comm


def selectively_redone_rings(
    cfg: ModelConfig, modules: tuple[str, ...], t: int, etp: int | None = None
) -> float:
    """The rings of b·s·h values a selective recomputation of ``modules`` moves again per
    block and micro-batch: the forward collectives inside what it replays — a dense MLP's
    (mlp: under sequence parallelism its input's all-gather and its output's reduce-scatter,
    without it one all-reduce; Megatron-Core's checkpoint wraps the whole MLP, its
    collectives with it), a mixture's MoE layer's (moe: the dispatcher's tensor-parallel
    collectives and the shared experts' pair, :func:`moe_tp_rings`' forward MLP part) or the
    shared experts' alone (shared_experts). The attention core, a latent attention's up
    projections (fed by latents gathered before the checkpoint) and the element-wise modules
    gather nothing."""
    if t == 1:
        return 0.0
    if not cfg.moe:
        return 1.0 if "mlp" in modules else 0.0
    shared = 1.0 if cfg.shared_expert_ffn else 0.0
    if "moe" in modules:
        return shared + dispatcher_rings(cfg, t, etp)
    return shared if "shared_experts" in modules else 0.0


def latent_gather_saving(cfg: ModelConfig, full: bool) -> float:
    """The rings of b·s·h values a latent attention does not move under sequence
    parallelism (which the planner requires of it under tensor parallelism): its down
    projections are whole on every rank and project the rank's own sequence shard, so the
    all-gather before the column-parallel layers — forward, again in a fully recomputed
    forward, the input gradient's reduce-scatter and the backward's re-gather, half a ring
    each — carries the q latent (or, without one, the hidden state the queries' projection
    takes), the kv latent and the rotary key, not h (Megatron-Core's MLASelfAttention:
    ``gather_from_sequence_parallel_region`` of the latents); the output projection's
    reduce-scatter and its gradient's all-gather stay h wide."""
    gathered = (cfg.q_lora_rank or cfg.hidden) + cfg.kv_lora_rank + cfg.rope_head_dim
    return (3 + (1 if full else 0)) * 0.5 * (1 - gathered / cfg.hidden)


def moe_tp_rings(cfg: ModelConfig, t: int, full: bool, etp: int | None = None) -> float:
    """A mixture-of-experts block's tensor-parallel collectives per micro-batch, in rings of
    b·s·h values (all-gather + reduce-scatter pairs: sequence parallelism, which
    Megatron-Core requires of a mixture under tensor parallelism). The attention's as a
    dense block's: a pair forward, a pair backward, and its input re-gathered for backward
    (half a ring). Megatron-Core's all-to-all token dispatcher (MoEAlltoAllTokenDispatcher,
    2024) turns the rank's sequence shard into every token's 1/t of the hidden vector (an
    all-to-all over the t ranks: 1/t of an all-gather), sends those slices to the experts'
    ranks (:func:`ep_comm_time`), all-gathers the k·N rows it receives into whole vectors for
    the experts (k half rings) — the experts' first linear keeps them, none re-gathered in
    backward — and mirrors it all after the experts (a reduce-scatter of k·N rows, the
    all-to-all back); its backward, the same again. A fully recomputed block's forward
    once more. Folded at ``etp`` 1 (None: t), the experts take each rank's sequence shard
    whole: the MLP has no tensor-parallel collective. Shared experts are a dense MLP over
    the tensor-parallel group whatever ``etp``: a pair of their own each way, and their
    input re-gathered for backward (Megatron-Core's SharedExpertMLP, without
    --moe-shared-expert-overlap)."""
    mlp = dispatcher_rings(cfg, t, etp)
    shared = 1.0 if cfg.shared_expert_ffn else 0.0
    forward = 1 + shared + mlp
    return forward * (2 if full else 1) + forward + 0.5 * (1 + shared)


def dispatcher_rings(cfg: ModelConfig, t: int, etp: int | None = None) -> float:
    """The rings of b·s·h values the all-to-all token dispatcher's tensor-parallel
    collectives make each way in one MoE layer (:func:`moe_tp_rings`): the all-to-all of
    the sequence shard into hidden slices (1/t) and the k half-ring pairs of the rows it
    gathers; none when the experts are folded at an ``etp`` below t."""
    return cfg.experts_per_token + 1 / t if (etp is None or etp == t) else 0.0


def overlapped_tp_comm(comm: float, gemms: float, t: int) -> float:
    """Seconds of ``comm`` tensor-parallel collectives left on the step when they overlap
    the ``gemms`` seconds of matmuls they feed or drain (Megatron-Core's --tp-comm-overlap:
    Transformer Engine's userbuffers split each all-gather and reduce-scatter into t chunks
    passed round the ring, one chunk's transfer beside the previous chunk's GEMM): one chunk
    in t waits, or what the GEMMs are too short to cover; the hidden rest slows the GEMMs it
    runs beside by :data:`~paracube.planner.collectives.OVERLAP_SLOWDOWN` of its seconds."""
    hidden = min(comm * (t - 1) / t, gemms)
    return comm - hidden + OVERLAP_SLOWDOWN * hidden


def pp_transfer_time(cfg: ModelConfig, layout: Layout, cluster: Cluster, elem: int) -> float:
    """Stage-boundary transfers: one activation forward and one gradient back per micro-batch
    at every boundary it crosses on this rank — once per model chunk, so ``chunks`` times
    under the interleaved schedule ("the amount of communication also increases by v",
    Narayanan et al. 2021, §2.2.2): a (b, s, h) tensor, 1/tp of it under sequence
    parallelism (Megatron sends the sequence shard)."""
    if layout.pp == 1:
        return 0.0
    n = layout.micro_batch * cfg.seq_len * cfg.hidden * elem
    link = cluster.intra if layout.gpus <= cluster.gpus_per_node else cluster.inter
    per_message = n / (layout.tp if layout.sequence_parallel else 1) / link.bandwidth
    return 2 * layout.microbatches * layout.chunks * (per_message + link.latency)
