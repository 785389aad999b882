"""Figures of a run, and of a cache vs no-cache comparison, computed from TurnRecords.

Definitions (the ones printed by `salon bench`):
- token hit rate = sum(cached_tokens.device + cached_tokens.host) / sum(prompt_tokens) over the
  successful turns (the one definition of cache rate used across salon);
- percentiles interpolate linearly between the two closest ranks (numpy's default "linear"
  method): the q-th percentile of sorted x[0..n-1] sits at rank q/100 * (n-1);
- TTFT: client-side, per successful turn that produced a token; ITL: all client-side token gaps;
- turns/s = successful turns / run wall time; tokens/s = generated tokens / run wall time;
- steady turns/s: the rate in the middle of the run, without its ramp-up (cold first turns, an
  idle pipeline) and its tail (fewer dialogues left than streams): with e_1 <= ... <= e_n the end
  times of the n successful turns, i = ceil(n/10), j = floor(9n/10): (j - i) / (e_j - e_i); None
  when n < 10;
- a warm (returning) turn is one whose history the server has seen before: every turn when the run
  was primed (RunResult.primed), else any turn but the first of its dialogue in the run;
- ttft_ratio_long_history = median TTFT without cache / median TTFT with cache, both over the same
  warm turns (same dialogue and turn index, successful in both runs) whose prompt has at least
  `long_history_tokens` tokens in the cached run; None (with the count) when fewer than
  MIN_LONG_HISTORY_TURNS such turns exist: a ratio from a handful of turns is not a figure;
- TTFT split of returning turns (ttft_split_warm_turns), over the warm turns whose server reports its
  timings (salon's engines): outside = client TTFT - the engine's TTFT (gateway, transport, delivery);
  queue = the engine's queue time (arrival to the first step that scheduled the request: rendering,
  the kvstore lookup, waiting for a step); steps = the engine's TTFT - its queue time (the steps up to
  the first token). Each part's p50 and p90, and each part's mean over the slowest tenth of those turns
  by client TTFT (at least one turn): what the p90 turns wait for;
- peer comparison (compare_peer): salon / peer of steady turns/s, turns/s and the warm turns' TTFT p50 / p90,
  over rounds in which salon and the peer replay the same trace one after the other (the order alternating:
  salon first, then the peer first, ...), a ratio per round, reported as the rounds' median and range; the
  medians are read against the targets, never asserted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from salon.loadgen.alternation import figure_ratios
from salon.loadgen.records import RunResult, TurnRecord

DEFAULT_LONG_HISTORY_TOKENS = 4000
MIN_LONG_HISTORY_TURNS = 10
# Issue-16 targets for salon against llama-server on the same trace (reported, not asserted).
TARGET_STEADY_TURNS_PER_S_RATIO = 3.0  # salon's steady turns/s >= 3x the peer's
TARGET_TTFT_P90_WARM_RATIO = 0.25  # salon's TTFT p90 of returning turns <= 0.25x the peer's


RUN_KINDS = {
    "cache": "salon with its caches",
    "no-cache": "salon without cache",
    "llama-server": "llama-server with its prompt cache",
}


def mode_title(label: str, primed: bool, detail: str | None = None) -> str:
    """What produced a run's figures, as every printed headline names it: server and cache, priming, detail."""
    title = f"{RUN_KINDS.get(label, label)}, {'primed' if primed else 'not primed'}"
    return f"{title}, {detail}" if detail else title


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def hit_rate(records: Iterable[TurnRecord]) -> float | None:
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return None if prompt == 0 else sum(r.cached_tokens for r in ok) / prompt


def warm_keys(records: Iterable[TurnRecord], primed: bool = False) -> set[tuple[int, int]]:
    first: dict[int, int] = {}
    all_keys = set()
    for r in records:
        all_keys.add(r.key)
        first[r.dialogue_index] = min(first.get(r.dialogue_index, r.turn_index), r.turn_index)
    return all_keys if primed else {k for k in all_keys if k[1] != first[k[0]]}


