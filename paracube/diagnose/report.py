"""``paracube diagnose``'s figures and text: speed-up, the breakdown, the verdict."""

from __future__ import annotations

from paracube.diagnose.breakdown import PARTS, Breakdown, breakdown, peer_groups
from paracube.diagnose.records import DiagnoseError, Run
from paracube.diagnose.verdict import LABELS, causes, fix


def figures(
    run: Run,
    baseline: Run | None,
    small_batch_fraction: float | None,
    predicted: dict | None = None,
) -> dict:
    """Every figure of the diagnosis (``--json``); ``predicted``: the planner's figures for
    the run's layout (:func:`~paracube.diagnose.prediction.planner_prediction`)."""
    header, world = run.header, run.world
    b = breakdown(run, peer_groups(header, world), small_batch_fraction)
    steady = run.steady()
    tokens_per_s = sum(r["tokens_per_s"] for r in steady) / len(steady)
    compute = b.parts["compute"] + b.parts["small_batch"]
    comm = b.parts["comm_dp"] + b.parts["comm_tp"] + b.parts["comm_pp"]
    speed = {
        "ranks": world,
        "tokens_per_s": tokens_per_s,
        # Without a baseline: the ranks' summed compute over the step — what one rank would
        # have taken for the same work, divided by what the job took.
        "speedup_own_compute": world * (compute + b.parts["optimizer"]) / b.step_time,
        # The guide's formula, read as N / (1 + exposed communication / compute).
        "speedup_guide_formula": world / (1 + comm / compute) if compute else None,
    }
    if baseline is not None:
        base_steady = baseline.steady()
        base = sum(r["tokens_per_s"] for r in base_steady) / len(base_steady)
        speed["baseline_tokens_per_s"] = base
        speed["speedup_measured"] = tokens_per_s / base
    key = "speedup_measured" if baseline is not None else "speedup_own_compute"
    speed["efficiency"] = speed[key] / world
    speed["planner"] = predicted
    where = _where(header, world)
    ranked = causes(b)
    measured = sum(r["step_time"] for r in steady) / len(steady)  # rank 0's whole step
    return {
        "run": run.path,
        "steps": b.steps,
        "step_time": measured,
        "breakdown": b.parts,
        "breakdown_sum": sum(b.parts.values()),
        "per_rank": b.per_rank,
        "speed": speed,
        "slowest_rank": {"rank": b.slowest, "where": where[b.slowest], "ratio": b.slowest_ratio},
        "small_batch_fraction": small_batch_fraction,
        "causes": [
            {"cause": p, "seconds": s, "share": s / b.step_time, "fix": fix(p, b, header, where)}
            for p, s in ranked
        ],
        "stragglers": run.steps[-1].get("stragglers", []),
        "notes": b.notes,
        "_breakdown": b,
    }


def check_baseline(run: Run, baseline: Run) -> None:
    mine, theirs = run.header.get("model"), baseline.header.get("model")
    if mine and theirs and mine != theirs:
        raise DiagnoseError(
            f"--baseline {baseline.path} trained another model ({theirs.get('name')}, "
            f"{theirs.get('n_layers')} layers) than {run.path} ({mine.get('name')}, "
            f"{mine.get('n_layers')} layers): give a one-rank run of the same model"
        )
    if baseline.world != 1:
        raise DiagnoseError(
            f"--baseline {baseline.path} ran on {baseline.world} ranks: give a one-rank run "
            "(--dp 1 --tp 1 --pp 1) of the same model"
        )


def text(f: dict) -> str:
    b: Breakdown = f["_breakdown"]
    ms = 1e3
    speed = f["speed"]
    lines = [
        f"paracube diagnose: {f['run']}: {speed['ranks']} ranks, {f['steps']} steady steps, "
        f"step {f['step_time'] * ms:.1f} ms, {speed['tokens_per_s']:,.0f} tokens/s"
    ]
    if "speedup_measured" in speed:
        lines.append(
            f"  speed-up {speed['speedup_measured']:.2f}x over the one-rank baseline "
            f"({speed['baseline_tokens_per_s']:,.0f} tokens/s), efficiency {speed['efficiency']:.0%}"
        )
    else:
        lines.append(
            f"  speed-up from its own compute {speed['speedup_own_compute']:.2f}x of "
            f"{speed['ranks']}, efficiency {speed['efficiency']:.0%} (give --baseline RUN1 to measure it)"
        )
    if speed["speedup_guide_formula"] is not None:
        lines.append(
            f"  the guide's formula N/(1 + comm/compute): {speed['speedup_guide_formula']:.2f}x"
        )
    predicted = speed["planner"]
    if predicted is not None:
        lines.append(
            f"  the planner for this layout here: step {predicted['step_time'] * ms:.1f} ms "
            f"(measured {f['step_time'] * ms:.1f} ms), speed-up {predicted['speedup']:.2f}x"
        )
        better = predicted["better"]
        if better is not None:
            lines.append(
                f"  the planner's faster layout for these ranks: {better['layout']}, predicted "
                f"{better['step_time'] * ms:.1f} ms: {better['command']}"
            )
    else:
        lines.append(
            "  (run `paracube calibrate` once to see the planner's prediction beside these)"
        )
    lines.append("where the step went (mean over ranks; adds up to the step):")
    for part in PARTS:
        seconds = b.parts[part]
        lines.append(f"  {LABELS[part]:<52} {seconds * ms:8.2f} ms  {seconds / b.step_time:6.1%}")
    lines.append(
        f"  {'total':<52} {f['breakdown_sum'] * ms:8.2f} ms  (measured step {f['step_time'] * ms:.2f} ms)"
    )
    if f["causes"]:
        lines.append("verdict, most time lost first:")
        for i, c in enumerate(f["causes"], 1):
            lines.append(
                f"  {i}. {LABELS[c['cause']]}: {c['seconds'] * ms:.2f} ms per step ({c['share']:.0%})"
            )
            lines.append(f"     fix: {c['fix']}")
    else:
        lines.append(
            "verdict: no cause costs over 1 % of the step: this run scales as well as it can"
        )
    for s in f["stragglers"]:
        lines.append(f"  straggler recorded during the run: {s['line']}")
    for note in f["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _where(header: dict, world: int) -> list[str]:
    coords, hosts = header.get("coords") or [], header.get("hosts") or []
    out = []
    for r in range(world):
        c = " ".join(f"{k}={v}" for k, v in coords[r].items()) if r < len(coords) else ""
        h = f", host {hosts[r]}" if r < len(hosts) else ""
        out.append(f"{c}{h}")
    return out
