"""The bench's PNGs: TTFT per turn and the hit rate over time for each run; hit rate against kvstore capacity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from salon.loadgen.records import RunResult
from salon.loadgen.report import hit_rate_over_time

_STYLE = {"cache": ("o", "tab:blue"), "no-cache": ("x", "tab:red"), "llama-server": ("^", "tab:green")}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(path: Path, runs: Sequence[RunResult], titles: dict[str, str] | None = None) -> None:
    """One point per turn per run (TTFT), and each run's hit rate over time; `titles` names each label's mode."""
    plt = _pyplot()
    titles = titles or {}
    fig, (ax_ttft, ax_hit) = plt.subplots(2, 1, figsize=(10, 8))
    # Turns in trace order (dialogue, turn) so the runs line up point by point.
    keys = sorted({r.key for run in runs for r in run.records})
    position = {k: i for i, k in enumerate(keys)}
    for run in runs:
        marker, colour = _STYLE.get(run.label, ("s", "tab:gray"))
        points = [(position[r.key], r.ttft_ms) for r in run.records if r.ok and r.ttft_ms is not None]
        if points:
            xs, ys = zip(*points)
            ax_ttft.scatter(xs, ys, marker=marker, color=colour, s=18, label=titles.get(run.label, run.label))
    boundaries = [i for i, k in enumerate(keys) if i > 0 and k[0] != keys[i - 1][0]]
    for x in boundaries:
        ax_ttft.axvline(x - 0.5, color="0.85", linewidth=0.8)
    ax_ttft.set_yscale("log")
    ax_ttft.set_xlabel("turn (trace order: dialogue by dialogue; grey lines separate dialogues)")
    ax_ttft.set_ylabel("TTFT (ms, client side)")
    ax_ttft.set_title("Time to first token per turn")
    ax_ttft.legend(loc="best", fontsize=8)

    for run in runs:
        _, colour = _STYLE.get(run.label, ("s", "tab:gray"))
        bins = [b for b in hit_rate_over_time(run.records, num_bins=20) if b["hit_rate"] is not None]
        if bins:
            ax_hit.plot(
                [(b["start_s"] + b["end_s"]) / 2 for b in bins],
                [b["hit_rate"] for b in bins],
                marker="o",
                color=colour,
                label=titles.get(run.label, run.label),
            )
    ax_hit.set_ylim(-0.02, 1.02)
    ax_hit.set_xlabel("time since the start of the run (s)")
    ax_hit.set_ylabel("token cache hit rate")
    ax_hit.set_title("Cached prompt tokens / prompt tokens, turns grouped by end time")
    ax_hit.legend(loc="best", fontsize=8)
    _save(fig, plt, path)


def write_working_set_plot(path: Path, points: Sequence[dict], working_set_bytes: int | None, title: str) -> None:
    """Token hit rate (all turns, returning turns, and the kvstore's share) against kvstore capacity.

    The run with room for everything is drawn at W, the bytes it held: more capacity than that changes nothing."""
    plt = _pyplot()

    def capacity(p: dict) -> int:
        return min(p["kvstore_capacity_bytes"], working_set_bytes or p["kvstore_capacity_bytes"])

    rows = sorted(points, key=capacity)
    mib = [capacity(p) / (1 << 20) for p in rows]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key, label, style in (
        ("token_hit_rate", "all turns", "o-"),
        ("token_hit_rate_warm_turns", "returning turns", "s-"),
        ("host_hit_rate", "all turns, from the kvstore (host)", "^--"),
        ("device_hit_rate", "all turns, from the engines (device)", "v:"),
    ):
        ys = [p[key] for p in rows]
        if any(y is not None for y in ys):
            ax.plot(mib, [float("nan") if y is None else y for y in ys], style, label=label)
    if working_set_bytes:
        ax.axvline(working_set_bytes / (1 << 20), color="0.6", linestyle="--", linewidth=1)
        ax.annotate(
            "working set W (room for all)",
            (working_set_bytes / (1 << 20), 0.02),
            rotation=90,
            color="0.4",
            fontsize=8,
            ha="right",
            va="bottom",
        )
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("kvstore capacity (MiB, log scale)")
    ax.set_ylabel("token cache hit rate")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="best", fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, plt, path)


def _save(fig, plt, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
