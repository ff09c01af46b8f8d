"""``paracube schedule``: simulate one step of a pipeline schedule, draw it, print its bubble."""

from __future__ import annotations

import os

from paracube.errors import ParacubeError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "schedule",
        help="draw a pipeline schedule's timeline; print its bubble and peak memory",
        description="Simulate one step of a pipeline schedule and draw ranks × time.",
    )
    p.add_argument("--pp", type=int, required=True, help="pipeline stages (ranks)")
    p.add_argument("--microbatches", type=int, required=True, help="micro-batches per step (m)")
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b, interleaved-1f1b, zb-h1")
    p.add_argument(
        "--chunks", type=int, default=1, help="virtual chunks per rank (interleaved-1f1b)"
    )
    p.add_argument(
        "--costs",
        default=None,
        help="per-action costs F,B[,W] (e.g. 1,2 or 1,1,1), or a metrics JSONL of a pipeline run",
    )
    p.add_argument("--out", default=None, help="timeline picture, .png or .svg")
    p.set_defaults(func=cmd_schedule)


def _costs_from(text: str | None):
    """Costs from 'F,B' / 'F,I,W' numbers or from a run's metrics file (its last step)."""
    from paracube.pipeline import Costs

    if text is None:
        return Costs(), "unit costs (F = 1, B = 2 = I + W)"
    if os.path.exists(text):
        from paracube.metrics import read_metrics

        runs = [r for r in read_metrics(text) if r.get("pipeline")]
        if not runs:
            raise ParacubeError(
                f"--costs {text}: no pipeline step in that metrics file; give a file from a --pp run"
            )
        t = runs[-1]["pipeline"]["action_seconds"]
        f, i, w = t.get("F", 0.0), t.get("I", t.get("B", 0.0)), t.get("W", 0.0)
        return Costs(
            F=f, I=i, W=w
        ), f"measured costs from {text} (rank 0): F={f * 1e3:.2f} ms, B={(i + w) * 1e3:.2f} ms"
    try:
        nums = [float(x) for x in text.split(",")]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or any(x < 0 for x in nums):
        raise ParacubeError(
            f"--costs {text!r}: give F,B or F,I,W as non-negative numbers, or a metrics file"
        )
    if len(nums) == 2:
        return Costs(F=nums[0], I=nums[1] / 2, W=nums[1] / 2), f"costs F={nums[0]}, B={nums[1]}"
    return Costs(F=nums[0], I=nums[1], W=nums[2]), f"costs F={nums[0]}, I={nums[1]}, W={nums[2]}"


def cmd_schedule(args) -> int:
    from paracube.pipeline import get_schedule, simulate

    for name in ("pp", "microbatches"):
        if getattr(args, name) <= 0:
            raise ParacubeError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.out and not args.out.endswith((".png", ".svg")):
        raise ParacubeError(f"--out {args.out}: the picture must be a .png or .svg file")
    costs, what = _costs_from(args.costs)
    schedule = get_schedule(args.schedule)
    p, m, v = args.pp, args.microbatches, args.chunks
    t = simulate(schedule.build(p, m, v), costs, v=v)
    formula = schedule.bubble_fraction(p, m, v, costs.F, costs.I, costs.W)
    print(
        f"{args.schedule}: pp={p}, micro-batches={m}"
        + (f", chunks={v}" if v > 1 else "")
        + f"; {what}"
    )
    print(f"bubble fraction {t.bubble_fraction:.4f} (formula {formula:.4f}, {schedule.reference})")
    print(
        "peak in-flight micro-batches per rank: "
        + ", ".join(f"{t.peak_in_flight(r):g}" for r in range(p))
    )
    print(f"step time {t.makespan:.4g} (busy per rank {t.busy(0):.4g})")
    if args.out:
        from paracube.pipeline.timeline import draw

        draw(
            t,
            f"{args.schedule}  p={p} m={m}"
            + (f" v={v}" if v > 1 else "")
            + f"  bubble {t.bubble_fraction:.1%}",
            args.out,
        )
        print(f"timeline written to {args.out}")
    return 0