def hit_rate_over_time(records: Sequence[TurnRecord], num_bins: int = 10) -> list[dict]:
    """Hit rate of the turns ending in each of `num_bins` equal time bins over [0, last end]."""
    ok = [r for r in records if r.ok]
    if not ok:
        return []
    span_s = max(r.end_s for r in ok) or 1.0
    bins = [
        {
            "start_s": span_s * i / num_bins,
            "end_s": span_s * (i + 1) / num_bins,
            "num_turns": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
        }
        for i in range(num_bins)
    ]
    for r in ok:
        b = bins[min(int(r.end_s / span_s * num_bins), num_bins - 1)]
        b["num_turns"] += 1
        b["prompt_tokens"] += r.prompt_tokens
        b["cached_tokens"] += r.cached_tokens
    for b in bins:
        b["hit_rate"] = b["cached_tokens"] / b["prompt_tokens"] if b["prompt_tokens"] else None
    return bins


def steady_turns_per_s(records: Iterable[TurnRecord]) -> float | None:
    ends = sorted(r.end_s for r in records if r.ok)
    n = len(ends)
    if n < 10:
        return None
    i, j = math.ceil(n / 10), (9 * n) // 10  # 1-based ranks
    span_s = ends[j - 1] - ends[i - 1]
    return None if span_s <= 0 else (j - i) / span_s


TTFT_PARTS = ("outside", "queue", "steps")


