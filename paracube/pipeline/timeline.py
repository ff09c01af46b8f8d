"""Drawing a simulated pipeline step: ranks × time, one box per action (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from paracube.pipeline.simulator import Timeline

COLOURS = {"F": "#4C78A8", "B": "#F58518", "I": "#F58518", "W": "#54A24B"}
LABELS = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "weight grad"}


def draw(timeline: Timeline, title: str, out: str) -> None:
    """Save the timeline as PNG or SVG (by the file's suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    p = timeline.p
    fig, ax = plt.subplots(figsize=(max(8.0, timeline.makespan * 0.35), 0.6 * p + 1.6))
    for rank, events in enumerate(timeline.events):
        y = p - 1 - rank
        for a, start, end in events:
            shade = 1.0 if a.chunk % 2 == 0 else 0.6  # interleaved chunks alternate shade
            ax.barh(
                y,
                end - start,
                left=start,
                height=0.8,
                color=COLOURS[a.kind],
                alpha=shade,
                edgecolor="white",
            )
            if end - start >= 0.3:
                label = f"{a.mb}" if timeline.v == 1 else f"{a.mb}.{a.chunk}"
                ax.text(
                    (start + end) / 2, y, label, ha="center", va="center", fontsize=7, color="white"
                )
    ax.set_yticks(range(p), [f"rank {p - 1 - y}" for y in range(p)])
    ax.set_xlabel("time (action cost units)" if timeline.makespan < 1e3 else "time")
    ax.set_xlim(0, timeline.makespan)
    ax.set_title(title, fontsize=10)
    kinds = sorted({a.kind for ev in timeline.events for a, _, _ in ev}, key="FBIW".index)
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in kinds],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 if p < 4 else -0.12),
        ncol=len(kinds),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
