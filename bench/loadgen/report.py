"""Figures of a run, and of a cache vs no-cache comparison, computed from TurnRecords.

Definitions (the ones printed by `salon bench`):
- token hit rate = sum(cached_tokens.device + cached_tokens.host) / sum(prompt_tokens) over the
  successful turns (the one definition of cache rate used across salon);
- percentiles interpolate linearly between the two closest ranks (numpy's default "linear"
  method): the q-th percentile of sorted x[0..n-1] sits at rank q/100 * (n-1);
- TTFT: client-side, per successful turn that produced a token; ITL: all client-side token gaps;
- turns/s = successful turns / run wall time; tokens/s = generated tokens / run wall time;
- a warm turn is one whose history the stack has seen before: every turn when the run was primed
  (RunResult.primed), else any turn but the first of its dialogue in the run;
- ttft_ratio_long_history = median TTFT without cache / median TTFT with cache, both over the same
  warm turns (same dialogue and turn index, successful in both runs) whose prompt has at least
  `long_history_tokens` tokens in the cached run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from bench.loadgen.records import RunResult, TurnRecord

DEFAULT_LONG_HISTORY_TOKENS = 4000


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
    bins = [{"start_s": span_s * i / num_bins, "end_s": span_s * (i + 1) / num_bins, "num_turns": 0,
             "prompt_tokens": 0, "cached_tokens": 0} for i in range(num_bins)]
    for r in ok:
        b = bins[min(int(r.end_s / span_s * num_bins), num_bins - 1)]
        b["num_turns"] += 1
        b["prompt_tokens"] += r.prompt_tokens
        b["cached_tokens"] += r.cached_tokens
    for b in bins:
        b["hit_rate"] = b["cached_tokens"] / b["prompt_tokens"] if b["prompt_tokens"] else None
    return bins


def summarize(run: RunResult, long_history_tokens: int = DEFAULT_LONG_HISTORY_TOKENS) -> dict:
    ok = [r for r in run.records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    itls = [gap for r in ok for gap in r.itl_ms]
    prompt = sum(r.prompt_tokens for r in ok)
    wall_s = run.wall_s if run.wall_s > 0 else float("nan")
    warm = warm_keys(run.records, run.primed)
    return {
        "label": run.label,
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
        "ttft_ms_p50_warm_turns": median([r.ttft_ms for r in ok if r.key in warm and r.ttft_ms is not None]),
        "itl_ms_p50": percentile(itls, 50),
        "itl_ms_p90": percentile(itls, 90),
        "turns_per_s": len(ok) / wall_s,
        "tokens_per_s": sum(r.generated_tokens for r in ok) / wall_s,
        "prompt_tokens_per_s": prompt / wall_s,
        "engine_turns": dict(sorted(Counter(r.engine_id for r in ok).items())),
        "dropped_history_messages": run.dropped_history_messages,
        "hit_rate_over_time": hit_rate_over_time(run.records),
        "long_history_turns": [
            {"dialogue_index": r.dialogue_index, "turn_index": r.turn_index, "kind": r.kind,
             "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "ttft_ms": r.ttft_ms,
             "warm": r.key in warm}
            for r in ok if r.prompt_tokens >= long_history_tokens
        ],
    }


def compare(cached: RunResult, uncached: RunResult, long_history_tokens: int = DEFAULT_LONG_HISTORY_TOKENS) -> dict:
    with_cache = {r.key: r for r in cached.records if r.ok and r.ttft_ms is not None}
    without = {r.key: r for r in uncached.records if r.ok and r.ttft_ms is not None}
    both = sorted(set(with_cache) & set(without) & warm_keys(cached.records, cached.primed))
    long_keys = [k for k in both if with_cache[k].prompt_tokens >= long_history_tokens]

    def ratio(keys: list[tuple[int, int]]) -> tuple[float | None, float | None, float | None]:
        slow = median([without[k].ttft_ms for k in keys])
        fast = median([with_cache[k].ttft_ms for k in keys])
        return (None if slow is None or not fast else slow / fast), slow, fast

    long_ratio, long_slow, long_fast = ratio(long_keys)
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
        "ttft_ms_median_long_history_cache": long_fast,
        "ttft_ms_median_long_history_no_cache": long_slow,
        "ttft_ratio_long_history": long_ratio,
        "ttft_ratio_warm_turns": warm_ratio,
        "turns_per_s_ratio": turns_ratio,
        "replies_identical_fraction": identical / len(same) if same else None,
    }
