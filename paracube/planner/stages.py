"""Which blocks each pipeline rank holds: the engine's own split (pure math).

``paracube train`` cuts the chain ``embed, blocks.0 … blocks.L-1, norm, head`` into
``pp × chunks`` contiguous parts balanced by its ``--balance`` (parameters by default;
:func:`paracube.pipeline.partition.partition` over
:func:`paracube.pipeline.balance.gpt_layer_loads`), part ``k`` on rank ``k mod pp``. The
planner times and sizes every rank from that same split rather than assuming ⌈L/(p·v)⌉
blocks each: a large vocabulary makes the embedding and the head weigh several blocks, so
the engine gives the first and last ranks fewer blocks and the middle ones more.

Megatron does not: a layout planned with ``split="even"`` or ``"even-ends"``
(:func:`even_shares`) is timed and sized with the split a published Megatron run made, so
that a head of several blocks' weight slows its last rank as it slowed the run; nor does
torchtitan (``split="torchtitan"``, :func:`torchtitan_shares`); nor a run cut by an explicit
layout (``split`` in Megatron-Core's layout grammar, :func:`layout_string_shares`).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from paracube.choices import ENDS_AS_LAYERS
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.pipeline.balance import gpt_layer_loads
from paracube.pipeline.partition import partition
from paracube.planner.layout import Layout
from paracube.planner.pipeline_layout import is_layout, layout_refusal, stages_of


@dataclass(frozen=True)
class RankShare:
    """What one pipeline rank holds over all its chunks."""

    blocks: tuple[int, ...]  # the model's block indices, 0 … L-1
    embedding: bool
    head: bool  # the final norm and the output head


def layout_shares(cfg: ModelConfig, layout: Layout) -> tuple[RankShare, ...]:
    """Each pipeline rank's share under the split the engine makes for ``layout``: by its
    ``--balance`` (parameters unless the job says otherwise; the measured balances by their
    FLOPs estimate, as the engine starts from before it measures) — or, for a Megatron run,
    its equal blocks per virtual stage (:func:`even_shares`), for a torchtitan one its own
    (:func:`torchtitan_shares`)."""
    if layout.split == "torchtitan":
        return torchtitan_shares(cfg, layout.pp, layout.chunks)
    if is_layout(layout.split):
        return layout_string_shares(cfg, layout.split, layout.pp, layout.chunks)
    if layout.split != "engine":
        return even_shares(cfg, layout.pp, layout.chunks, ends=layout.split == "even-ends")
    if layout.balance == "params":  # depends on nothing but the model: cached once
        return rank_shares(cfg, layout.pp, layout.chunks)
    return rank_shares(
        cfg,
        layout.pp,
        layout.chunks,
        layout.balance,
        micro_batch=layout.micro_batch,
        schedule=layout.schedule,
        microbatches=layout.microbatches,
    )


@functools.cache  # searches ask for the same (model, pp, chunks) many times
def rank_shares(
    cfg: ModelConfig,
    pp: int,
    chunks: int = 1,
    balance: str = "params",
    *,
    micro_batch: int = 1,
    schedule: str = "1f1b",
    microbatches: int = 1,
) -> tuple[RankShare, ...]:
    """Each pipeline rank's share of the model under the engine's split by ``balance``."""
    L = cfg.n_layers
    if pp == 1:
        return (RankShare(tuple(range(L)), True, True),)
    chain = len(shapes.chain_names(cfg))  # embed, L blocks, norm, head
    load = gpt_layer_loads(
        cfg, balance, micro_batch=micro_batch, p=pp, schedule=schedule, m=microbatches
    )
    bounds = partition(chain, pp * chunks, load)
    held: list[list[int]] = [[] for _ in range(pp)]
    for part, (start, end) in enumerate(bounds):
        held[part % pp].extend(range(start, end))
    return tuple(
        RankShare(
            blocks=tuple(i - 1 for i in items if 1 <= i <= L),
            embedding=0 in items,
            head=L + 2 in items,
        )
        for items in held
    )


def can_cut(cfg: ModelConfig, split: str, pp: int, chunks: int = 1) -> bool:
    """Whether ``split`` can cut ``cfg``'s layers into pp × chunks stages: Megatron's even
    splits only where the units (blocks, and for even-ends the embedding and the loss)
    divide (:func:`even_shares`), torchtitan's wherever every stage gets a layer
    (:func:`torchtitan_shares`), an explicit layout where it has pp × chunks stages and
    names the model's blocks and modules (:func:`layout_string_shares`), the engine's
    always."""
    if is_layout(split):
        stages = stages_of(split)
        return len(stages) == pp * chunks and not layout_refusal(
            stages, cfg.n_layers, cfg.mtp_layers
        )
    units = cfg.n_layers + (2 if split in ENDS_AS_LAYERS else 0)
    parts = pp * chunks
    if split in ("even", "even-ends"):
        return units % parts == 0
    if split == "torchtitan":
        return parts <= units
    return True


@functools.cache
def even_shares(
    cfg: ModelConfig, pp: int, chunks: int = 1, *, ends: bool = False
) -> tuple[RankShare, ...]:
    """Megatron-Core's split (``get_num_layers_to_build`` and ``get_transformer_layer_offset``
    in megatron/core/transformer/transformer_block.py): the L blocks cut into pp × chunks
    virtual stages of L / (pp · chunks) blocks each, virtual stage k on rank k mod pp, the
    embedding before the first and the final norm and head after the last, whatever they
    weigh — Megatron-DeepSpeed's ``partition_method="type:transformer"`` cuts the same way.
    ``ends``: ``--account-for-embedding-in-pipeline-split`` and ``…-loss-…``, the embedding
    and the loss each counted as one block, so the first and last virtual stages hold one
    block fewer (Llama 3's "we reduce one Transformer layer each from the first and the last
    stages", Dubey et al. 2024, §3.3.2; Megatron-DeepSpeed's ``'type:transformer|embedding'``,
    BLOOM's). Megatron refuses a count that does not divide."""
    units = cfg.n_layers + (2 if ends else 0)
    parts = pp * chunks
    if not can_cut(cfg, "even-ends" if ends else "even", pp, chunks):
        raise ConfigError(
            f"an even pipeline split cuts {units} "
            + ("layers (blocks, the embedding and the loss) " if ends else "blocks ")
            + f"into pp × chunks = {parts} equal parts, and they do not divide; "
            "choose pp and chunks that do"
        )
    per = units // parts
    held: list[list[int]] = [[] for _ in range(pp)]
    for part in range(parts):
        first = part * per - (1 if ends and part else 0)  # block index, 0 … L-1
        count = per - (1 if ends and part in (0, parts - 1) else 0)
        held[part % pp].extend(range(first, first + count))
    return tuple(
        RankShare(blocks=tuple(blocks), embedding=rank == 0, head=rank == (parts - 1) % pp)
        for rank, blocks in enumerate(held)
    )


def torchtitan_shares(cfg: ModelConfig, pp: int, chunks: int = 1) -> tuple[RankShare, ...]:
    """torchtitan's split (``generate_llm_fqn_per_model_part``, torchtitan/distributed/
    pipeline_parallel.py, at its default ``input_weight`` = ``output_weight`` = 1): the
    embedding and the norm + head counted as one layer each, the L + 2 layers dealt over the
    S = pp × chunks stages ⌊(L + 2)/S⌋ each, the first (L + 2) mod S stages one more, stage k
    on rank k mod pp (its loop placement, Interleaved1F1B's). Unlike Megatron's it needs no
    division: Llama 3 8B's 32 blocks on 5 stages are 6, 7, 7, 7, 5 (34 layers = 4 × 7 + 6; the
    first and the last stage a block fewer for the ends). It refuses a stage left empty, as
    torchtitan does: S ≤ L + 2.

    >>> from paracube.models.presets import preset
    >>> [len(s.blocks) for s in torchtitan_shares(preset("llama3-8b"), 5)]
    [6, 7, 7, 7, 5]
    """
    stages, units = pp * chunks, cfg.n_layers + 2
    if not can_cut(cfg, "torchtitan", pp, chunks):
        raise ConfigError(
            f"torchtitan's split gives every one of pp × chunks = {stages} stages a layer of "
            f"the {units} (blocks, the embedding and the head): choose fewer stages"
        )
    per, extra = divmod(units, stages)
    held: list[list[int]] = [[] for _ in range(pp)]
    first = 0
    for k in range(stages):
        count = per + (k < extra) - (k == 0) - (k == stages - 1)
        held[k % pp].extend(range(first, first + count))
        first += count
    return tuple(
        RankShare(blocks=tuple(blocks), embedding=rank == 0, head=rank == (stages - 1) % pp)
        for rank, blocks in enumerate(held)
    )


@functools.cache
def layout_string_shares(
    cfg: ModelConfig, split: str, pp: int, chunks: int = 1
) -> tuple[RankShare, ...]:
    """The shares of an explicit layout (:mod:`paracube.planner.pipeline_layout`: Megatron-
    Core's ``--pipeline-model-parallel-layout``): its virtual stage k on rank k mod pp, the
    blocks numbered in the order the stages name them, the embedding with the rank of ``E``,
    the norm, head and loss — and the multi-token prediction modules beside them — with the
    rank of ``L``. Refused, with the reason, where the layout does not have pp × chunks
    stages or does not name the model's blocks and modules.

    >>> from paracube.models.presets import preset
    >>> shares = layout_string_shares(preset("tiny"), "Et|tt|tL", 3)
    >>> [(s.blocks, s.embedding, s.head) for s in shares]
    [((0,), True, False), ((1, 2), False, False), ((3,), False, True)]
    """
    stages = stages_of(split)
    if len(stages) != pp * chunks:
        raise ConfigError(
            f"--pipeline-split {split!r} names {len(stages)} stages and pp × chunks = "
            f"{pp} × {chunks} = {pp * chunks}: choose pp and chunks whose product it is"
        )
    refusal = layout_refusal(stages, cfg.n_layers, cfg.mtp_layers)
    if refusal:
        raise ConfigError(f"--pipeline-split {split!r}: {refusal}")
    held: list[list[int]] = [[] for _ in range(pp)]
    embedding = head = 0
    block = 0
    for k, stage in enumerate(stages):
        count = stage.count("t")
        held[k % pp].extend(range(block, block + count))
        block += count
        embedding = k % pp if "E" in stage else embedding
        head = k % pp if "L" in stage else head
    return tuple(
        RankShare(blocks=tuple(blocks), embedding=rank == embedding, head=rank == head)
        for rank, blocks in enumerate(held)
    )


def recomputed_blocks(share: RankShare, layout: Layout) -> int:
    """How many of the rank's blocks are recomputed (:func:`recomputed_indices`; counted
    apart, a search asks it for every rank of its layouts)."""
    if layout.recompute == "none":
        return 0
    n = layout.recompute_blocks
    if n is None:
        return len(share.blocks)
    if layout.recompute_scope == "stage":
        return sum(min(n, len(run)) for run in chunk_runs(share.blocks))
    return bisect.bisect_left(share.blocks, n)  # every split deals a rank's blocks in order


def recomputed_indices(share: RankShare, layout: Layout) -> tuple[int, ...]:
    """The rank's blocks under recomputation: the engine recomputes the model's first
    ``recompute_blocks`` blocks (all of them when unset), none without recompute; Megatron
    (``recompute_scope="stage"``, --recompute-method block) the first N of each chunk of
    consecutive blocks the rank holds — each model chunk's first N layers, on every stage."""
    if layout.recompute == "none":
        return ()
    n = layout.recompute_blocks
    if n is None:
        return share.blocks
    if layout.recompute_scope == "stage":
        return tuple(block for run in chunk_runs(share.blocks) for block in run[:n])
    return tuple(block for block in share.blocks if block < n)


def chunk_runs(blocks: tuple[int, ...]) -> list[tuple[int, ...]]:
    """A rank's blocks as its chunks: the runs of consecutive block indices (an interleaved
    rank's chunks are apart, the other ranks' chunks between them)."""
    runs: list[list[int]] = []
    for block in blocks:
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    return [tuple(run) for run in runs]
