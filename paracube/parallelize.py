"""Building this rank's share of the model: the architecture, in the order it is applied.

::

    the model's spec           paracube's GPT on "meta" (shapes only: no rank ever holds the
                                whole model), or a Hugging Face / factory model built whole
      → tensor parallel         the declarative plan keeps this rank's slices (Megatron §3)
      → recomputation           full blocks or the attention core (Korthikanti et al. 2022)
      → compilation             torch.compile each block's forward (--compile), traced at first call
      → pipeline split          this rank's chunks of the chain, and the schedule's actions
      → materialize + cast      values for this rank's shards only (the serial model's, from
                                the seed), then the bf16/fp16 compute dtype
      → data parallel / ZeRO    buckets (ZeRO 0–2) or sharded units (ZeRO-3) over dp
      → step runner             local micro-steps, or the pipeline executor

The order matters: the TP plan names module paths of the unchanged model; the chunks are
views of the same blocks, so what is materialized is exactly what this rank runs; the
data-parallel wrapper flattens the parameters it is given last, so nothing may replace a
parameter after it. (``--balance time|speed`` measure real layers, so they build them whole.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from paracube.choices import COMPILE_BACKENDS, MEASURED_BALANCE
from paracube.comm import ops
from paracube.config import TrainConfig
from paracube.data.batches import RankBatches
from paracube.data_parallel import DataParallel, FlatDataParallel, Reducer, ShardedDataParallel
from paracube.data_parallel.compress import make_reducer
from paracube.data_parallel.local import LocalReduce
from paracube.data_parallel.stale import StaleReduce
from paracube.errors import ConfigError
from paracube.materialize import Materializer, PeakMemory, materialize
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, apply_recompute
from paracube.models.spec import (
    ModelSpec,
    build_model,
    check_plan,
    checkpoint_forward,
    tied_aliases,
)
from paracube.objective import Objective
from paracube.optim import is_decayed
from paracube.pipeline.executor import PipelineExecutor
from paracube.pipeline.schedules import get_schedule
from paracube.pipeline.stage import PipelineChunk
from paracube.precision import DTYPES
from paracube.runners import LocalRunner, PipelineRunner
from paracube.tensor_parallel import TPContext
from paracube.tensor_parallel.plan import apply_plan
from paracube.values import dp_mode


@dataclass
class ParallelModel:
    """What :func:`parallelize` builds: the data-parallel wrapper around the local module
    (the whole model, or an ``nn.ModuleList`` of pipeline chunks), the objective, the step
    runner, and for pipelines the executor and a description of the split."""

    grad_sync: FlatDataParallel
    objective: Objective
    runner: LocalRunner | PipelineRunner
    pipeline: PipelineExecutor | None = None
    description: str | None = None
    build_bytes: int = 0  # how much this rank's peak memory grew while building the model
    # a tied parameter's later names → its first (the serial model's): a pipeline's last
    # stage holds the head tied to the first stage's embedding under the head's name
    tied_aliases: dict[str, str] = field(default_factory=dict)

    @property
    def module(self) -> nn.Module:
        return self.grad_sync.module

    def serial_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the serial model's names."""
        if self.pipeline is None:
            return self.module.named_parameters()
        chunks: list[PipelineChunk] = list(self.module.children())  # type: ignore[arg-type]
        return ((n, p) for chunk in chunks for n, p in chunk.serial_named_parameters())


