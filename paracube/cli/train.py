"""``paracube train``: its arguments, the job they describe, and how its ranks start."""

from __future__ import annotations

import os
import sys

from paracube.cli.train_args import DEFAULT_MODEL, add_parser
from paracube.config import ModelConfig, ParallelConfig, TrainConfig
from paracube.data.tokenized import is_tokenized, model_vocab, read_index
from paracube.errors import ParacubeError
from paracube.models.sources import (
    ModelSource,
    dropouts_turned_off,
    parse_model,
    read_hf_config,
    source_config,
    source_of,
)

__all__ = ["add_parser", "cmd_train", "config_from_args"]
from paracube.options import CheckpointConfig


def config_from_args(args) -> TrainConfig:
    """The job the arguments describe; flags that contradict each other or do nothing in
    this layout are refused, each named."""
    _check_flags(args)
    if args.model is None and args.init_from is not None and args.resume is None:
        # the model the weights are of: an export's or an import's (paracube import); with
        # --resume too, CheckpointConfig refuses the pair first
        from paracube.checkpoint.export import exported_model

        source = ModelSource("file", args.init_from)
        model = exported_model(args.init_from)
        model = model if args.seq_len is None else model.replace(seq_len=args.seq_len)
    else:
        source = parse_model(args.model or DEFAULT_MODEL)
        model = _model_config(source, args)
    pipeline = {
        name: getattr(args, name)
        for name in ("schedule", "chunks", "balance")
        if getattr(args, name) is not None
    }
    steps_per_batch = args.microbatches if args.microbatches is not None else args.grad_accum
    return TrainConfig(
        model=model,
        model_source=None if source.kind == "file" else source.spec,
        parallel=ParallelConfig(
            dp=args.dp,
            tp=args.tp,
            pp=args.pp,
            bucket_mb=args.bucket_mb,
            sequence_parallel=args.sequence_parallel,
            gpus_per_node=args.gpus_per_node,
            **pipeline,
        ),
        steps=args.steps,
        micro_batch=args.micro_batch,
        grad_accum=steps_per_batch or 1,
        global_batch=args.global_batch,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        seed=args.seed,
        data=args.data,
        val_fraction=args.val_fraction,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        metrics=args.metrics,
        metrics_mode=args.metrics_mode,
        on_nan=args.on_nan,
        progress=not args.no_progress,
        zero=_zero_stage(args.zero),
        recompute=args.recompute,
        recompute_blocks=args.recompute_blocks,
        compile=args.compile,
        offload=args.offload,
        compress=args.compress,
        error_feedback=not args.no_error_feedback,
        dp_mode=args.dp_mode,
        precision=args.precision,
        grad_reduce="compute"
        if args.grad_reduce in ("compute", "bf16", "fp16")
        else args.grad_reduce,
        loss_scale=args.loss_scale,
        count_activations_every=args.count_activations_every,
        data_workers=args.data_workers,
        prefetch=args.prefetch,
        straggler_threshold=args.straggler_threshold,
        dp_balance=args.dp_balance,
        checkpoint=CheckpointConfig(
            save_dir=args.save_dir,
            every=args.save_every,
            keep_last=args.keep_last,
            resume=args.resume,
            init_from=args.init_from,
            async_save=args.async_save,
        ),
    )


def _model_config(source: ModelSource, args) -> ModelConfig:
    """The shape of ``--model``: a preset's (its embedding sized for a tokenized dataset's
    tokenizer), a Hugging Face config's, or a factory's (one call on the meta device)."""
    if source.kind == "factory":
        from paracube.models.spec import factory_config

        shape = factory_config(source.where, args.tp, args.sequence_parallel)
        return shape if args.seq_len is None else shape.replace(seq_len=args.seq_len)
    if source.kind == "hf":
        off = dropouts_turned_off(read_hf_config(source.where))
        if off:
            print(
                f"paracube: note: --model hf:{source.where}: dropout off ({', '.join(off)}): "
                "paracube trains without dropout, so that every layout computes the same model",
                file=sys.stderr,
            )
    vocab = None
    if source.kind == "preset" and is_tokenized(args.data):
        vocab = model_vocab(read_index(args.data).vocab_size)
    return source_config(source, args.seq_len, vocab)


