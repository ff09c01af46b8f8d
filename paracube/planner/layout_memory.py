"""Peak memory per GPU of a whole parallel layout (pure math on ModelConfig).

For every pipeline rank, holding the blocks of the engine's own split
(:mod:`paracube.planner.stages`) — the peak is the rank that needs the most: the first
(embedding, the most micro-batches in flight), the last (head and logits) or one between
with more blocks — the sum of:

- model states of its parameters under ZeRO (``memory.model_state_bytes``), with tensor
  parallelism splitting the matrices (norm weights are replicated: counted in full);
- activations: what each block keeps for backward × its layers × the micro-batches it
  holds at the schedule's peak (the schedule registry's ``in_flight``) — with fused
  attention the model's own blocks counted op by op
  (:func:`paracube.models.shapes.block_saved_bytes`, which the engine's saved-tensor
  counter reproduces to the byte — one stage, tensor and sequence parallel, and a first
  pipeline stage under 1F1B and GPipe), with unfused attention (Megatron's layer before
  FlashAttention) Korthikanti's per-layer bytes; plus, on the first stage, what the
  embedding keeps (the token indices; Megatron's layer: its output) and, on the last, the
  final norm's, the head's and the loss's (the fp32 log-softmax, b·s·V/t × 4 bytes);
- on the last, under paracube's loss (``Layout.loss``), the loss backward's two fp32
  gradients of the logits' shape, alive beside all of that when backward begins
  (:func:`paracube.models.shapes.loss_backward_transient_bytes`: with them the planner's
  count met the CUDA allocator's peak within 67 MiB on an H200);
- under context parallelism, all of it for the s/cp tokens a rank holds
  (:func:`~paracube.planner.layout.rank_sequence`), the states sharded over dp × cp;
- an allowance, stated here: 1 GB for the CUDA context and communication buffers, and
  10 % of the rest for allocator fragmentation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from paracube.choices import FUSED_ATTENTION, state_bytes_per_parameter
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.pipeline.schedules import get_schedule
from paracube.planner.layout import Layout, rank_sequence
from paracube.planner.memory import activation_bytes_per_layer, model_state_bytes, te_block_bytes
from paracube.planner.stages import layout_shares, recomputed_blocks, recomputed_indices

CONTEXT_BYTES = 1e9
FRAGMENTATION = 0.10


@dataclass(frozen=True)
class StageMemory:
    stage: str
    model_states: float
    activations: float
    allowance: float
    transient: float = 0.0  # held only while the loss's backward runs (not saved)
    gathered: float = 0.0  # ZeRO-3's gathered parameters, beside its shards (_gathered_bytes)

    @property
    def total(self) -> float:
        return _total(
            self.model_states, self.activations, self.allowance, self.transient, self.gathered
        )


# a rank's memory before it is named: (model_states, activations, allowance, transient,
# gathered), StageMemory's fields after the first — a search weighs every rank of a few
# hundred thousand layouts and keeps one
_Parts = tuple[float, float, float, float, float]


def _total(
    model_states: float, activations: float, allowance: float, transient: float, gathered: float
) -> float:
    return model_states + activations + transient + allowance + gathered


def stage_memory(cfg: ModelConfig, layout: Layout, precision: str = "bf16") -> list[StageMemory]:
    """Memory per GPU of every pipeline rank, first to last, each holding the blocks the
    engine's own split gives it (:mod:`paracube.planner.stages`)."""
    return [
        StageMemory(_rank_name(index, layout.pp), *parts)
        for index, parts in enumerate(_stage_parts(cfg, layout, precision))
    ]


def _stage_parts(cfg: ModelConfig, layout: Layout, precision: str) -> list[_Parts]:
    """:func:`stage_memory`'s ranks, each as its parts."""
    refusal = layout.model_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)
    p = layout.pp
    shares = layout_shares(cfg, layout)
    local = rank_sequence(cfg, layout)  # under context parallelism a rank keeps s/cp tokens
    key = _TermsKey.of(layout)
    in_flight = get_schedule(layout.schedule).in_flight
    terms = _layout_terms(local.mixture_kind, key, precision)  # the ends' are alike in all kinds
    dense = _layout_terms(local.dense_kind, key, precision) if not local.uniform else terms
    largest = dense if dense.block_params > terms.block_params else terms  # ZeRO-3's unit
    uniform = local.uniform
    parts = []
    for index, share in enumerate(shares):
        if uniform:  # the search's hot path: one kind
            n = len(share.blocks)
            held: _Held = ((terms, n, recomputed_blocks(share, layout)),)
            params = (n * terms.block_params, n * terms.block_expert_params)
        else:  # the rank's mixture blocks and its dense ones, each kind's recomputed apart
            redone = recomputed_indices(share, layout)
            dense_held = sum(1 for i in share.blocks if i in local.dense_layers)
            dense_redone = sum(1 for i in redone if i in local.dense_layers)
            held = (
                (terms, len(share.blocks) - dense_held, len(redone) - dense_redone),
                (dense, dense_held, dense_redone),
            )
            params = _held_params(held)
        if index == p - 1 and local.mtp_layers:
            last = dense if local.n_layers - 1 in local.dense_layers else terms
            held, params = _with_mtp(local, layout, held, params, last)
        states = _states_bytes(terms, layout, params, index == 0, index == p - 1)
        flight = in_flight(p, layout.microbatches, layout.chunks, stage=index)
        parts.append(_stage(local, layout, terms, states, index, held, flight, largest))
    return parts


