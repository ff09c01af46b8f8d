"""The causes of lost scaling ranked by seconds, each with its fix in paracube's terms."""

from __future__ import annotations

from paracube.diagnose.breakdown import LOSSES, Breakdown

LABELS = {
    "compute": "compute",
    "small_batch": "small micro-batch (compute a larger one would save)",
    "data": "waiting for data",
    "comm_dp": "data-parallel communication (exposed)",
    "comm_tp": "tensor-parallel communication",
    "comm_pp": "pipeline transfers",
    "bubble": "pipeline bubble",
    "straggler": "waiting for a slower rank",
    "optimizer": "optimizer",
    "other": "other (between phases, the timing gather)",
}


def fix(part: str, b: Breakdown, header: dict, where: list[str]) -> str:
    mb = header.get("micro_batch", "?")
    if part == "data":
        return "load ahead of the step: --data-workers 2 --prefetch 4 (or a faster source)"
    if part == "comm_dp":
        fewer = (
            "ZeRO-1 instead of ZeRO-3 (one reduction of the gradients, no parameter gathers)"
            if header.get("zero") == 3
            else "bf16 gradients (--precision bf16 --grad-reduce compute)"
        )
        return f"overlap more of it (--bucket-mb 50), fewer bytes: {fewer}, or a faster link"
    if part == "comm_tp":
        return "a smaller --tp (keep tensor parallelism inside one machine), more --dp instead"
    if part == "comm_pp":
        return "fewer pipeline stages (--pp), or larger micro-batches per transfer"
    if part == "bubble":
        return (
            "more micro-batches per step (--microbatches ≥ 4 × --pp) or "
            "--schedule interleaved-1f1b --chunks 2"
        )
    if part == "straggler":
        slow = b.slowest
        place = where[slow] if slow < len(where) else ""
        threshold = header.get("straggler_threshold", 0.10)
        if b.slowest_ratio < 1 + threshold:
            return (
                f"no rank is persistently slow (the slowest, rank {slow}, computes "
                f"{b.slowest_ratio:.2f}x its peers' median, within --straggler-threshold "
                f"{threshold:g}): the wait is step-to-step jitter — ranks sharing cores or "
                "memory bandwidth, other load on the machine; give each rank its own cores"
            )
        return (
            f"rank {slow} ({place}) computes {b.slowest_ratio:.2f}x its peers' median: check its "
            "machine (load, clocks, thermals), or give it a smaller share of each batch: "
            "--dp-balance auto (or weights, --dp-balance 2,1)"
        )
    if part == "small_batch":
        return (
            f"a larger --micro-batch than {mb} (the same global batch with fewer --grad-accum "
            "steps): the devices are not kept busy"
        )
    return ""


def causes(b: Breakdown) -> list[tuple[str, float]]:
    """The losses, most seconds first (those under 1 % of the step left out)."""
    found = [(p, b.parts[p]) for p in LOSSES if b.parts[p] > 0.01 * b.step_time]
    return sorted(found, key=lambda pv: -pv[1])