def parallelize(
    cfg: TrainConfig, mesh: ProcessMesh, objective: Objective, batches: RankBatches
) -> ParallelModel:
    """This rank's model, wrapped in the fixed order (module docstring)."""
    memory = PeakMemory()
    # paracube's GPT on the meta device (shapes only): this rank's shards get their values
    # after the split (materialize); the time and speed balances measure real layers.
    spec = build_model(cfg, meta=cfg.parallel.balance not in MEASURED_BALANCE)
    tied = spec.tied_groups()  # by identity: before anything replaces a parameter
    tensor_parallel(spec, TPContext(mesh.group("tp"), mesh.ledger, cfg.parallel.sequence_parallel))
    recompute(spec, cfg.recompute, cfg.recompute_blocks)
    compile_blocks(spec, cfg.compile)
    if mesh.size("pp") > 1:
        return _pipelined(spec, tied, cfg, mesh, objective, batches, memory)
    model = spec.module
    if cfg.zero == 3 and spec.meta:  # ZeRO-3 gives each unit its values just before slicing it
        unit_by_unit = Materializer(
            model, list(model.named_parameters()), cfg.model, cfg.seed,
            (mesh.rank("tp"), mesh.size("tp")), _compute_dtype(cfg), mesh.device,
        )  # fmt: skip
        grad_sync = wrap_data_parallel(model, spec.units, cfg, mesh, objective, unit_by_unit)
        built = memory.growth()
    else:
        _materialize(spec, model.named_parameters(), [model], cfg, mesh)
        built = memory.growth()
        grad_sync = wrap_data_parallel(model.to(mesh.device), spec.units, cfg, mesh, objective)
    runner = LocalRunner(grad_sync, objective, batches, mesh.ledger)
    return ParallelModel(
        grad_sync, objective, runner, build_bytes=built, tied_aliases=tied_aliases(tied)
    )


def tensor_parallel(spec: ModelSpec, ctx: TPContext) -> None:
    """The model's declarative plan over the tp group (nothing at tp = 1)."""
    if ops.group_size(ctx.group) == 1:
        return
    check_plan(spec, tp=ops.group_size(ctx.group), sequence_parallel=ctx.sequence_parallel)
    assert spec.tp_plan is not None  # check_plan refused a model without one
    apply_plan(spec.module, spec.tp_plan, ctx)
    spec.rebind()
    if spec.on_sequence_shards is not None:
        spec.on_sequence_shards(ops.group_size(ctx.group) if ctx.sequence_parallel else 1)


def recompute(spec: ModelSpec, mode: str, blocks: int | None) -> None:
    """Activation recomputation in the first ``blocks`` units (all if None): paracube's
    GPT knows full and selective; other models recompute whole units."""
    if isinstance(spec.module, GPT):
        apply_recompute(spec.module, mode, blocks)
        return
    chosen = spec.units if blocks is None else spec.units[:blocks]
    for unit in chosen if mode == "full" else []:
        (spec.recompute_unit or checkpoint_forward)(unit)


def compile_blocks(spec: ModelSpec, mode: str) -> None:
    """torch.compile each block's forward (traced at its first call, so after
    materialization and the data-parallel wrapper) — the spec's units, paracube's GPT blocks
    or a Hugging Face model's decoder layers or a factory's, and only them: the embedding, head and
    loss stay eager, as torchtitan compiles its blocks one by one. The forward, not the
    module's call: the hooks around it (ZeRO-3's gathers and their collectives) stay eager
    rather than traced; the parameter names, and so the checkpoints, are unchanged."""
    if mode == "none":
        return
    for unit in spec.units:
        unit.forward = torch.compile(unit.forward, backend=COMPILE_BACKENDS[mode])


def _compute_dtype(cfg: TrainConfig) -> torch.dtype | None:
    # None under fp32: the default dtype (float64 in the exactness tests)
    return DTYPES[cfg.precision] if cfg.precision != "fp32" else None


def _materialize(
    spec: ModelSpec, named, modules: Sequence[nn.Module], cfg: TrainConfig, mesh: ProcessMesh
) -> None:
    """Values for what this rank keeps — initialised in fp32 from the seed, so every
    precision and layout starts alike — in the compute dtype."""
    dtype = _compute_dtype(cfg)
    if spec.meta:
        materialize(named, modules, cfg.model, cfg.seed, (mesh.rank("tp"), mesh.size("tp")), dtype)
    if dtype is not None:  # a model built whole (--balance time, HF, factories) is cast here
        for module in modules:
            module.to(dtype)


