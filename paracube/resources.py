"""What this machine can hold and run: bounds checked before any rank starts.

A job that cannot fit is refused in one line instead of exhausting the machine: too many
local ranks or threads for its cores, a model whose ranks cannot even be built in its
memory, or a step that would take hours on its CPU cores. The estimates are *lower
bounds* — a job refused here could not have run — so no job that fits is refused.
``--oversubscribe`` lifts the rank and thread limits (not the memory one). Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from paracube.choices import MEASURED_BALANCE, state_bytes_per_parameter
from paracube.config import TrainConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.planner.flops import model_flops_per_token

GIB = 2**30
# Local ranks per core before a job is refused: the demo runs 8 ranks on 2 cores (4 per
# core); beyond 8 per core a rank spends its time waiting for a core, not training.
RANKS_PER_CORE = 8
# What a rank costs before it holds any model: the interpreter, torch and gloo (~250 MB
# measured per rank on this project's machines).
RANK_RUNTIME_BYTES = 250 * 2**20
# A generous fp32 rate of one CPU core (FLOP/s): real cores here reach ~30-50 GFLOP/s in
# matmuls, so the estimated step time below is shorter than the real one.
CORE_FLOPS = 100e9
# A CPU step estimated to take longer than this is refused (one step must finish for the
# run to report anything).
MAX_STEP_SECONDS = 600.0


@dataclass(frozen=True)
class Host:
    """This machine: usable cores, available memory, and whether it has a CUDA GPU."""

    cores: int
    memory_bytes: int
    cuda: bool = False

    @classmethod
    def here(cls) -> Host:
        return cls(usable_cores(), available_memory(), cuda_available())


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int:
    """``MemAvailable`` of /proc/meminfo (what can be allocated without swapping)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cuda_available() -> bool:
    """Whether a CUDA device is visible, without importing torch (the launcher is light)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def check_host(
    cfg: TrainConfig, local_ranks: int, threads: int, host: Host, oversubscribe: bool = False
) -> None:
    """Refuse a job this machine cannot run: ranks and threads against its cores, each
    rank's memory against its memory, and on CPU one step's time against its cores."""
    if not oversubscribe and local_ranks > RANKS_PER_CORE * host.cores:
        raise ConfigError(
            f"{local_ranks} ranks on this machine's {host.cores} cores: at most "
            f"{RANKS_PER_CORE * host.cores} ({RANKS_PER_CORE} per core) run usefully; use fewer ranks, "
            "torchrun across machines, or --oversubscribe"
        )
    if not oversubscribe and threads > host.cores:
        raise ConfigError(
            f"--threads {threads} is more than this machine's {host.cores} cores: use --threads ≤ "
            f"{host.cores} (or --oversubscribe)"
        )
    if cfg.offload != "none" and not host.cuda:
        raise ConfigError(
            f"--offload {cfg.offload} moves the optimizer's states and step from the GPU to host "
            "memory: this machine has no GPU, so there is nothing to offload; leave --offload out"
        )
    need = rank_memory_bytes(cfg)
    if not host.cuda and local_ranks * need > host.memory_bytes:
        total = (
            f", {local_ranks * need / GIB:,.1f} GiB for its {local_ranks} ranks"
            if local_ranks > 1
            else ""
        )
        whole = cfg.parallel.pp > 1 and cfg.parallel.balance in MEASURED_BALANCE
        what = "--balance builds the whole model" if whole else "its share of the model states"
        raise ConfigError(
            f"--model {cfg.model.name} needs at least {need / GIB:,.1f} GiB per rank ({what}){total}; "
            f"this machine has {host.memory_bytes / GIB:,.1f} GiB available: use a smaller model "
            "(`paracube plan` sizes the cluster it needs)"
        )
    if not host.cuda:
        seconds = step_flops(cfg) / (CORE_FLOPS * host.cores)
        if seconds > MAX_STEP_SECONDS:
            raise ConfigError(
                f"one step of {cfg.model.name} at --seq-len {cfg.model.seq_len} and global batch "
                f"{cfg.global_batch} needs {step_flops(cfg):.2g} FLOPs: over {seconds / 60:,.0f} min "
                f"on this machine's {host.cores} cores; use a shorter --seq-len, a smaller batch "
                "or model, or GPUs"
            )


def rank_memory_bytes(cfg: TrainConfig) -> float:
    """A lower bound on one rank's peak memory: the runtime, the rank's share of the model
    states under its tensor/pipeline split and ZeRO stage, and — under tensor parallelism —
    the fp32 buffer its largest sharded parameter is drawn into before it is sliced (the
    model is built on the meta device: no rank holds the whole of it, paracube.materialize),
    except that ``--balance time|speed`` time the real layers: every rank builds them whole."""
    par = cfg.parallel
    params = shapes.parameter_count(cfg.model)
    weights, grads, optimizer = state_bytes_per_parameter(cfg.precision, cfg.grad_reduce)
    shard = params / (par.tp * par.pp)
    dp = par.dp
    states = shard * (
        weights / (dp if cfg.zero >= 3 else 1)
        + grads / (dp if cfg.zero >= 2 else 1)
        + optimizer / (dp if cfg.zero >= 1 else 1)
    )
    largest = max(
        [cfg.model.vocab_size * cfg.model.hidden]
        + [lin.in_features * lin.out_features for lin in shapes.block_linears(cfg.model)]
    )
    if par.pp > 1 and par.balance in MEASURED_BALANCE:
        return RANK_RUNTIME_BYTES + max(4 * params, states)
    return RANK_RUNTIME_BYTES + states + (4 * largest if par.tp > 1 else 0)


def step_flops(cfg: TrainConfig) -> float:
    """Model FLOPs of one optimizer step (forward and backward, all ranks together)."""
    return cfg.tokens_per_step * model_flops_per_token(cfg.model)