def _rank_name(index: int, p: int) -> str:
    return "first" if index == 0 else "last" if index == p - 1 else f"rank {index}"


class _LayoutTerms(NamedTuple):
    """What every pipeline rank of one layout shares: bytes per parameter of each model
    state, what one block keeps (recomputed, and not), the parameter counts, and what the
    model's two ends keep."""

    weight: int
    gradient: int
    optimizer: int
    act_recomputed: float
    act_kept: float
    block_params: float
    block_expert_params: float  # of block_params, a mixture's experts on this rank
    embed_params: float
    head_params: float
    first: float
    last: float
    # of act_kept, the block's own buffers it keeps (the rotary tables): once per block,
    # not once per micro-batch in flight
    block_buffers: float = 0.0


class _TermsKey(NamedTuple):
    """The fields of a layout its ranks' shared terms depend on (:func:`_layout_terms` reads
    no other; typed so, the checker holds it to them): the search's layouts that differ
    elsewhere — ZeRO stage, schedule, micro-batch count, recomputed blocks, the software's
    overlaps — share one computation."""

    tp: int
    pp: int
    micro_batch: int
    sequence_parallel: bool
    recompute: str
    attention: str
    activations: str
    grad_reduce: str
    offload: bool
    ep: int
    expert_tp: int
    master_weights: str
    moments: str
    recompute_modules: tuple[str, ...]

    @classmethod
    def of(cls, layout: Layout) -> _TermsKey:
        return cls(
            layout.tp,
            layout.pp,
            layout.micro_batch,
            layout.sequence_parallel,
            layout.recompute,
            layout.attention,
            layout.activations,
            layout.grad_reduce,
            layout.offload,
            layout.ep,
            layout.expert_tp,
            layout.master_weights,
            layout.moments,
            layout.recompute_modules,
        )


@functools.lru_cache(maxsize=1 << 12)
def _layout_terms(cfg: ModelConfig, layout: _TermsKey, precision: str) -> _LayoutTerms:
    h, s, V, t, p = cfg.hidden, cfg.seq_len, cfg.vocab_size, layout.tp, layout.pp
    w, g, o = state_bytes_per_parameter(
        precision, layout.grad_reduce, layout.master_weights, layout.moments
    )

    def act_layer(recompute: str) -> float:
        # torchtitan's op-level policy keeps what PyTorch's own ops made, whatever the blocks
        megatron = layout.activations == "megatron" and recompute != "op"
        if megatron and layout.attention in FUSED_ATTENTION:
            return te_block_bytes(
                cfg,
                layout.micro_batch,
                t=t,
                sequence_parallel=layout.sequence_parallel,
                recompute=recompute,
                fp8=precision == "fp8",
                etp=layout.expert_tp,
                modules=layout.recompute_modules,
            )
        if layout.attention in FUSED_ATTENTION:  # the model's own blocks, op by op
            return shapes.block_saved_bytes(
                cfg,
                layout.micro_batch,
                elem=w,
                tp=t,
                sequence_parallel=layout.sequence_parallel,
                recompute=recompute,
                etp=layout.expert_tp,
                # compiled blocks counted kept or recomputed whole; torchtitan's op-level
                # policy and the attention core's recomputation as their eager blocks keep
                compiled=layout.activations == "compiled" and recompute in ("none", "full"),
            )
        return activation_bytes_per_layer(
            s,
            layout.micro_batch,
            h,
            cfg.n_heads,
            t=t,
            sequence_parallel=layout.sequence_parallel,
            recompute=recompute,
            attention=layout.attention,
        ) * (w / 2)  # Korthikanti's constants are for 16-bit activations

    first: float
    last: float
    if layout.attention in FUSED_ATTENTION:  # the model's own ends, op by op
        first, last = shapes.end_saved_bytes(
            cfg, layout.micro_batch, elem=w, tp=t, sequence_parallel=layout.sequence_parallel
        )
    else:  # Megatron's: the embedding output, and the fp32 logits for the loss
        first, last = layout.micro_batch * s * h * w, layout.micro_batch * s * V / t * 4
        last += shapes.logit_softcap_saved_bytes(cfg, layout.micro_batch * s, w, t)
    # the final norm sits with the head (replicated under tp)
    head = (0 if (cfg.tie_embeddings and p == 1) else shapes.head_params(cfg, tp=t)) + (
        shapes.norm_params(cfg)
    )
    return _LayoutTerms(
        weight=w,
        gradient=g,
        optimizer=0 if layout.offload else o,  # offloaded: in host memory
        act_recomputed=act_layer(layout.recompute),
        act_kept=act_layer("none"),
        block_params=shapes.block_params(cfg, tp=t, ep=layout.ep, etp=layout.expert_tp),
        block_expert_params=(
            shapes.expert_params(cfg, tp=layout.expert_tp, ep=layout.ep) if cfg.moe else 0.0
        ),
        embed_params=shapes.embed_params(cfg, tp=t),
        head_params=head,
        first=first,
        last=last,
        block_buffers=(
            shapes.rotary_table_bytes(cfg, w)
            if layout.attention in FUSED_ATTENTION and layout.activations != "megatron"
            else 0.0
        ),
    )


