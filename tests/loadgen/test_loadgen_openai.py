"""`salon bench --launch --api openai`: the dialogue workload over the HTTP API as a stateless client
(no conversation ids) reaches the hit rate the gRPC run with ids reaches on the same trace, and its
RESULT carries both hit rates and the HTTP front's added latency. Real processes (synthetic-tiny)."""

import json
import subprocess
import sys


def test_bench_api_openai_matches_the_grpc_hit_rate(tmp_path):
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
            "--api",
            "openai",
            "--quick",
            "--engines",
            "2",
            "--seed",
            "5",
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
            "40",
            "--regenerate-fraction",
            "0.2",
            "--edit-fraction",
            "0.2",
            "--max-new-tokens",
            "6",
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
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    result = json.loads(last[len("RESULT ") :])
    assert result["api"] == "openai" and result["num_errors"] == 0 and result["grpc_num_errors"] == 0
    assert result["num_turns"] == 16
    # Stateless routing keeps every dialogue on its engine: the same reuse as with conversation ids.
    assert result["token_hit_rate"] > 0.5
    assert abs(result["token_hit_rate"] - result["grpc_token_hit_rate"]) < 0.02, result
    assert result["token_hit_rate_warm_turns"] > 0.9
    for key in ("http_added_latency_ms_p50", "http_added_latency_ms_p99", "grpc_turn_ms_p50", "http_turn_ms_p50"):
        assert isinstance(result[key], float), key
    data = json.loads(report.read_text())
    assert set(data["runs"]) == {"openai", "grpc"}
    # Greedy replies: the same number of generated tokens per turn over both fronts.
    http = {(r["dialogue_index"], r["turn_index"]): r for r in data["records"]["openai"]}
    grpc_ = {(r["dialogue_index"], r["turn_index"]): r for r in data["records"]["grpc"]}
    assert http.keys() == grpc_.keys()
    assert all(http[k]["generated_tokens"] == grpc_[k]["generated_tokens"] for k in http)
