"""Report figures on hand-made records, with exact expected values."""

import math

import pytest

from salon.loadgen.driver import token_gaps_ms
from salon.loadgen.records import RunResult, TurnRecord
from salon.loadgen.report import (
    MIN_LONG_HISTORY_TURNS,
    compare,
    compare_peer,
    hit_rate,
    hit_rate_over_time,
    mode_title,
    percentile,
    steady_turns_per_s,
    summarize,
    warm_keys,
)


def rec(
    d,
    t,
    prompt,
    device=0,
    host=0,
    ttft=None,
    end=1.0,
    engine="e0",
    itl=(),
    gen=3,
    ids=(1, 2),
    error=None,
    kind="message",
):
    return TurnRecord(
        d,
        t,
        kind,
        end - 0.5,
        end,
        ttft,
        tuple(itl),
        prompt,
        device,
        host,
        gen,
        engine,
        "FINISH_REASON_LENGTH",
        ttft,
        tuple(ids),
        error,
    )


def test_percentile_linear_interpolation():
    values = [40.0, 10.0, 30.0, 20.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0  # rank 1.5
    assert percentile(values, 90) == pytest.approx(37.0)  # rank 2.7: 30 + 0.7 * 10
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)  # rank 98.01
    assert percentile([5.0], 90) == 5.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_hit_rate_counts_device_and_host_over_prompt_tokens_of_successful_turns():
    records = [
        rec(0, 0, 100, device=0, host=60),
        rec(0, 1, 120, device=100, host=4),
        rec(1, 0, 1000, device=1000, error="UNAVAILABLE: x"),
    ]
    assert hit_rate(records) == (60 + 104) / 220
    assert hit_rate([]) is None


def test_token_gaps_spread_batched_deltas():
    assert token_gaps_ms([(1.0, 1), (1.1, 1), (1.4, 3), (1.5, 0), (1.6, 1)]) == pytest.approx(
        [100.0, 100.0, 100.0, 100.0, 200.0]
    )
    assert token_gaps_ms([(0.5, 2)]) == [0.0]
    assert token_gaps_ms([]) == []


def test_warm_keys_exclude_each_dialogues_first_turn():
    records = [rec(0, 0, 1), rec(0, 1, 1), rec(0, 2, 1), rec(3, 1, 1), rec(3, 2, 1)]
    assert warm_keys(records) == {(0, 1), (0, 2), (3, 2)}
    assert warm_keys(records, primed=True) == {(0, 0), (0, 1), (0, 2), (3, 1), (3, 2)}


def test_hit_rate_over_time_bins_by_end_time():
    records = [rec(0, 0, 100, host=0, end=1.0), rec(0, 1, 100, host=90, end=4.0), rec(1, 0, 200, device=200, end=10.0)]
    bins = hit_rate_over_time(records, num_bins=2)
    assert [(b["start_s"], b["end_s"], b["num_turns"]) for b in bins] == [(0.0, 5.0, 2), (5.0, 10.0, 1)]
    assert [b["hit_rate"] for b in bins] == [0.45, 1.0]


def test_summarize_exact_figures():
    records = (
        rec(0, 0, 1000, ttft=400.0, end=2.0, engine="e0", itl=(10.0, 20.0), gen=3),
        rec(0, 1, 1050, device=1000, ttft=40.0, end=4.0, engine="e0", itl=(30.0,), gen=2),
        rec(1, 0, 200, host=100, ttft=100.0, end=5.0, engine="e1", itl=(), gen=1),
        rec(1, 1, 0, error="DEADLINE_EXCEEDED: slow"),
    )
    s = summarize(RunResult("cache", records, wall_s=10.0, model_id="m"), long_history_tokens=1000)
    assert s["num_turns"] == 4 and s["num_errors"] == 1
    assert s["errors"] == [("DEADLINE_EXCEEDED: slow", 1)]
    assert s["token_hit_rate"] == 1100 / 2250
    assert s["token_hit_rate_warm_turns"] == 1000 / 1050
    assert (s["ttft_ms_p50"], s["ttft_ms_p90"]) == (100.0, pytest.approx(340.0))  # rank 1.8: 100 + 0.8 * 300
    assert s["ttft_ms_p50_warm_turns"] == 40.0
    assert (s["itl_ms_p50"], s["itl_ms_p90"]) == (20.0, pytest.approx(28.0))
    assert s["turns_per_s"] == 0.3 and s["tokens_per_s"] == 0.6
    assert s["engine_turns"] == {"e0": 2, "e1": 1}
    assert [(t["dialogue_index"], t["turn_index"], t["warm"]) for t in s["long_history_turns"]] == [
        (0, 0, False),
        (0, 1, True),
    ]