def _check_flags(args) -> None:
    """Flags the config cannot see: which were given, and under which names."""
    for flag in ("microbatches", "grad_accum", "seq_len"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ParacubeError(
                f"--{flag.replace('_', '-')} must be a positive integer, got {value}"
            )
    given = [
        f"--{f.replace('_', '-')}"
        for f in ("grad_accum", "microbatches", "global_batch")
        if getattr(args, f) is not None
    ]
    if len(given) > 1:
        raise ParacubeError(
            f"{' and '.join(given)} both set the micro-batches per step: give only one"
        )
    if args.pp == 1:
        for flag in ("schedule", "chunks", "balance"):
            if getattr(args, flag) is not None:
                raise ParacubeError(
                    f"--{flag} {getattr(args, flag)} needs --pp > 1: it shapes the pipeline, "
                    "and this job has none"
                )


def _zero_stage(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ParacubeError(f"unknown --zero {text!r}: choose 0, 1, 2 or 3") from None


def run_options(args):
    """How the job's ranks run (threads, timeout, faults injected…), from the arguments."""
    from paracube.inject import parse_injections
    from paracube.options import RunOptions
    from paracube.profiling import parse_steps

    return RunOptions(
        inject=parse_injections(args.inject),
        profile=parse_steps(args.profile) if args.profile is not None else None,
        profile_dir=args.profile_dir,
        threads=args.threads,
        timeout_s=args.timeout,
        oversubscribe=args.oversubscribe,
        predict=args.predict,
        max_restarts=args.max_restarts,
    )


class LocalJob:
    """A job checked and ready to start on this machine's ranks: :meth:`start` launches
    them (every check is done by the constructor, before any process)."""

    def __init__(self, args, cfg: TrainConfig, run) -> None:
        from paracube.validate import validate

        self.cfg, self.run = cfg, run
        self.nodes = _nodes(args, cfg.parallel.world_size, run.timeout_s)
        self.local = cfg.parallel.world_size // self.nodes.count
        validate(cfg, cfg.parallel.world_size, run=run, local_ranks=self.local)
        from paracube.train import default_threads

        # the user's OMP_NUM_THREADS if set, else this job's threads per rank
        self.omp = os.environ.get("OMP_NUM_THREADS") or str(
            run.threads or default_threads(self.local)
        )

    def start(self) -> int:
        """Run the job to its end; its exit status."""
        from paracube.launch import launch_local, run_rank
        from paracube.train import train_rank

        os.environ["OMP_NUM_THREADS"] = self.omp
        return launch_local(
            self.local,
            run_rank,
            train_rank,
            self.cfg,
            self.run,
            nodes=self.nodes,
            max_restarts=self.run.max_restarts,
            preload=_rank_imports(self.cfg),
        )


def _rank_imports(cfg: TrainConfig) -> tuple[str, ...]:
    """The heavy modules this job's ranks import beyond every job's: a Hugging Face model's
    ``transformers`` (~3 s of CPU a rank when each imports it)."""
    source = cfg.model_source and source_of(cfg.model_source)
    return ("transformers", "transformers.modeling_utils") if source and source.kind == "hf" else ()


def cmd_train(args) -> int:
    from paracube.launch import inside_torchrun, run_rank
    from paracube.train import train_rank

    diagnose_after = _diagnosed_metrics(args)
    cfg = config_from_args(args)
    run = run_options(args)
    if inside_torchrun():
        from paracube.mesh.mesh import shutdown

        status = run_rank(train_rank, cfg, run)
        lead = os.environ.get("RANK") == "0"  # the rank that wrote the metrics
        _diagnosis_after(status == 0 and lead, cfg.metrics, diagnose_after)
        # shutdown(): see its docstring (a torch teardown race).
        return shutdown(status)
    status = LocalJob(args, cfg, run).start()
    written = (
        cfg.metrics is not None and os.path.exists(cfg.metrics) and os.path.getsize(cfg.metrics)
    )
    _diagnosis_after(status == 0 and bool(written), cfg.metrics, diagnose_after)  # rank 0's node
    return status


def _diagnosis_after(ready: bool, metrics: str | None, temporary: str | None) -> None:
    """--diagnose (``temporary`` not None): ``paracube diagnose`` on the run's metrics if
    ``ready``; a temporary metrics file is removed either way."""
    if temporary is None:
        return
    if ready and metrics:
        from paracube.cli.diagnose import diagnose

        print(diagnose(metrics), flush=True)
    if temporary and os.path.exists(temporary):
        os.remove(temporary)


def _diagnosed_metrics(args) -> str | None:
    """With --diagnose: the metrics file it reads — the run's --metrics, or a temporary
    file (returned, to be removed) when none was given; None without --diagnose."""
    if not args.diagnose:
        return None
    if args.metrics is not None:
        return ""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="paracube-metrics-", suffix=".jsonl")
    os.close(fd)
    args.metrics, args.metrics_mode = path, "overwrite"
    return path


def _nodes(args, world: int, timeout_s: float):
    from paracube.launch import Nodes

    if args.nnodes <= 0:
        raise ParacubeError(f"--nnodes must be a positive integer, got {args.nnodes}")
    if args.nnodes == 1:
        if args.rdzv_endpoint is not None:
            raise ParacubeError(
                "--rdzv-endpoint needs --nnodes > 1: a one-machine job meets locally"
            )
        return Nodes()
    if not args.rdzv_endpoint or ":" not in args.rdzv_endpoint:
        raise ParacubeError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (one of the machines), "
            f"got {args.rdzv_endpoint!r}"
        )
    host, _, port = args.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ParacubeError(f"--rdzv-endpoint {args.rdzv_endpoint}: write it as HOST:PORT")
    if world % args.nnodes:
        raise ParacubeError(
            f"dp×tp×pp = {world} ranks do not split evenly over --nnodes {args.nnodes}: "
            "make the world size a multiple of the machines"
        )
    # A node that is not the store's host logs a C++ warning when the host shuts the store
    # down at the end of a good run; only errors are worth a line.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return Nodes(args.nnodes, args.rdzv_endpoint, timeout_s)
