"""`salon bench --launch --working-set` end to end (synthetic-tiny): the KV really outgrows the caches.

The first run gives the kvstore room for everything and measures the working set W it held (nothing
evicted); the run at a quarter of W must evict, and hit less, than the run with room for all.

One turn at a time, so the replay is the same every run: the turns go round the six dialogues in order
(the driver's semaphore is FIFO), a dialogue comes back after the five others, and the engine (sized for
ceil(1.25 x 1) = 2 streams) has evicted it by then. With room for all, every returning turn's prefix comes
from the kvstore; at a quarter of W, LRU under that cyclic order has evicted each dialogue before it
returns: no hit at all. (With two turns in flight the device cache's share depends on which turns overlap.)
"""

import json
import subprocess
import sys

from salon.loadgen.working_set import plan, point, table


def test_plan_sizes_the_engines_below_the_dialogues():
    # Gemma 3 270M: 1 global + 5 sliding groups of 3 layers; a page is 3 x 16 x 2 x (256 + 4) bytes.
    p = plan([1000, 2000, 3000], "gemma-3-270m", num_engines=2, concurrency=4)
    assert p.page_bytes == 3 * 16 * 2 * 260 == 24960
    # 3000 tokens: 188 global blocks + 5 sliding groups x min(188, ceil((511 + 256) / 16) + 1 = 49).
    assert p.engine_kv_cache_bytes == 5 * (188 + 5 * 49) * 24960  # ceil(1.25 x 4) = 5 streams
    assert p.device_working_set_bytes == ((63 + 5 * 49) + (125 + 5 * 49) + (188 + 5 * 49)) * 24960
    assert p.kvstore_bytes_per_block == 18 * 16 * 2 * 260  # every layer's K/V for 16 tokens: global + local
    assert not p.exceeds_engines  # three dialogues fit two engines sized for five streams
    assert plan([3000] * 11, "gemma-3-270m", 2, 4).exceeds_engines


def test_table_rows():
    summary = {
        "prompt_tokens": 200,
        "cached_device_tokens": 50,
        "cached_host_tokens": 100,
        "token_hit_rate": 0.75,
        "token_hit_rate_warm_turns": 0.9,
        "turns_per_s": 2.0,
        "ttft_ms_p50_warm_turns": 10.0,
        "ttft_ms_p90_warm_turns": 20.0,
        "num_errors": 0,
    }
    row = point(summary, {"used_bytes": 1 << 20, "evicted_blocks": 7, "evicted_local_blocks": 1}, 1 << 21, 1 << 22)
    assert (row["fraction_of_working_set"], row["device_hit_rate"], row["host_hit_rate"]) == (0.5, 0.25, 0.5)
    assert table([row]).splitlines()[1].split() == [
        "2.0",
        "0.500",
        "75.0%",
        "90.0%",
        "25.0%",
        "50.0%",
        "7",
        "2.000",
        "20.0",
    ]


def test_working_set_run_evicts_and_hits_less(tmp_path):
    report, plot = tmp_path / "ws.json", tmp_path / "ws.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "salon.cli.main",
            "bench",
            "--launch",
            "--working-set",
            "--model",
            "synthetic-tiny",
            "--engines",
            "1",
            "--dialogues",
            "6",
            "--initial-dialogues",
            "6",
            "--turns",
            "3",
            "--history-messages",
            "20",
            "--min-history-messages",
            "20",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
            "--time-scale",
            "0",
            "--concurrency",
            "1",
            "--kvstore-fractions",
            "0.25",
            "--startup-timeout-s",
            "240",
            "--no-progress",
            "--log-dir",
            str(tmp_path / "logs"),
            "--json",
            str(report),
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1][len("RESULT ") :])
    assert result["working_set"] is True and result["primed"] is False and result["preset"] == "working-set"
    assert "working set" in result["mode_title"] and "not primed" in result["mode_title"]
    assert result["working_set_plan"]["exceeds_engines"] is True
    all_room, quarter = result["working_set_points"]
    w = result["working_set_bytes"]
    # Room for all: nothing evicted, and W is what it held.
    assert all_room["kvstore_evicted_blocks"] == 0 and all_room["kvstore_evicted_local_blocks"] == 0
    assert all_room["kvstore_used_bytes"] == w > 0 and all_room["kvstore_capacity_bytes"] > w
    assert all_room["device_hit_rate"] == 0 and all_room["host_hit_rate"] == all_room["token_hit_rate"] > 0.5
    assert all_room["token_hit_rate_warm_turns"] > 0.9
    # A quarter of W: the kvstore evicts each dialogue before it returns.
    assert quarter["kvstore_capacity_bytes"] == w // 4 and quarter["fraction_of_working_set"] == 0.25
    assert quarter["kvstore_evicted_blocks"] > 0 and quarter["kvstore_used_bytes"] <= w // 4
    assert quarter["token_hit_rate"] == quarter["host_hit_rate"] == quarter["device_hit_rate"] == 0
    data = json.loads(report.read_text())
    assert [r["num_turns"] for r in data["runs"]] == [18, 18] and all(r["num_errors"] == 0 for r in data["runs"])
    assert "(0.25 W)" in data["runs"][1]["mode"] and "(room for all)" in data["runs"][0]["mode"]
    # Each engine ran with the planned KV size (its engine_ready log line).
    for run in ("ws-all", "ws-0.25"):
        lines = (tmp_path / "logs" / run / "cache-engine-0.log").read_text().splitlines()
        ready = [json.loads(line) for line in lines if '"engine_ready"' in line]
        assert [r["kv_bytes"] for r in ready] == [result["working_set_plan"]["engine_kv_cache_bytes"]], run
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "kvstore MiB" in proc.stdout  # the table
