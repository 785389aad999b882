"""The bench's PNG: TTFT per turn with and without the cache, and the hit rate over time."""

from __future__ import annotations

from pathlib import Path

from bench.loadgen.records import RunResult
from bench.loadgen.report import hit_rate_over_time


def write_plot(path: Path, cached: RunResult | None, uncached: RunResult | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_hit) = plt.subplots(2, 1, figsize=(10, 8))
    # Turns in trace order (dialogue, turn) so the two runs line up point by point.
    keys = sorted({r.key for run in (cached, uncached) if run is not None for r in run.records})
    position = {k: i for i, k in enumerate(keys)}
    for run, marker, colour in ((cached, "o", "tab:blue"), (uncached, "x", "tab:red")):
        if run is None:
            continue
        points = [(position[r.key], r.ttft_ms) for r in run.records if r.ok and r.ttft_ms is not None]
        if points:
            xs, ys = zip(*points)
            ax_ttft.scatter(xs, ys, marker=marker, color=colour, s=18, label=f"{run.label} (TTFT per turn)")
    boundaries = [i for i, k in enumerate(keys) if i > 0 and k[0] != keys[i - 1][0]]
    for x in boundaries:
        ax_ttft.axvline(x - 0.5, color="0.85", linewidth=0.8)
    ax_ttft.set_yscale("log")
    ax_ttft.set_xlabel("turn (trace order: dialogue by dialogue; grey lines separate dialogues)")
    ax_ttft.set_ylabel("TTFT (ms, client side)")
    ax_ttft.set_title("Time to first token per turn")
    ax_ttft.legend(loc="best")

    for run, colour in ((cached, "tab:blue"), (uncached, "tab:red")):
        if run is None:
            continue
        bins = [b for b in hit_rate_over_time(run.records, num_bins=20) if b["hit_rate"] is not None]
        if bins:
            ax_hit.plot([(b["start_s"] + b["end_s"]) / 2 for b in bins], [b["hit_rate"] for b in bins],
                        marker="o", color=colour, label=run.label)
    ax_hit.set_ylim(-0.02, 1.02)
    ax_hit.set_xlabel("time since the start of the run (s)")
    ax_hit.set_ylabel("token cache hit rate")
    ax_hit.set_title("Cached prompt tokens / prompt tokens, turns grouped by end time")
    ax_hit.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