def stage_bytes(
    cfg: ModelConfig,
    layout: Layout,
    index: int,
    blocks: int,
    precision: str = "bf16",
    name: str = "",
    redone: int | None = None,
) -> StageMemory:
    """Memory per GPU of pipeline stage ``index`` holding ``blocks`` transformer blocks (the
    first stage also the embedding, the last the final norm and head), ``redone`` of them
    recomputed (default: all of them under recomputation); ``cfg``'s blocks all alike."""
    terms = _layout_terms(shapes.one_kind(cfg), _TermsKey.of(layout), precision)
    p = layout.pp
    # --recompute-blocks: the stage's recomputed blocks keep their input only, the rest all
    if redone is None:
        redone = 0 if layout.recompute == "none" else blocks
    held = ((terms, blocks, redone),)
    states = _states_bytes(terms, layout, _held_params(held), index == 0, index == p - 1)
    in_flight = get_schedule(layout.schedule).in_flight(
        p, layout.microbatches, layout.chunks, stage=index
    )
    return StageMemory(name, *_stage(cfg, layout, terms, states, index, held, in_flight, terms))


# a rank's blocks: each kind's terms, how many it holds, how many of them are recomputed
_Held = tuple[tuple["_LayoutTerms", int, int], ...]


def _with_mtp(
    cfg: ModelConfig,
    layout: Layout,
    held: _Held,
    params: tuple[float, float],
    last: _LayoutTerms,
) -> tuple[_Held, tuple[float, float]]:
    """The last rank's blocks and (parameters, experts) with the multi-token prediction
    modules Megatron-Core places there: a block of the last block's kind each (``last``'s
    terms, kept whole), their projections and norms, and — under a pipeline — the copy of
    the embedding table they read the next tokens from."""
    d = cfg.mtp_layers
    blocks = (d * last.block_params, d * last.block_expert_params)
    rest = shapes.mtp_params(cfg, layout.tp, layout.ep, layout.expert_tp) - blocks[0]
    copy = last.embed_params if layout.pp > 1 else 0.0
    return (
        (*held, (last, d, 0)),
        (params[0] + blocks[0] + rest + copy, params[1] + blocks[1]),
    )


def _held_params(held: _Held) -> tuple[float, float]:
    """(parameters, of them a mixture's experts) of a rank's blocks, every kind's."""
    params = experts = 0.0
    for kind, n, _ in held:
        params += n * kind.block_params
        experts += n * kind.block_expert_params
    return params, experts