def wrap_data_parallel(
    local: nn.Module,
    units: list[nn.Module],
    cfg: TrainConfig,
    mesh: ProcessMesh,
    objective: Objective,
    materialize_unit: Materializer | None = None,
) -> FlatDataParallel:
    """ZeRO-3 units are the transformer blocks (``units``); ZeRO 0–2 bucket every parameter. Gradients
    accumulate and are reduced in fp32 under bf16/fp16 unless asked otherwise."""
    grad_dtype = torch.float32 if cfg.precision != "fp32" and cfg.grad_reduce == "fp32" else None
    # --dp-mode local-sgd/diloco: no gradient communication (the parameters are averaged
    # every H steps instead); stale:S: reductions S steps late; else the compressor, or
    # None: uncompressed
    mode, late = dp_mode(cfg.dp_mode)
    if mode == "stale":  # step t applies step t−S's gradient, reduced on a group of its own
        reducer: Reducer | None = StaleReduce(late or 0, mesh.twin_group("dp"))
    elif mode != "sync":
        reducer = LocalReduce()
    else:
        reducer = make_reducer(cfg.compress, cfg.zero, cfg.error_feedback)
    if cfg.zero == 3:
        return ShardedDataParallel(
            local,
            units,
            mesh.group("dp"),
            mesh.ledger,
            group_key=is_decayed,
            average=False,  # the loss is normalised by the global token count
            grad_dtype=grad_dtype,
            pre_reduce=objective.pre_reduce,
            materialize=materialize_unit,
            reducer=reducer,
        )
    return DataParallel(
        local,
        mesh.group("dp"),
        mesh.ledger,
        bucket_mb=cfg.parallel.bucket_mb,
        average=False,
        group_key=is_decayed,
        contiguous_params=True,
        zero_stage=cfg.zero,
        grad_dtype=grad_dtype,
        pre_reduce=objective.pre_reduce,
        reducer=reducer,
    )


def _pipelined(
    spec: ModelSpec,
    tied: list[list[str]],
    cfg: TrainConfig,
    mesh: ProcessMesh,
    objective: Objective,
    batches: RankBatches,
    memory: PeakMemory,
) -> ParallelModel:
    from paracube.pipeline.build import build_pipeline

    par = cfg.parallel
    sample = batches.micro_batch(0, 0)[0] if par.balance in MEASURED_BALANCE else None
    plan = build_pipeline(spec, cfg, mesh.rank("pp"), sample, mesh.ledger, mesh.device)
    named = [(n, p) for chunk in plan.chunks for n, p in chunk.serial_named_parameters()]
    _materialize(spec, named, plan.chunks, cfg, mesh)
    built = memory.growth()
    chunks = [c.to(mesh.device) for c in plan.chunks]
    seq = cfg.model.seq_len // (mesh.size("tp") if par.sequence_parallel else 1)
    executor = PipelineExecutor(
        chunks,
        plan.actions,
        p=mesh.size("pp"),
        rank=mesh.rank("pp"),
        act_shape=(cfg.micro_batch, seq, cfg.model.hidden),
        dtype=next(p for c in chunks for p in c.parameters()).dtype,
        device=mesh.device,
        loss_fn=objective.loss_sum,
        loss_weight=objective.backward_weight,
        group=mesh.group("pp"),
        ledger=mesh.ledger,
        store=plan.store,
    )
    _tie_across_stages(spec.chain_names, tied, chunks, objective, mesh)
    units = [u for u in spec.units if any(u is m for c in chunks for m in c.modules())]
    grad_sync = wrap_data_parallel(nn.ModuleList(chunks), units, cfg, mesh, objective)
    runner = PipelineRunner(executor, grad_sync, batches, get_schedule(par.schedule), par.chunks)
    return ParallelModel(
        grad_sync, objective, runner, executor, plan.description, built, tied_aliases(tied)
    )


def _tie_across_stages(
    chain_names: list[str],
    tied: list[list[str]],
    chunks: list[PipelineChunk],
    objective: Objective,
    mesh: ProcessMesh,
) -> None:
    """A parameter tied by identity in the whole model (an embedding and its head) is a
    copy on each stage holding one of its names: their gradients are summed over the
    first and last stages (the chain's ends). Found by identity for any model."""
    for names in tied:
        where = [i for i, n in enumerate(chain_names) if any(_under(t, n) for t in names)]
        ends = {0, len(chain_names) - 1}
        if not set(where) <= ends:
            raise ConfigError(
                f"{' and '.join(names)} are tied but not at the ends of the chain: pipelines "
                "sum tied gradients between the first and last stage only"
            )
        here = (p for c in chunks for n, p in c.serial_named_parameters() if n in names)
        objective.tie(next(here, None), mesh.first_last_stage_group())


def _under(param_name: str, module_name: str) -> bool:
    return param_name.startswith(module_name + ".")