def test_compare_long_history_ratio_uses_warm_turns_in_both_runs():
    cached = RunResult(
        "cache",
        (
            rec(0, 0, 5000, ttft=9000.0),
            rec(0, 1, 5100, device=5000, ttft=100.0, ids=(4,)),
            rec(0, 2, 5200, device=5100, ttft=300.0),
            rec(1, 0, 300, ttft=50.0),
            rec(1, 1, 400, ttft=20.0),
        ),
        wall_s=10.0,
    )
    uncached = RunResult(
        "no-cache",
        (
            rec(0, 0, 5000, ttft=9000.0),
            rec(0, 1, 5100, ttft=8000.0),
            rec(0, 2, 5200, ttft=10000.0),
            rec(1, 0, 300, ttft=60.0),
            rec(1, 1, 400, ttft=80.0),
        ),
        wall_s=40.0,
    )
    c = compare(cached, uncached, long_history_tokens=4000, min_long_history_turns=2)
    assert c["num_long_history_turns"] == 2
    assert c["ttft_ms_median_long_history_cache"] == 200.0
    assert c["ttft_ms_median_long_history_no_cache"] == 9000.0
    assert c["ttft_ratio_long_history"] == 45.0
    assert c["ttft_ratio_warm_turns"] == 8000.0 / 100.0  # medians over (0,1), (0,2), (1,1)
    assert c["turns_per_s_ratio"] == 4.0
    assert c["replies_identical_fraction"] == 4 / 5


def test_compare_primed_counts_first_turns_as_warm():
    cached = RunResult(
        "cache",
        (rec(0, 0, 5000, device=4900, ttft=100.0), rec(0, 1, 5100, device=5000, ttft=50.0)),
        wall_s=1.0,
        primed=True,
    )
    uncached = RunResult("no-cache", (rec(0, 0, 5000, ttft=9000.0), rec(0, 1, 5100, ttft=9500.0)), wall_s=20.0)
    c = compare(cached, uncached, long_history_tokens=4000, min_long_history_turns=2)
    assert c["num_long_history_turns"] == 2
    assert c["ttft_ratio_long_history"] == 9250.0 / 75.0


def test_compare_without_long_turns_gives_none():
    run = RunResult("cache", (rec(0, 0, 10, ttft=1.0), rec(0, 1, 10, ttft=1.0)), wall_s=1.0)
    c = compare(run, run, long_history_tokens=4000)
    assert c["ttft_ratio_long_history"] is None and c["num_long_history_turns"] == 0
    assert c["turns_per_s_ratio"] == 1.0 and not math.isnan(c["ttft_ratio_warm_turns"])


def test_long_history_ratio_needs_at_least_ten_returning_turns():
    """Nine long returning turns give no ratio (and say how many there were); ten give one."""
    assert MIN_LONG_HISTORY_TURNS == 10

    def runs(num_turns):
        cached = RunResult(
            "cache",
            tuple(rec(d, t, 5000 + t, device=4000, ttft=100.0 + t) for d in range(num_turns) for t in range(2)),
            wall_s=1.0,
        )
        uncached = RunResult(
            "no-cache", tuple(rec(d, t, 5000 + t, ttft=4000.0) for d in range(num_turns) for t in range(2)), wall_s=9.0
        )
        return compare(cached, uncached, long_history_tokens=4000)

    nine, ten = runs(9), runs(10)
    assert (nine["num_long_history_turns"], nine["ttft_ratio_long_history"]) == (9, None)
    assert nine["ttft_ms_median_long_history_cache"] == 101.0  # the medians are still reported
    assert (ten["num_long_history_turns"], ten["ttft_ratio_long_history"]) == (10, 4000.0 / 101.0)


def test_steady_turns_per_s_drops_the_first_and_last_tenth():
    # 20 turns: two early ones, sixteen one second apart, and a long tail of two stragglers.
    ends = [0.5, 0.6] + [float(s) for s in range(3, 19)] + [60.0, 100.0]
    records = [rec(i, 0, 10, end=e) for i, e in enumerate(ends)]
    # n = 20: ranks i = 2, j = 18 -> (18 - 2) / (e_18 - e_2) = 16 / (18 - 0.6)
    assert steady_turns_per_s(records) == pytest.approx(16 / 17.4)
    assert steady_turns_per_s(records[:9]) is None  # too few turns for a steady state
    failed = [rec(99, 0, 10, end=1000.0, error="UNAVAILABLE: x")]
    assert steady_turns_per_s(records + failed) == steady_turns_per_s(records)


def test_summary_of_returning_turns_and_mode():
    records = tuple(rec(d, t, 100, ttft=float(10 * d + t + 1)) for d in range(3) for t in range(3))
    s = summarize(RunResult("llama-server", records, wall_s=3.0), long_history_tokens=50)
    returning = sorted(float(10 * d + t + 1) for d in range(3) for t in (1, 2))  # 2, 3, 12, 13, 22, 23
    assert s["num_warm_turns"] == 6
    assert s["ttft_ms_p50_warm_turns"] == percentile(returning, 50) == 12.5
    assert s["ttft_ms_p90_warm_turns"] == pytest.approx(22.5)  # rank 4.5
    assert s["mode"] == "llama-server with its prompt cache, not primed"
    assert mode_title("cache", True, "working set: kvstore 4.0 MiB") == (
        "salon with its caches, primed, working set: kvstore 4.0 MiB"
    )


