"""``paracube schedule``: simulate one step of a pipeline schedule, draw it, print its bubble."""

from __future__ import annotations

import math
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
    looks_like_path = os.sep in text or text.endswith((".jsonl", ".json")) or os.path.exists(text)
    if looks_like_path:
        f, i, w = _measured_costs(text)
        what = f"measured costs from {text} (rank 0): F={f * 1e3:.2f} ms, B={(i + w) * 1e3:.2f} ms"
    else:
        try:
            nums = [float(x) for x in text.split(",")]
        except ValueError:
            nums = []
        if len(nums) not in (2, 3) or not all(0 <= x < math.inf for x in nums):
            raise ParacubeError(
                f"--costs {text!r}: give F,B or F,I,W as finite non-negative numbers, or a metrics file"
            )
        f, i, w = (nums[0], nums[1] / 2, nums[1] / 2) if len(nums) == 2 else nums
        what = f"costs F={nums[0]:g}, " + (
            f"B={nums[1]:g}" if len(nums) == 2 else f"I={nums[1]:g}, W={nums[2]:g}"
        )
    try:
        return Costs(F=f, I=i, W=w), what
    except ValueError as e:
        raise ParacubeError(f"--costs {text}: {e}") from None


def _measured_costs(path: str) -> tuple[float, float, float]:
    """(F, I, W) seconds from the last pipeline step of a ``paracube train`` metrics file."""
    if not os.path.exists(path):
        raise ParacubeError(
            f"--costs {path}: no such file; give a metrics file of a --pp run or F,B numbers"
        )
    if not os.path.isfile(path):
        raise ParacubeError(f"--costs {path}: not a file; give a metrics file of a --pp run")
    from paracube.metrics import read_metrics

    try:
        records = read_metrics(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ParacubeError(
            f"--costs {path}: not a metrics file ({type(e).__name__}); give one written by --metrics"
        ) from None
    runs = [r for r in records if isinstance(r, dict) and isinstance(r.get("pipeline"), dict)]
    if not runs:
        raise ParacubeError(
            f"--costs {path}: no pipeline step in that metrics file; give a file from a --pp run"
        )
    t = runs[-1]["pipeline"].get("action_seconds")
    if not isinstance(t, dict):
        raise ParacubeError(
            f"--costs {path}: its pipeline record has no action times; give a file from a --pp run"
        )
    times: dict = t
    f, i, w = times.get("F", 0.0), times.get("I", times.get("B", 0.0)), times.get("W", 0.0)
    if not all(isinstance(x, (int, float)) for x in (f, i, w)):
        raise ParacubeError(
            f"--costs {path}: its action times are not numbers; give a file from a --pp run"
        )
    return float(f), float(i), float(w)


def cmd_schedule(args) -> int:
    from paracube.pipeline import get_schedule, simulate

    for name in ("pp", "microbatches"):
        if getattr(args, name) <= 0:
            raise ParacubeError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.out:
        from paracube.outputs import check_output

        if not args.out.endswith((".png", ".svg")):
            raise ParacubeError(f"--out {args.out}: the picture must be a .png or .svg file")
        check_output(args.out, "--out")  # before the simulation and anything printed
    costs, what = _costs_from(args.costs)
    schedule = get_schedule(args.schedule)
    p, m, v = args.pp, args.microbatches, args.chunks
    schedule.check(p, m, v)
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