def _states_bytes(
    terms: _LayoutTerms, layout: Layout, blocks: tuple[float, float], first: bool, last: bool
) -> float:
    """The model states of a pipeline rank whose blocks hold ``blocks`` = (parameters, of
    them experts) — and the embedding if ``first``, the final norm and head if ``last``
    (``terms``)."""
    # ZeRO-3 kept gathered through a pipelined step holds, while the step runs, what ZeRO-1
    # holds: the whole stage's weights and (accumulated) gradients, the optimizer states and
    # main weights sharded
    zero = 1 if layout.zero3_per_step else layout.zero
    # PyTorch FSDP's shards are the fp32 parameters, the main weights the optimizer's 12 bytes
    # count: under ZeRO-3 no 16-bit copy is kept at rest (it is gathered: _gathered_bytes)
    cast = layout.master_weights == "parameters" and zero == 3 and terms.weight < 4
    # ZeRO shards over dp × cp (a hybrid shard group of it), the experts over the ranks that
    # hold them
    return _sharded_states(
        terms, zero, layout.shard_group, layout.expert_grad_group, blocks, first, last, cast
    )


@functools.lru_cache(maxsize=1 << 14)  # a search's layouts share a few groups and stages
def _sharded_states(
    terms: _LayoutTerms,
    zero: int,
    group: int,
    expert_group: int,
    blocks: tuple[float, float],
    first: bool,
    last: bool,
    cast: bool,
) -> float:
    """:func:`_states_bytes` from what it depends on — ZeRO stage, the dense and expert
    shard groups, the rank's blocks and ends, and whether a 16-bit copy is kept (not
    ``cast``)."""
    params, experts = blocks  # the experts sharded over the ranks that hold them
    if first:
        params += terms.embed_params
    if last:
        params += terms.head_params
    return sum(
        model_state_bytes(
            count,
            zero,
            shards,
            weight_bytes=0 if cast else terms.weight,
            grad_bytes=terms.gradient,
            optimizer_bytes=terms.optimizer,
        ).total
        for count, shards in ((params - experts, group), (experts, expert_group))
        if count
    )


def _stage(
    cfg: ModelConfig,
    layout: Layout,
    terms: _LayoutTerms,
    states: float,
    index: int,
    blocks: _Held,
    in_flight: float,
    largest: _LayoutTerms,
) -> _Parts:
    """Rank ``index``'s memory from its model ``states``: what its ``blocks`` keep for
    backward (each kind's terms, count, and how many of them are recomputed) × the
    ``in_flight`` micro-batches it holds at its peak, its ends' and the loss's (``terms``),
    the allowance, and ZeRO-3's gathered parameters (the ``largest`` kind of block)."""
    p = layout.pp
    acts = 0.0
    for kind, n, redone in blocks:
        acts += (kind.act_recomputed * redone + kind.act_kept * (n - redone)) * in_flight
        # a kept block's buffers are one storage for all its micro-batches in flight
        acts -= kind.block_buffers * (n - redone) * max(in_flight - 1, 0)
    if index == 0:
        acts += terms.first * in_flight
    transient = 0.0
    if index == p - 1:  # the loss's, and each multi-token prediction module's loss's
        acts += terms.last * (1 + cfg.mtp_layers)
        if layout.loss == "torch":
            transient = shapes.loss_backward_transient_bytes(cfg, layout.micro_batch, layout.tp)
    allowance = CONTEXT_BYTES + FRAGMENTATION * (states + acts)
    gathered = _gathered_bytes(terms, largest, layout, index == 0, index == p - 1)
    return states, acts, allowance, transient, gathered


def _gathered_bytes(
    terms: _LayoutTerms, largest: _LayoutTerms, layout: Layout, first: bool, last: bool
) -> float:
    """What ZeRO-3 holds gathered beside its shards, in the weights' dtype: the root unit —
    the embedding, the final norm and the head, used at both ends of the step — from the
    start of forward to the end of backward, and a block's unit with the next one
    prefetched behind its compute (the ``largest`` kind of block's; paracube's ZeRO-3, ``data_parallel/zero3.py``, which
    reports it as ``params_peak``; FSDP's root is not resharded after forward, and it
    prefetches a unit ahead). None when a pipelined step keeps its stage gathered: ZeRO-1's
    memory, counted in the states."""
    if layout.zero != 3 or layout.zero3_per_step:
        return 0.0
    root = (terms.embed_params if first else 0.0) + (terms.head_params if last else 0.0)
    return (root + 2 * largest.block_params) * terms.weight


@functools.lru_cache(maxsize=1 << 16)  # a search asks again for a layout's offloaded and
def peak_memory(  # recompute-"none" twins, which are candidates of their own
    cfg: ModelConfig, layout: Layout, precision: str = "bf16"
) -> StageMemory:
    """The pipeline rank that needs the most memory (:func:`stage_memory`; the first of
    equals)."""
    ranks = _stage_parts(cfg, layout, precision)
    index = max(range(len(ranks)), key=lambda i: _total(*ranks[i]))
    return StageMemory(_rank_name(index, layout.pp), *ranks[index])
