"""`salon bench --launch` end to end: kvstore + two engines + gateway as real processes (synthetic-tiny).

The same tiny trace is replayed with the cache and with no cache at all (no kvstore, engines started
with --no-prefix-cache true). Greedy decoding: the cached run must produce exactly the replies and prompt
lengths of the uncached one, reuse most of every warm turn's prompt, and the uncached run none.
"""

import json
import subprocess
import sys

from salon.common.process import threads_per_process
from salon.loadgen.stack import StackConfig, engine_args


def test_engine_flags_for_each_mode():
    # Two engines split this host's cores between them.
    threads = str(threads_per_process(2))
    dev = ["--internal-auth", "insecure-loopback"]  # the benchmark's stack is local: no certificates
    assert engine_args(StackConfig(model="m", cache=True), 1, "127.0.0.1:5") == [
        "--port",
        "0",
        "--engine-id",
        "engine-1",
        "--model",
        "m",
        "--torch-threads",
        threads,
        *dev,
        "--kvstore-target",
        "127.0.0.1:5",
    ]
    assert engine_args(StackConfig(model="m", cache=True, kvstore=False), 0, None) == [
        "--port",
        "0",
        "--engine-id",
        "engine-0",
        "--model",
        "m",
        "--torch-threads",
        threads,
        *dev,
    ]
    assert engine_args(StackConfig(model="m", cache=False, engine_args=("--x", "1")), 0, None) == [
        "--port",
        "0",
        "--engine-id",
        "engine-0",
        "--model",
        "m",
        "--torch-threads",
        threads,
        *dev,
        "--x",
        "1",
        "--no-prefix-cache",
        "true",
    ]
    assert engine_args(
        StackConfig(model="m", cache=True, engine_kv_cache_bytes=4096, engine_args=("--x", "1")), 0, "127.0.0.1:5"
    )[10:] == ["--kv-cache-bytes", "4096", "--x", "1", "--kvstore-target", "127.0.0.1:5"]
    assert engine_args(StackConfig(model="m", cache=True, kvstore=False, num_engines=1), 0, None)[6:8] == [
        "--torch-threads",
        str(threads_per_process(1)),
    ]


def test_bench_launch_compare_no_cache_synthetic_tiny(tmp_path):
    report, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "salon.cli.main",
            "bench",
            "--launch",
            "--model",
            "synthetic-tiny",
            "--engines",
            "2",
            "--compare-no-cache",
            "--seed",
            "3",
            "--dialogues",
            "4",
            "--initial-dialogues",
            "4",
            "--turns",
            "4",
            "--history-messages",
            "10",
            "--long-dialogues",
            "4",
            "--long-history-messages",
            "60",
            "--regenerate-fraction",
            "0.3",
            "--edit-fraction",
            "0.3",
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
            "--time-scale",
            "0",
            "--long-history-tokens",
            "1000",
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
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT ") :])
    data = json.loads(report.read_text())
    cache, nocache = data["runs"]["cache"], data["runs"]["no-cache"]
    assert cache["num_errors"] == 0 and nocache["num_errors"] == 0, (cache["errors"], nocache["errors"])
    assert cache["num_turns"] == nocache["num_turns"] == 16
    assert set(cache["engine_turns"]) <= {"engine-0", "engine-1"} and sum(cache["engine_turns"].values()) == 16

    # Exactness: same prompts, same greedy replies, with and without the cache.
    key = lambda r: (r["dialogue_index"], r["turn_index"])  # noqa: E731
    with_cache = {key(r): r for r in data["records"]["cache"]}
    without = {key(r): r for r in data["records"]["no-cache"]}
    assert with_cache.keys() == without.keys()
    for k in with_cache:
        assert with_cache[k]["prompt_tokens"] == without[k]["prompt_tokens"], k
        assert with_cache[k]["reply_token_ids"] == without[k]["reply_token_ids"], k
    assert result["replies_identical_fraction"] == 1.0

    assert nocache["token_hit_rate"] == 0.0
    assert cache["token_hit_rate_warm_turns"] >= 0.8
    # Unprimed: each dialogue's first turn is cold, the 3 after it return; all 12 are long (>= 1000 tokens).
    assert not cache["primed"] and result["primed"] is False
    assert result["num_long_history_turns"] == 12 and result["ttft_ratio_long_history"] > 0
    for name in ("token_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "turns_per_s", "turns_per_s_ratio"):
        assert isinstance(result[name], float), name
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_launch_engine_prefix_caches_only(tmp_path):
    """One engine, no kvstore: the driver against the real engine and gateway, turn kinds checked by prompt size."""
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "salon.cli.main",
            "bench",
            "--launch",
            "--model",
            "synthetic-tiny",
            "--engines",
            "1",
            "--no-kvstore",
            "--seed",
            "0",
            "--dialogues",
            "2",
            "--initial-dialogues",
            "2",
            "--turns",
            "4",
            "--history-messages",
            "8",
            "--regenerate-fraction",
            "0.4",
            "--edit-fraction",
            "0.3",
            "--max-new-tokens",
            "5",
            "--temperature",
            "0",
            "--time-scale",
            "0",
            "--startup-timeout-s",
            "240",
            "--no-progress",
            "--log-dir",
            str(tmp_path / "logs"),
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    run = data["runs"]["cache"]
    assert run["num_errors"] == 0, run["errors"]
    assert run["turn_kinds"] == {"edit": 3, "message": 3, "regenerate": 2}  # seed 0: m e m r / m r e e
    assert run["engine_turns"] == {"engine-0": 8}
    records = {(r["dialogue_index"], r["turn_index"]): r for r in data["records"]["cache"]}
    for (d, t), r in records.items():
        assert 1 <= r["generated_tokens"] <= 5 and len(r["reply_token_ids"]) == r["generated_tokens"]
        assert r["ttft_ms"] > 0 and r["engine_id"] == "engine-0"
        if t == 0:
            continue
        previous = records[(d, t - 1)]
        if r["kind"] == "regenerate":  # the previous prompt again, exactly
            assert r["prompt_tokens"] == previous["prompt_tokens"], (d, t)
        elif r["kind"] == "message":  # previous prompt + reply + a new user message
            assert r["prompt_tokens"] > previous["prompt_tokens"] + previous["generated_tokens"], (d, t)
