"""The one validator of a whole training job, run before any process or collective.

``validate(cfg, world)`` checks how a job's values fit together — each value on its own
is already checked by the config dataclasses — and raises a :class:`ConfigError` or
:class:`DataError` whose one line names the bad value and the fix. The launcher calls it
before starting ranks; every rank (under torchrun the only entry) and the Python API
(:class:`paracube.engine.Trainer`) call it again: it reads no corpus, so it costs
milliseconds. Torch-free.
"""

from __future__ import annotations

import os

from paracube.config import ModelConfig, ParallelConfig, TrainConfig
from paracube.data.source import BYTE_VOCABULARY, check_source
from paracube.data.tokenized import check_tokenized, is_tokenized
from paracube.errors import ConfigError
from paracube.models.sources import hf_weight_files, source_of
from paracube.options import RunOptions
from paracube.pipeline.schedules import check_schedule


def untrainable(model: ModelConfig) -> str:
    """Why ``paracube train`` cannot build ``model`` ("" if it can): a mixture of experts, a
    window or chunks shorter than its sequence, or another part only the planner models
    (:attr:`ModelConfig.planned_parts`) — asked by the validator and by ``paracube plan
    --emit torchrun``, whose command would otherwise fail at launch."""
    if model.moe:
        return (
            f"{model.name}: experts={model.experts} — a mixture of experts is planned "
            "(paracube plan), not trained: paracube train builds dense models; train a dense one"
        )
    span = model.local_span
    if span:
        local = "a sliding window" if model.attention_window else "attention chunks"
        return (
            f"{model.name}: {local} of {span} tokens < --seq-len {model.seq_len} — "
            "planned (paracube plan), not trained: paracube trains full attention; use "
            f"--seq-len ≤ {span}"
        )
    if model.planned_parts:
        return (
            f"{model.name}: {model.planned_parts} — planned (paracube plan), not "
            "trained: paracube's GPT builds none of them"
        )
    return ""


def validate(
    cfg: TrainConfig,
    world: int | None = None,
    *,
    data: bool = True,
    run: RunOptions | None = None,
    local_ranks: int | None = None,
) -> None:
    """Refuse a job that cannot run as asked; ``world``: the ranks launched (if known);
    ``data=False`` when the caller brings its own corpus. With ``run`` (how this machine
    runs it; ``local_ranks`` of the job on this machine, default ``LOCAL_WORLD_SIZE``)
    also this machine's limits (:mod:`paracube.resources`) and, on the job's rank 0 (or
    in the launcher), its output files and the calibration ``--predict`` reads."""
    refusal = untrainable(cfg.model)
    if refusal:
        raise ConfigError(refusal)
    if world is not None:
        cfg.parallel.check_world_size(world)
    check_tensor_parallel(cfg.model, cfg.parallel)
    if cfg.model_source is not None:
        check_model_source(cfg, weights=run is not None)
    if cfg.parallel.pp > 1:
        check_pipeline(cfg)
    if is_tokenized(cfg.data):  # the tokenizer's ids must fit the model's embedding
        check_tokenized(cfg.data, cfg.model.seq_len, cfg.model.vocab_size)  # type: ignore[arg-type]
    elif cfg.model.vocab_size < BYTE_VOCABULARY:
        raise ConfigError(
            f"model vocab_size {cfg.model.vocab_size} < {BYTE_VOCABULARY}: the byte-level data needs a vocabulary "
            f"of at least {BYTE_VOCABULARY}"
        )
    if data:
        check_source(cfg.data, cfg.model.seq_len, cfg.val_fraction)
    if run is not None:
        check_run(cfg, run, local_ranks)


def check_model_source(cfg: TrainConfig, weights: bool) -> None:
    """A Hugging Face or factory model: what its engines cannot do, and (``weights``) a
    model.safetensors that does not fit its config — read from the file's header."""
    if cfg.recompute == "selective":
        raise ConfigError(
            f"--recompute selective needs paracube's own attention (--model {cfg.model.name} "
            "recomputes whole blocks): use --recompute full"
        )
    source = source_of(cfg.model_source)  # type: ignore[arg-type]
    if source.kind == "hf" and weights:
        if hf_weight_files(source.where):
            from paracube.models.hf import check_weights

            check_weights(source.where)


def check_run(cfg: TrainConfig, run: RunOptions, local_ranks: int | None = None) -> None:
    """This machine's limits, and (where the run writes) its outputs, checked up front."""
    from paracube.resources import Host, check_host

    host = Host.here()
    local = local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = run.threads or max(1, host.cores // local)  # as train.default_threads
    check_host(cfg, local, threads, host, run.oversubscribe)
    from paracube.inject import check_world

    check_world(run.inject, cfg.parallel.world_size)
    if os.environ.get("RANK", "0") != "0":
        return
    if cfg.metrics is not None:
        from paracube.outputs import check_output

        check_output(cfg.metrics, "--metrics", cfg.metrics_mode)
    if run.profile is not None:
        if run.profile[1] >= cfg.steps:
            raise ConfigError(
                f"--profile {run.profile[0]}-{run.profile[1]}: the run has steps 0-{cfg.steps - 1}"
            )
        from paracube.outputs import check_output

        check_output(os.path.join(run.profile_dir, "rank0-step0.json"), "--profile-dir")
    if run.predict:
        from paracube.planner.local import load

        load()  # a damaged calibration is refused now, not after the run
    ck = cfg.checkpoint
    if run.max_restarts and ck.save_dir is None:
        raise ConfigError(
            f"--max-restarts {run.max_restarts} needs --save-dir (and --save-every): a restart "
            "resumes from the newest checkpoint there"
        )
    if ck.save_dir is not None:
        from paracube.outputs import check_folder

        check_folder(ck.save_dir, "--save-dir")
    if ck.resume is not None:
        from paracube.checkpoint.check import check_resume

        check_resume(cfg)  # the checkpoint exists, is complete and fits this model
    if ck.init_from is not None:
        from paracube.checkpoint.export import check_init_from

        check_init_from(ck.init_from, cfg)


def check_tensor_parallel(model: ModelConfig, parallel: ParallelConfig) -> None:
    """Every dimension that tensor parallelism splits must divide by ``tp``."""
    tp = parallel.tp
    if tp == 1:
        return
    splits = [
        ("attention heads", "n_heads", model.n_heads),
        ("key/value heads", "n_kv_heads", model.n_kv_heads),
        ("hidden size", "hidden", model.hidden),
        ("MLP size", "ffn_hidden", model.ffn_hidden),
    ]  # the vocabulary need not divide: it is padded to a multiple of tp (Megatron's rule)
    if parallel.sequence_parallel:
        splits.append(("sequence length", "seq_len", model.seq_len))
    for what, name, value in splits:
        if value % tp:
            raise ConfigError(
                f"{what} ({name}={value}) is not divisible by --tp {tp}: "
                f"choose a tp that divides {value}, or a model whose {name} is a multiple of {tp}"
            )


def check_pipeline(cfg: TrainConfig) -> None:
    """The schedule accepts (pp, micro-batches, chunks), and every stage gets a layer."""
    par = cfg.parallel
    check_schedule(par.schedule, par.pp, cfg.grad_accum, par.chunks)
    stages, layers = par.pp * par.chunks, cfg.model.n_layers + 3
    if layers < stages:
        raise ConfigError(
            f"the model has {layers} pipeline layers (embedding, {cfg.model.n_layers} blocks, norm, head) "
            f"for {stages} stages (pp {par.pp} × chunks {par.chunks}): use fewer stages or a deeper model"
        )
