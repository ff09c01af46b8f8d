"""What ``paracube train`` prints: the opening banner, the progress bar, the closing
summary, and the planner's prediction beside the measured run (``--predict``)."""

from __future__ import annotations

import sys

from paracube.choices import ELEMENT_BYTES
from paracube.config import TrainConfig
from paracube.metrics import StepMetrics

MIB = 2**20


def banner(cfg: TrainConfig, trainer, first_val: float | None) -> str:
    """The job in a few lines: model, layout, batch, data, memory options, pipeline split."""
    from paracube.models.shapes import parameter_count

    lines = [
        f"paracube: {cfg.model.name} ({parameter_count(cfg.model):,} parameters), {trainer.mesh.layout.describe()}, "
        f"global batch {cfg.global_batch} × {cfg.model.seq_len} tokens "
        f"(micro-batch {cfg.micro_batch} × accum {cfg.grad_accum} × dp {cfg.parallel.dp}); "
        f"data: {trainer.corpus.describe()}"
    ]
    extras = [
        f"ZeRO-{cfg.zero}" if cfg.zero else "",
        cfg.precision if cfg.precision != "fp32" else "",
        f"{cfg.recompute} recompute" if cfg.recompute != "none" else "",
    ]
    if any(extras):
        lines.append("paracube: " + ", ".join(e for e in extras if e))
    if trainer.parallel.description is not None:
        lines.append(f"paracube: {trainer.parallel.description}")
    lines.append(_build_memory(cfg, trainer))
    if first_val is not None:
        lines.append(f"paracube: step 0 validation loss {first_val:.4f}")
    return "\n".join(lines)


def _build_memory(cfg: TrainConfig, trainer) -> str:
    """What building the model cost rank 0 — under tensor/pipeline parallelism its shards
    plus one parameter at a time; under ZeRO-3 the wrapper's per-unit buffers too."""
    from paracube.models.shapes import parameter_count

    mib = 2**20
    shards = sum(p.numel() * 4 for _, p in trainer.serial_named_parameters())
    whole = parameter_count(cfg.model) * 4
    sliced = ""
    if cfg.zero == 3:
        kept = sum(u.param_shard.numel() * 4 for u in trainer.parallel.grad_sync.all_units)
        sliced = f"; its ZeRO-3 slices of them {kept / mib:,.1f} MiB"
    return (
        f"paracube: model build on rank 0: peak memory +{trainer.parallel.build_bytes / mib:,.1f} MiB "
        f"(its tensor/pipeline shards in fp32 {shards / mib:,.1f} MiB; the whole model in fp32 "
        f"{whole / mib:,.1f} MiB{sliced})"
    )


def progress_bar(cfg: TrainConfig, lead: bool, start: int = 0):
    """A tqdm bar on rank 0's stderr (None elsewhere or with --no-progress), from ``start``
    (a resumed run's step)."""
    if not (lead and cfg.progress):
        return None
    from tqdm import tqdm

    return tqdm(
        total=cfg.steps,
        initial=start,
        desc="train",
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5 if sys.stderr.isatty() else 10.0,
    )