def test_compare_peer_ratios_per_round_and_targets():
    """Each ratio is taken within a round (salon's and the peer's replays of that round's trace), then the
    rounds' median and range; the targets are read against the medians."""

    def summary(steady, turns, p50, p90):
        return {
            "steady_turns_per_s": steady,
            "turns_per_s": turns,
            "ttft_ms_p50_warm_turns": p50,
            "ttft_ms_p90_warm_turns": p90,
        }

    rounds = [
        (summary(9.0, 8.0, 50.0, 100.0), summary(3.0, 4.0, 100.0, 300.0)),  # 3, 2, 0.5, 1/3
        (summary(4.0, 6.0, 30.0, 20.0), summary(2.0, 2.0, 120.0, 100.0)),  # 2, 3, 0.25, 0.2
        (summary(8.0, 5.0, 40.0, 50.0), summary(2.0, 5.0, 20.0, 250.0)),  # 4, 1, 2, 0.2
    ]
    c = compare_peer(rounds)
    steady = c["steady_turns_per_s"]
    assert (steady["median"], steady["min"], steady["max"], steady["rounds"]) == (3.0, 2.0, 4.0, 3)
    assert (steady["salon_median"], steady["peer_median"]) == (8.0, 2.0)
    assert c["turns_per_s"]["ratios"] == [2.0, 3.0, 1.0] and c["turns_per_s"]["median"] == 2.0
    assert (c["ttft_ms_p50_warm_turns"]["median"], c["ttft_ms_p50_warm_turns"]["max"]) == (0.5, 2.0)
    p90 = c["ttft_ms_p90_warm_turns"]
    assert (p90["median"], p90["min"], p90["max"]) == (0.2, 0.2, 0.3333)
    assert c["meets_steady_turns_per_s_target"] is True and c["meets_ttft_ms_p90_warm_turns_target"] is True
    assert (c["target_steady_turns_per_s_ratio"], c["target_ttft_ms_p90_warm_turns_ratio"]) == (3.0, 0.25)
    one = compare_peer(rounds[:1])
    assert one["ttft_ms_p90_warm_turns"]["median"] == 0.3333 and one["meets_ttft_ms_p90_warm_turns_target"] is False
    assert one["steady_turns_per_s"]["rounds"] == 1
    # A round without a steady window gives no steady ratio; no round with one: None, and no verdict.
    none = compare_peer([({**rounds[0][0], "steady_turns_per_s": None}, rounds[0][1])])
    assert none["steady_turns_per_s"] is None and none["meets_steady_turns_per_s_target"] is None
    assert compare_peer([({**rounds[0][0], "steady_turns_per_s": None}, rounds[0][1]), rounds[1]])[
        "steady_turns_per_s"
    ]["ratios"] == [2.0]


def test_ttft_split_of_returning_turns_exact():
    """outside = client - engine TTFT, queue = the engine's queue time, steps = engine TTFT - queue; the
    slowest tenth (at least one turn) by client TTFT; turns without the engine's timings are left out."""
    import dataclasses

    from salon.loadgen.report import ttft_split

    records = [
        dataclasses.replace(
            rec(0, t, 10, ttft=float(100 + 10 * t)), server_ttft_ms=float(90 + 9 * t), server_queue_ms=float(t)
        )
        for t in range(11)
    ]
    records.append(dataclasses.replace(rec(1, 1, 10, ttft=5000.0), server_queue_ms=None))  # llama-server: no split
    records.append(rec(2, 1, 10, ttft=None, error="UNAVAILABLE: x"))
    split = ttft_split(records)
    # t = 0..10: outside = 10 + t, queue = t, steps = 90 + 8t; client TTFT order is t order.
    assert split["num_turns"] == 11 and split["num_slowest_turns"] == 1
    assert split["outside_ms_p50"] == 15.0 and split["outside_ms_p90"] == 19.0
    assert split["queue_ms_p50"] == 5.0 and split["queue_ms_p90"] == 9.0
    assert split["steps_ms_p50"] == 130.0 and split["steps_ms_p90"] == 162.0
    assert (split["outside_ms_mean_slowest"], split["queue_ms_mean_slowest"], split["steps_ms_mean_slowest"]) == (
        20.0,
        10.0,
        170.0,
    )
    assert ttft_split(records[-2:]) is None
    run = RunResult("cache", records, wall_s=1.0, model_id="m")
    summary = summarize(run)
    # warm turns only: dialogue 0's first turn (t = 0) is not one
    assert summary["ttft_split_warm_turns"]["num_turns"] == 10
    assert summary["ttft_split_warm_turns"]["queue_ms_p50"] == 5.5
