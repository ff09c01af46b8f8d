"""``paracube train``'s arguments — a table, kept apart from what the command does
(:mod:`paracube.cli.train`)."""

from __future__ import annotations

DEFAULT_MODEL = "tiny"  # --model when neither it nor --init-from is given


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train with data, tensor and pipeline parallelism, locally or under torchrun",
        description="Train the reference GPT on the embedded corpus (or --data) across ranks.",
    )
    add_arguments(p)
    from paracube.cli.train import cmd_train

    p.set_defaults(func=cmd_train)


def add_arguments(p) -> None:
    """The job's flags, on ``train`` and on ``scale`` (which runs the job at several dp)."""
    d = p.add_argument_group("diagnosis: loading, timing, stragglers, injected faults")
    d.add_argument(
        "--data-workers",
        type=int,
        default=0,
        help="background threads making micro-batches ahead of the step (default 0: none)",
    )
    d.add_argument(
        "--prefetch",
        type=int,
        default=2,
        help="with --data-workers: micro-batches made ahead (default 2)",
    )
    d.add_argument(
        "--straggler-threshold",
        type=float,
        default=0.10,
        help="name a rank whose compute stays this far above its peers' median (default 0.10)",
    )
    d.add_argument(
        "--diagnose",
        action="store_true",
        help="after the run: where its time went and the fix (paracube diagnose on its metrics)",
    )
    d.add_argument(
        "--profile",
        default=None,
        metavar="STEPS",
        help="torch profiler traces of step N or steps A-B, one file per rank and step",
    )
    d.add_argument(
        "--profile-dir",
        default="runs/profile",
        help="where --profile writes rank{r}-step{s}.json (default runs/profile)",
    )
    d.add_argument(
        "--inject",
        action="append",
        default=None,
        metavar="KIND=VALUE",
        help="a fault, for tests and demos: slow-rank=R:FACTOR, data-delay=SECONDS, comm-delay=SECONDS",
    )
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    g.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="with --tp: shard norms and the residual stream along the sequence",
    )
    g.add_argument(
        "--dp-balance",
        default="even",
        metavar="even|auto|W0,W1,...",
        help="each data-parallel rank's share of the global batch: even (default), auto "
        "(by measured speed, re-balanced as the run goes) or one weight per rank",
    )
    g.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="machines in the job: run the same command on each (needs --rdzv-endpoint)",
    )
    g.add_argument(
        "--rdzv-endpoint",
        default=None,
        help="with --nnodes: HOST:PORT of one of the machines, where they meet",
    )
    g.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="ranks per node; tp must fit in one (default: not checked)",
    )
    g.add_argument(
        "--schedule",
        default=None,
        help="with --pp: pipeline schedule: gpipe, 1f1b (default), interleaved-1f1b, zb-h1",
    )
    g.add_argument(
        "--microbatches",
        type=int,
        default=None,
        help="micro-batches per step (pipeline's m; sets --grad-accum)",
    )
    g.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="with --pp: virtual chunks per rank (interleaved-1f1b)",
    )
    g.add_argument(
        "--balance",
        default=None,
        help="with --pp: stage balancing: params (default), flops, memory, time (measured "
        "layers), speed (each stage's own measured speed and memory: a slower or smaller "
        "device gets fewer layers)",
    )
    g.add_argument(
        "--bucket-mb", type=float, default=25.0, help="gradient bucket size in MiB (default 25)"
    )
    z = p.add_argument_group("memory: ZeRO, recomputation, precision")
    z.add_argument(
        "--zero",
        default="0",
        help="ZeRO stage over the data-parallel ranks: 0 (off), 1 (optimizer states), "
        "2 (+ gradients), 3 (+ parameters) (default 0)",
    )
    z.add_argument(
        "--recompute",
        default="none",
        help="activation recomputation: none, selective (attention core), full (whole blocks)",
    )
    z.add_argument(
        "--recompute-blocks",
        type=int,
        default=None,
        help="recompute only the first N blocks (default: all)",
    )
    z.add_argument(
        "--compile",
        default="none",
        help="torch.compile the model's blocks (paracube's GPT's, a Hugging Face model's "
        "decoder layers, a factory's units): none (default), inductor, or partition "
        "(inductor's decompositions and partitioner without code generation: what a compiled "
        "block keeps, at eager speed); with --recompute none or full",
    )
    z.add_argument(
        "--compress",
        default="none",
        help="gradient compression for the data-parallel reduction: none (default), fp16, bf16 "
        "(any ZeRO stage), topk:RATIO (the largest entries, with error feedback), powersgd:RANK "
        "(rank-r factors, error feedback, warm start) (ZeRO 0/1)",
    )
    z.add_argument(
        "--dp-mode",
        default="sync",
        help="sync (gradients reduced every step, default), local-sgd:H (each rank steps alone, "
        "parameters averaged every H steps) or diloco:H (H local AdamW steps, then an outer "
        "Nesterov step on the averaged change) or stale:S (step t applies the gradient reduced "
        "during steps t-S..t-1: communication overlaps the next S steps' compute) or ps[:S] "
        "(a parameter server on rank 0 applies each worker's gradient as it arrives; a worker "
        "more than S pushes ahead of the slowest waits; steps x dp pushes in all)",
    )
    z.add_argument(
        "--no-error-feedback",
        action="store_true",
        help="with topk or powersgd: drop what was not sent instead of carrying it (for studies)",
    )
    z.add_argument(
        "--offload",
        default="none",
        help="optimizer: fp32 master weights and optimizer states in host memory, stepped on "
        "the CPU (ZeRO-Offload; GPUs only) (default none)",
    )
    z.add_argument(
        "--precision",
        default="fp32",
        help="fp32, bf16 or fp16 (fp32 master weights) (default fp32)",
    )
    z.add_argument(
        "--grad-reduce",
        default="fp32",
        help="under bf16/fp16: accumulate and reduce gradients in fp32 (default) or in the compute dtype",
    )
    z.add_argument(
        "--loss-scale",
        default=None,
        help="fp16 loss scaling: dynamic (default for fp16) or a fixed number",
    )
    z.add_argument(
        "--count-activations-every",
        type=int,
        default=10,
        help="count saved activation bytes on every N-th step (default 10; 1: every step)",
    )
    m = p.add_argument_group("model and data")
    m.add_argument(
        "--model",
        default=None,
        help=f"a preset (default {DEFAULT_MODEL}; see paracube.models.PRESETS), hf:DIR (a local "
        "Hugging Face config.json, optional model.safetensors or shards), or a factory "
        "package.module:function returning a paracube.models.ModelSpec; with --init-from and "
        "no --model, the model the file's weights are of",
    )
    m.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="the training window (default: the preset's, a Hugging Face model's context up to 1024, or a factory's)",
    )
    m.add_argument(
        "--data", default=None, help="text file or folder (default: embedded stdlib corpus)"
    )
    m.add_argument(
        "--val-fraction", type=float, default=0.05, help="validation split (default 0.05)"
    )
    t = p.add_argument_group("optimisation")
    t.add_argument("--steps", type=int, default=100)
    t.add_argument("--micro-batch", type=int, default=8, help="sequences per rank per micro-step")
    t.add_argument(
        "--grad-accum", type=int, default=None, help="micro-steps per optimizer step (default 1)"
    )
    t.add_argument(
        "--global-batch", type=int, default=None, help="sequences per step; sets --grad-accum"
    )
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--min-lr", type=float, default=3e-4)
    t.add_argument("--warmup-steps", type=int, default=10)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument("--eval-every", type=int, default=0, help="validation every N steps (0: never)")
    r.add_argument("--eval-batches", type=int, default=4)
    r.add_argument("--metrics", default=None, help="write one JSON object per step to this file")
    r.add_argument(
        "--metrics-mode",
        default="new",
        help="if the --metrics file exists: new (refuse, default), append, overwrite",
    )
    r.add_argument(
        "--on-nan",
        default="stop",
        help="a non-finite loss or gradient norm: stop (default, exit 3), skip the step, continue",
    )
    c = p.add_argument_group("checkpoints")
    c.add_argument("--save-dir", default=None, help="folder of the step-N checkpoints")
    c.add_argument(
        "--save-every", type=int, default=None, help="save after every N-th step (and the last)"
    )
    c.add_argument("--keep-last", type=int, default=None, help="keep only the newest K")
    c.add_argument("--async-save", action="store_true", help="write checkpoints in the background")
    c.add_argument(
        "--init-from", default=None, help="start from exported weights (paracube export)"
    )
    c.add_argument(
        "--resume",
        default=None,
        help="a checkpoint folder, or auto (the newest in --save-dir); any layout may load it",
    )
    r.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="after a rank fails, restart the ranks up to N times from the newest checkpoint",
    )
    r.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more local ranks or threads than this machine's cores sensibly run",
    )
    r.add_argument(
        "--threads", type=int, default=None, help="torch threads per rank (default cores/ranks)"
    )
    r.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a stalled collective fails"
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument(
        "--predict",
        action="store_true",
        help="print the planner's predicted step time and memory next to the measured ones",
    )
