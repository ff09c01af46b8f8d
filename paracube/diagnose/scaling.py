"""The guide's experiment on the user's own job: the same training at dp = 1, 2, 4 …,
each point diagnosed, and the speed-up curve with where each point's step went.

Weak scaling by default (each rank keeps its micro-batch, the global batch grows with
dp — what "eight GPUs but only 3-4× faster" asks about); with ``--global-batch`` the
global batch stays and each rank's share shrinks (strong scaling).
"""

from __future__ import annotations

from paracube.diagnose.breakdown import PARTS
from paracube.diagnose.verdict import LABELS


def curve(points: list[tuple[int, dict]]) -> list[dict]:
    """``[(dp, diagnose figures)]`` → one row per point: tokens/s, the speed-up over the
    smallest point, the efficiency (speed-up ÷ the growth in ranks), the breakdown's
    shares and the first cause."""
    first_dp, first = points[0]
    base = first["speed"]["tokens_per_s"]
    base_compute = _compute_per_token(first)
    rows = []
    for dp, f in points:
        speedup = f["speed"]["tokens_per_s"] / base
        predicted = f["speed"].get("planner")
        rows.append(
            {
                "dp": dp,
                "tokens_per_s": f["speed"]["tokens_per_s"],
                "step_time": f["step_time"],
                "speedup": speedup,
                "efficiency": speedup / (dp / first_dp),
                # > 1: each rank computes a token slower than at the first point — the
                # ranks compete for the machine (cores, memory bandwidth), which no
                # per-step breakdown of one run can see
                "compute_slowdown": _compute_per_token(f) / base_compute,
                "shares": {p: s / f["step_time"] for p, s in f["breakdown"].items()},
                "first_cause": f["causes"][0] if f["causes"] else None,
                "planner_speedup": predicted["speedup"] if predicted else None,
            }
        )
    return rows


def _compute_per_token(f: dict) -> float:
    """A rank's compute seconds per token it processed (the model's work, per rank)."""
    b = f["breakdown"]
    tokens_per_rank = f["speed"]["tokens_per_s"] * f["step_time"] / f["speed"]["ranks"]
    return (b["compute"] + b["small_batch"]) / tokens_per_rank


SLOWDOWN = 1.15  # compute per token this much slower than at the first point is named


def text(rows: list[dict], what: str) -> str:
    head = rows[0]["dp"]
    lines = [
        f"paracube scale: {what}",
        f"  {'dp':>3} {'tokens/s':>10} {'speed-up':>9} {'efficiency':>10} {'compute':>8} "
        f"{'data':>6} {'dp comm':>8} {'straggler':>9} {'other':>6} {'compute/token':>13}"
        "  first cause",
    ]
    for r in rows:
        s = r["shares"]
        rest = 1 - s["compute"] - s["small_batch"] - s["data"] - s["comm_dp"] - s["straggler"]
        cause = r["first_cause"]
        lines.append(
            f"  {r['dp']:>3} {r['tokens_per_s']:>10,.0f} {r['speedup']:>8.2f}x "
            f"{r['efficiency']:>10.0%} {s['compute'] + s['small_batch']:>8.0%} {s['data']:>6.0%} "
            f"{s['comm_dp']:>8.0%} {s['straggler']:>9.0%} {rest:>6.0%} "
            f"{r['compute_slowdown']:>12.2f}x  "
            + (f"{LABELS[cause['cause']]} ({cause['share']:.0%})" if cause else "none over 1 %")
        )
    last = rows[-1]
    lines.append(
        f"  dp {head} → {last['dp']}: {last['speedup']:.2f}x for {last['dp'] / head:g}x the ranks "
        f"({last['efficiency']:.0%} efficiency)"
    )
    slow = max(rows, key=lambda r: r["compute_slowdown"])
    if slow["compute_slowdown"] > SLOWDOWN:
        lines.append(
            f"  at dp={slow['dp']} each rank computed a token {slow['compute_slowdown']:.2f}x "
            f"slower than at dp={head}: the ranks compete for this machine (cores, memory "
            "bandwidth) — scale out to more machines, not more ranks on one"
        )
    if last["first_cause"]:
        lines.append(f"  at dp={last['dp']}, fix first: {last['first_cause']['fix']}")
    return "\n".join(lines)


def draw(rows: list[dict], path: str) -> None:
    """Left: measured speed-up against dp, the ideal line and the planner's (if known).
    Right: each point's step split into the breakdown's parts (shares of the step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    dps = [r["dp"] for r in rows]
    head = dps[0]
    left.plot(dps, [d / head for d in dps], "--", color="grey", label="ideal")
    left.plot(dps, [r["speedup"] for r in rows], "o-", label="measured")
    if all(r["planner_speedup"] is not None for r in rows):
        first = rows[0]["planner_speedup"]
        left.plot(dps, [r["planner_speedup"] / first for r in rows], "s:", label="planner")
    left.set_xlabel("data-parallel ranks")
    left.set_ylabel(f"speed-up over dp={head}")
    left.set_xticks(dps)
    left.legend()
    left.set_title("speed-up")
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    bottom = [0.0] * len(rows)
    xs = [str(d) for d in dps]
    for i, part in enumerate(PARTS):
        heights = [max(0.0, r["shares"][part]) for r in rows]
        right.bar(xs, heights, bottom=bottom, color=colors[i % 10], label=LABELS[part])
        bottom = [b + h for b, h in zip(bottom, heights)]
    right.set_xlabel("data-parallel ranks")
    right.set_ylabel("share of the step")
    right.set_title("where each point's step went")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