def summary(history: list[StepMetrics], first_val: float | None, wall: float) -> str:
    """Closing report: loss and validation loss from first to last, and where time went."""
    steady = history[1:] or history  # step 0 includes one-off warm-up costs
    total = sum(m.step_time for m in steady)
    phases = {k: sum(m.time.get(k, 0.0) for m in steady) for k in steady[0].time}
    split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in phases.items())
    comm = steady[-1].comm
    grad_bytes = sum(
        comm.get(k, {"bytes": 0})["bytes"]
        for k in ("all_reduce/grad", "reduce_scatter/grad", "send/ps_push")  # ps: the push
    )
    vals = [m.val_loss for m in history if m.val_loss is not None]
    lines = [
        f"paracube: {len(history)} steps in {wall:.1f}s; loss {history[0].loss:.4f} → {history[-1].loss:.4f}",
        f"paracube: median {sorted(m.tokens_per_s for m in steady)[len(steady) // 2]:,.0f} tokens/s; "
        f"time split: {split}; gradient reduction {grad_bytes / MIB:.2f} MiB/step",
    ]
    if history[-1].loss_scale is not None:
        skipped = sum(1 for m in history if m.skipped)
        lines.append(
            f"paracube: fp16 loss scale {history[-1].loss_scale:g}; {skipped} step(s) skipped on overflow"
        )
    mem = steady[-1].memory
    if mem:
        mib = {k: v / MIB for k, v in mem.items()}
        lines.append(
            f"paracube: memory per rank (rank 0): weights {mib['weights']:.2f} MiB, "
            f"gradients {mib['gradients']:.2f} MiB, "
            f"optimizer {mib['optimizer']:.2f} MiB, saved activations peak {mib['activations_peak']:.2f} MiB"
            + (
                f", gathered parameters peak {mib['params_peak']:.2f} MiB"
                if "params_peak" in mib
                else ""
            )
            + (
                f", full gradient buffers peak {mib['grad_buffers_peak']:.2f} MiB"
                if "grad_buffers_peak" in mib
                else ""
            )
            + (f", parameter server {mib['ps_server']:.2f} MiB" if "ps_server" in mib else "")
        )
        if "cuda_max_allocated" in mem:
            lines.append(allocator_gap(mem))
    if vals:
        start = f"{first_val:.4f} → " if first_val is not None else ""
        lines.insert(1, f"paracube: validation loss {start}{vals[-1]:.4f}")
    return "\n".join(lines)


def staleness(counts: dict[int, int]) -> str:
    """--dp-mode ps: the distribution of the applied gradients' staleness."""
    total = sum(counts.values())
    mean = sum(k * v for k, v in counts.items()) / total
    shares = ", ".join(f"{k}: {100 * v / total:.0f}%" for k, v in counts.items())
    return (
        f"paracube: parameter server: {total} pushes applied; staleness (updates between a "
        f"worker's pull and its push) mean {mean:.2f}, max {max(counts)}; {shares}"
    )


