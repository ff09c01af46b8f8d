"""The diagnosis drawn: per-rank stacked time bars and one step's per-rank timeline (PNG,
matplotlib), and that step as a Chrome / Perfetto trace (open in ui.perfetto.dev)."""

from __future__ import annotations

import json

from paracube.diagnose.breakdown import PARTS, Breakdown
from paracube.diagnose.verdict import LABELS


def chrome_trace(timeline: dict, path: str) -> None:
    """``timeline``: ``{"step": s, "spans": [[[phase, start, end], …] per rank]}`` (seconds
    from each rank's step start) → trace events, one thread per rank."""
    events = []
    for rank, spans in enumerate(timeline["spans"]):
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": rank,
                "args": {"name": f"rank {rank}"},
            }
        )
        for name, start, end in spans:
            events.append(
                {
                    "name": name,
                    "ph": "X",
                    "pid": 0,
                    "tid": rank,
                    "ts": start * 1e6,
                    "dur": (end - start) * 1e6,
                }
            )
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def draw(b: Breakdown, timeline: dict | None, path: str) -> None:
    """Bars (seconds per step of each part, per rank) and, if recorded, one step's timeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = 2 if timeline else 1
    fig, axes = plt.subplots(
        rows, 1, figsize=(11, 2 + 0.5 * len(b.per_rank) + 2 * rows), squeeze=False
    )
    ax = axes[0][0]
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    ranks = list(range(len(b.per_rank)))
    left = [0.0] * len(ranks)
    for i, part in enumerate(PARTS):
        widths = [b.per_rank[r][part] * 1e3 for r in ranks]
        ax.barh(ranks, widths, left=left, color=colors[i % 10], label=LABELS[part])
        left = [a + w for a, w in zip(left, widths)]
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean of the steady steps)")
    ax.set_title("where each rank's step went")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if timeline:
        ax = axes[1][0]
        names = sorted({s[0] for spans in timeline["spans"] for s in spans})
        shade = {n: colors[i % 10] for i, n in enumerate(names)}
        for rank, spans in enumerate(timeline["spans"]):
            for name, start, end in spans:
                ax.barh(rank, (end - start) * 1e3, left=start * 1e3, color=shade[name])
        handles = [Patch(color=shade[n], label=n) for n in names]
        ax.set_yticks(
            range(len(timeline["spans"])), [f"rank {r}" for r in range(len(timeline["spans"]))]
        )
        ax.invert_yaxis()
        ax.set_xlabel(f"ms from the start of step {timeline['step']}")
        ax.set_title("one step, per rank")
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