def ttft_split(records: Iterable[TurnRecord]) -> dict | None:
    """The TTFT split of successful turns that carry the engine's timings (module docstring); None if none do."""
    rows = sorted(
        (
            (r.ttft_ms, r.ttft_ms - r.server_ttft_ms, r.server_queue_ms, r.server_ttft_ms - r.server_queue_ms)
            for r in records
            if r.ok and r.ttft_ms is not None and r.server_ttft_ms is not None and r.server_queue_ms is not None
        ),
        key=lambda row: row[0],
    )
    if not rows:
        return None
    slowest = rows[len(rows) - max(1, len(rows) // 10) :]
    split: dict = {"num_turns": len(rows), "num_slowest_turns": len(slowest)}
    for i, part in enumerate(TTFT_PARTS, start=1):
        values = [row[i] for row in rows]
        split[f"{part}_ms_p50"] = percentile(values, 50)
        split[f"{part}_ms_p90"] = percentile(values, 90)
        split[f"{part}_ms_mean_slowest"] = sum(row[i] for row in slowest) / len(slowest)
    return split


def summarize(run: RunResult, long_history_tokens: int = DEFAULT_LONG_HISTORY_TOKENS) -> dict:
    ok = [r for r in run.records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    itls = [gap for r in ok for gap in r.itl_ms]
    prompt = sum(r.prompt_tokens for r in ok)
    wall_s = run.wall_s if run.wall_s > 0 else float("nan")
    warm = warm_keys(run.records, run.primed)
    warm_ttfts = [r.ttft_ms for r in ok if r.key in warm and r.ttft_ms is not None]
    return {
        "label": run.label,
        "mode": mode_title(run.label, run.primed, run.extra.get("mode_detail")),
        "model_id": run.model_id,
        "primed": run.primed,
        "prime_wall_s": run.extra.get("prime_wall_s"),
        "prime_errors": run.extra.get("prime_errors", []),
        "num_turns": len(run.records),
        "num_errors": len(run.records) - len(ok),
        "errors": sorted(Counter(r.error for r in run.records if not r.ok).items())[:10],
        "turn_kinds": dict(sorted(Counter(r.kind for r in run.records).items())),
        "wall_s": run.wall_s,
        "prompt_tokens": prompt,
        "cached_device_tokens": sum(r.cached_device_tokens for r in ok),
        "cached_host_tokens": sum(r.cached_host_tokens for r in ok),
        "generated_tokens": sum(r.generated_tokens for r in ok),
        "token_hit_rate": hit_rate(ok),
        "token_hit_rate_warm_turns": hit_rate(r for r in ok if r.key in warm),
        "ttft_ms_p50": percentile(ttfts, 50),
        "ttft_ms_p90": percentile(ttfts, 90),
        "ttft_ms_p99": percentile(ttfts, 99),
        "num_warm_turns": len([r for r in ok if r.key in warm]),
        "ttft_ms_p50_warm_turns": percentile(warm_ttfts, 50),
        "ttft_ms_p90_warm_turns": percentile(warm_ttfts, 90),
        "ttft_split_warm_turns": ttft_split(r for r in ok if r.key in warm),
        "itl_ms_p50": percentile(itls, 50),
        "itl_ms_p90": percentile(itls, 90),
        "turns_per_s": len(ok) / wall_s,
        "steady_turns_per_s": steady_turns_per_s(ok),
        "tokens_per_s": sum(r.generated_tokens for r in ok) / wall_s,
        "prompt_tokens_per_s": prompt / wall_s,
        "engine_turns": dict(sorted(Counter(r.engine_id for r in ok).items())),
        "dropped_history_messages": run.dropped_history_messages,
        "hit_rate_over_time": hit_rate_over_time(run.records),
        "long_history_turns": [
            {
                "dialogue_index": r.dialogue_index,
                "turn_index": r.turn_index,
                "kind": r.kind,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "ttft_ms": r.ttft_ms,
                "warm": r.key in warm,
            }
            for r in ok
            if r.prompt_tokens >= long_history_tokens
        ],
    }


def compare(
    cached: RunResult,
    uncached: RunResult,
    long_history_tokens: int = DEFAULT_LONG_HISTORY_TOKENS,
    min_long_history_turns: int = MIN_LONG_HISTORY_TURNS,
) -> dict:
    with_cache = {r.key: r for r in cached.records if r.ok and r.ttft_ms is not None}
    without = {r.key: r for r in uncached.records if r.ok and r.ttft_ms is not None}
    both = sorted(set(with_cache) & set(without) & warm_keys(cached.records, cached.primed))
    long_keys = [k for k in both if with_cache[k].prompt_tokens >= long_history_tokens]

    def ratio(keys: list[tuple[int, int]]) -> tuple[float | None, float | None, float | None]:
        slow = median([without[k].ttft_ms for k in keys])
        fast = median([with_cache[k].ttft_ms for k in keys])
        return (None if slow is None or not fast else slow / fast), slow, fast

    long_ratio, long_slow, long_fast = ratio(long_keys)
    if len(long_keys) < min_long_history_turns:
        long_ratio = None
    warm_ratio, _, _ = ratio(both)
    cached_ok = [r for r in cached.records if r.ok]
    uncached_ok = [r for r in uncached.records if r.ok]
    turns_ratio = None
    if uncached_ok and uncached.wall_s > 0 and cached.wall_s > 0:
        turns_ratio = (len(cached_ok) / cached.wall_s) / (len(uncached_ok) / uncached.wall_s)
    same = [k for k in set(r.key for r in cached_ok) & set(r.key for r in uncached_ok)]
    cached_by_key = {r.key: r for r in cached_ok}
    uncached_by_key = {r.key: r for r in uncached_ok}
    identical = sum(cached_by_key[k].reply_token_ids == uncached_by_key[k].reply_token_ids for k in same)
    return {
        "long_history_tokens": long_history_tokens,
        "num_long_history_turns": len(long_keys),
        "min_long_history_turns": min_long_history_turns,
        "ttft_ms_median_long_history_cache": long_fast,
        "ttft_ms_median_long_history_no_cache": long_slow,
        "ttft_ratio_long_history": long_ratio,
        "ttft_ratio_warm_turns": warm_ratio,
        "turns_per_s_ratio": turns_ratio,
        "replies_identical_fraction": identical / len(same) if same else None,
    }


PEER_RATIO_FIGURES = ("steady_turns_per_s", "turns_per_s", "ttft_ms_p50_warm_turns", "ttft_ms_p90_warm_turns")


def compare_peer(rounds: Sequence[tuple[dict, dict]]) -> dict:
    """salon / peer of each figure over alternated rounds, each round a (salon, peer) pair of summaries of the
    same trace: {figure: {median, min, max, rounds, ratios, salon_median, peer_median} or None} (a ratio per
    round, salon.loadgen.alternation.paired_ratio), with the targets read against the medians."""
    ratios = figure_ratios(rounds, PEER_RATIO_FIGURES, ("salon", "peer"), digits=4)
    steady, p90 = ratios["steady_turns_per_s"], ratios["ttft_ms_p90_warm_turns"]
    return {
        **ratios,
        "target_steady_turns_per_s_ratio": TARGET_STEADY_TURNS_PER_S_RATIO,
        "target_ttft_ms_p90_warm_turns_ratio": TARGET_TTFT_P90_WARM_RATIO,
        "meets_steady_turns_per_s_target": None
        if steady is None
        else steady["median"] >= TARGET_STEADY_TURNS_PER_S_RATIO,
        "meets_ttft_ms_p90_warm_turns_target": None if p90 is None else p90["median"] <= TARGET_TTFT_P90_WARM_RATIO,
    }


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def describe(summary: dict) -> str:
    """The printed form of a summary; its first line names the mode that produced the figures."""
    return "\n".join(
        [
            f"[{summary['mode']}] {summary['num_turns']} turns ({summary['num_errors']} errors) in "
            f"{summary['wall_s']:.1f} s, model {summary['model_id']}, kinds {summary['turn_kinds']}"
            + (
                f"; histories primed in {summary['prime_wall_s']:.1f} s ({len(summary['prime_errors'])} errors)"
                if summary["primed"]
                else ""
            )
            + (
                f"; {summary['dropped_history_messages']} history messages dropped to fit the context"
                if summary["dropped_history_messages"]
                else ""
            ),
            f"  token hit rate {fmt(summary['token_hit_rate'], 4)} (device {summary['cached_device_tokens']}, "
            f"host {summary['cached_host_tokens']} of {summary['prompt_tokens']} prompt tokens); "
            f"returning turns {fmt(summary['token_hit_rate_warm_turns'], 4)}",
            f"  TTFT ms p50 {fmt(summary['ttft_ms_p50'])} p90 {fmt(summary['ttft_ms_p90'])} "
            f"p99 {fmt(summary['ttft_ms_p99'])}; returning turns ({summary['num_warm_turns']}) p50 "
            f"{fmt(summary['ttft_ms_p50_warm_turns'])} p90 {fmt(summary['ttft_ms_p90_warm_turns'])}; "
            f"ITL ms p50 {fmt(summary['itl_ms_p50'])} p90 {fmt(summary['itl_ms_p90'])}",
            *([_split_line(summary["ttft_split_warm_turns"])] if summary.get("ttft_split_warm_turns") else []),
            f"  {summary['turns_per_s']:.3f} turns/s (steady {fmt(summary['steady_turns_per_s'], 3)}), "
            f"{summary['tokens_per_s']:.2f} generated tokens/s, "
            f"{summary['prompt_tokens_per_s']:.0f} prompt tokens/s; per engine {summary['engine_turns']}",
            *[f"  error: {err} x{n}" for err, n in summary["errors"]],
        ]
    )


def _split_line(split: dict) -> str:
    parts = ", ".join(
        f"{part} {fmt(split[f'{part}_ms_p50'])} / {fmt(split[f'{part}_ms_p90'])} / "
        f"{fmt(split[f'{part}_ms_mean_slowest'])}"
        for part in TTFT_PARTS
    )
    return (
        f"  returning turns' TTFT split, ms p50 / p90 / mean of the slowest {split['num_slowest_turns']} of "
        f"{split['num_turns']}: {parts}"
    )