def prediction(
    cfg: TrainConfig,
    history: list[StepMetrics],
    threads: int,
    local_ranks: int,
    device_name: str | None = None,
) -> str:
    """The planner's predicted step time and model-state memory next to the measured ones.

    On CPU ranks the planner sees this machine as ``paracube calibrate`` measured it; on a
    GPU (``device_name``, CUDA's name for it) as the calibration measured that GPU and, on a
    later line, as the catalog's datasheet entry for it."""
    from paracube.models.shapes import model_saved_bytes
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.time_model import Cluster, estimate

    hardware = _prediction_hardware(device_name, threads, local_ranks)
    if isinstance(hardware, str):
        return hardware
    layout = Layout.from_config(cfg)
    times = [
        estimate(
            cfg.model, layout, Cluster(rank_gpu, cfg.parallel.world_size, link, link),
            precision=cfg.precision,
        ).step_time
        for _, rank_gpu, link in hardware
    ]  # fmt: skip
    steady = sorted(m.step_time for m in history[1:] or history)
    measured = steady[len(steady) // 2]
    predicted_states = stage_memory(cfg.model, layout, cfg.precision)[0].model_states
    mem = history[-1].memory or {}  # counted where all model states coexist (see OptimizerStep)
    counted = mem["weights"] + mem["gradients"] + mem["optimizer"]
    line = (
        f"paracube: predicted step {times[0] * 1e3:.1f} ms, measured median {measured * 1e3:.1f} ms "
        f"(predicted/measured {times[0] / measured:.2f}; {hardware[0][0]}); model states on rank 0: predicted "
        f"{predicted_states / MIB:.2f} MiB, counted {counted / MIB:.2f} MiB"
    )
    if (
        cfg.parallel.tp == 1 and cfg.parallel.pp == 1
    ):  # activations: the op-by-op formula for paracube's model
        want = model_saved_bytes(
            cfg.model,
            cfg.micro_batch,
            elem=ELEMENT_BYTES[cfg.precision],
            recompute=cfg.recompute,
            recompute_blocks=cfg.recompute_blocks,
        )
        line += (
            f"; saved activations per micro-batch: predicted {want / MIB:.2f} MiB, "
            f"counted peak {mem['activations_peak'] / MIB:.2f} MiB"
        )
    if "cuda_max_allocated" in mem:
        line += "\n" + _gpu_peak_memory(cfg, layout, mem)
    for (label, _, _), time in zip(hardware[1:], times[1:]):
        line += (
            f"\nparacube: predicted step {time * 1e3:.1f} ms with the {label} "
            f"(predicted/measured {time / measured:.2f})"
        )
    return line


def _prediction_hardware(device_name: str | None, threads: int, local_ranks: int) -> list | str:
    """(label, GPU, link) of each prediction, the calibrated one first — or the line that
    says why there is none."""
    from paracube.planner import local
    from paracube.planner.hardware import DEFAULT_INTRA, GPUS, INTERCONNECTS, catalog_key

    data = local.load()
    if device_name is None:
        if data is None:
            return "paracube: --predict: no calibration of this machine; run `paracube plan --calibrate` first"
        return [("calibrated", *local.local_hardware(data, threads, local_ranks))]
    hardware: list = []
    if data is not None and (calibrated := local.calibrated_gpu(data)) is not None:
        hardware.append(("calibrated", *calibrated))
    if (key := catalog_key(device_name)) is not None:
        listed = GPUS[key]
        hardware.append((f"{listed.name} datasheet", listed, INTERCONNECTS[DEFAULT_INTRA[key]]))
    if not hardware:
        return (
            f"paracube: --predict: {device_name} is not in the planner's catalog and not "
            "calibrated; run `paracube calibrate` on this machine first"
        )
    return hardware


def _gpu_peak_memory(cfg: TrainConfig, layout, mem: dict[str, int]) -> str:
    """The CUDA allocator's peak beside the planner's fit figure and, for one serial rank,
    beside the counted memory plus the loss backward's transient."""
    from paracube.models.shapes import loss_backward_transient_bytes
    from paracube.planner.layout_memory import CONTEXT_BYTES, FRAGMENTATION, stage_memory

    peak = mem["cuda_max_allocated"]
    inside = stage_memory(cfg.model, layout, cfg.precision)[0].total - CONTEXT_BYTES
    line = (
        f"paracube: peak memory: the CUDA allocator's {peak / MIB:.0f} MiB; the planner's "
        f"{inside / MIB:.0f} MiB in the allocator (model states, activations, the loss "
        f"backward's gradients, a {100 * FRAGMENTATION:.0f} % allowance; plus "
        f"{CONTEXT_BYTES / MIB:.0f} MiB of CUDA context; planner/allocator {inside / peak:.2f})"
    )
    if cfg.parallel.tp == 1 and cfg.parallel.pp == 1 and cfg.grad_accum == 1:
        transient = loss_backward_transient_bytes(cfg.model, cfg.micro_batch)
        states = mem["weights"] + mem["gradients"] + mem["optimizer"]
        derived = states + mem["activations_peak"] + transient
        line += (
            f"; counted states and activations + the loss backward's fp32 gradients "
            f"({transient / MIB:.0f} MiB) {derived / MIB:.0f} MiB (allocator − these: "
            f"{(peak - derived) / MIB:.0f} MiB)"
        )
    return line


def allocator_gap(mem: dict[str, int]) -> str:
    """The CUDA allocator's peak beside what paracube counts (model states, the saved
    activations' peak, ZeRO-3's gathered parameters, ZeRO-2/3's full gradient buffers): the
    rest is the transient tensors
    nothing keeps — backward's gradients of activations in flight, the fp32 logits and
    their gradient, kernels' workspaces — which counting does not see."""
    counted = sum(
        mem.get(k, 0)
        for k in (
            "weights",
            "gradients",
            "optimizer",
            "activations_peak",
            "params_peak",
            "grad_buffers_peak",
        )
    )
    peak = mem["cuda_max_allocated"]
    return (
        f"paracube: CUDA allocator peak {peak / MIB:.0f} MiB; counted {counted / MIB:.0f} MiB "
        f"(model states + saved activations peak); uncounted transients {(peak - counted) / MIB:.0f} MiB "
        f"({100 * (peak - counted) / peak:.0f} % of the peak)"
    )
