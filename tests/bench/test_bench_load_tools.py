"""bench/load_tools.py: the script loads and parses its flags, and its figures come from what guidellm 0.8.1 and
aiperf 0.13.0 really write (data/), read back as the tools themselves count them.

The fixtures are the tools' own output against `salon up` (SmolLM2-135M-Instruct, 256 prompt tokens, 128 output
tokens), kept as written but for local paths (the tools' venv, the tokenizer and output directories):
  guidellm_concurrent4_ok.json           guidellm's concurrent profile, 4 streams, 4 requests, all served
  guidellm_sync_ignore_eos_refused.json  its synchronous profile, 2 requests, both refused (400) by a server
                                         that did not take `ignore_eos`
  aiperf_chat_ok.jsonl (+ _aggregate)    aiperf's chat profile, concurrency 4, 4 requests, all served
  aiperf_chat_min_tokens_refused.jsonl   the same, every request refused (400 naming min_tokens): aiperf then
                                         writes records but no aggregate
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench import load_tools
from bench.load_tools_figures import FiguresError, RunFigures, aiperf_figures, figures_table, guidellm_figures

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def _json(name: str) -> dict:
    return json.loads((DATA / name).read_text())


# ---------------------------------------------------------------- guidellm


def test_guidellm_report_all_served():
    report = _json("guidellm_concurrent4_ok.json")
    (row,) = guidellm_figures(report)
    metrics = report["benchmarks"][0]["metrics"]
    assert (row.tool, row.profile) == ("guidellm", "concurrent@4")
    assert (row.num_requests_ok, row.num_requests_errored, row.num_requests_incomplete) == (4, 0, 0)
    assert row.clean and row.first_error is None
    # Each reply was the 128 tokens asked for (guidellm sends ignore_eos).
    assert metrics["output_token_count"]["successful"]["median"] == 128
    # The figures are the report's own: medians and p95 over successful requests, the server-wide rate.
    ttft = metrics["time_to_first_token_ms"]["successful"]
    itl = metrics["inter_token_latency_ms"]["successful"]
    assert (row.ttft_ms_p50, row.ttft_ms_p95) == (ttft["median"], ttft["percentiles"]["p95"])
    assert (row.itl_ms_p50, row.itl_ms_p95) == (itl["median"], itl["percentiles"]["p95"])
    assert row.output_tokens_per_s == metrics["output_tokens_per_second"]["total"]["mean"]
    # ... and agree with the requests it lists: TTFT is first token minus request start; guidellm's median is
    # the lower of the middle two.
    requests = report["benchmarks"][0]["requests"]["successful"]
    timings = [r["info"]["timings"] for r in requests]
    ttfts = sorted(1000 * (t["first_token_iteration"] - t["request_start"]) for t in timings)
    assert len(ttfts) == 4
    assert row.ttft_ms_p50 == pytest.approx(statistics.median_low(ttfts), rel=1e-9)
    assert row.ttft_ms_p95 == pytest.approx(ttfts[-1], rel=1e-9)


def test_guidellm_report_all_refused():
    (row,) = guidellm_figures(_json("guidellm_sync_ignore_eos_refused.json"))
    assert (row.profile, row.num_requests_ok, row.num_requests_errored) == ("synchronous", 0, 2)
    assert not row.clean
    assert (row.ttft_ms_p50, row.itl_ms_p50, row.output_tokens_per_s) == (None, None, None)
    assert "400 Bad Request" in row.first_error and "/v1/chat/completions" in row.first_error


def test_guidellm_report_without_benchmarks_is_an_error():
    with pytest.raises(FiguresError, match="no benchmarks"):
        guidellm_figures({"benchmarks": []})


# ---------------------------------------------------------------- aiperf


def test_aiperf_export_all_served():
    records = (DATA / "aiperf_chat_ok.jsonl").read_text()
    aggregate = _json("aiperf_chat_ok_aggregate.json")
    row = aiperf_figures("chat@4", records, aggregate)
    assert (row.tool, row.profile) == ("aiperf", "chat@4")
    assert (row.num_requests_ok, row.num_requests_errored) == (4, 0)
    assert row.clean and row.first_error is None
    assert aggregate["request_count"]["avg"] == 4 and aggregate["total_usage_completion_tokens"]["avg"] == 4 * 128
    assert row.output_tokens_per_s == aggregate["output_token_throughput"]["avg"]
    assert row.itl_ms_p95 == aggregate["inter_token_latency"]["p95"]
    # The aggregate's TTFT median is the median of the per-request records.
    ttfts = [json.loads(line)["metrics"]["time_to_first_token"]["value"] for line in records.splitlines()]
    assert row.ttft_ms_p50 == pytest.approx(statistics.median(ttfts))
    assert row.ttft_ms_p95 == aggregate["time_to_first_token"]["p95"]


def test_aiperf_export_all_refused():
    records = (DATA / "aiperf_chat_min_tokens_refused.jsonl").read_text()
    row = aiperf_figures("chat@4", records, None)
    assert (row.num_requests_ok, row.num_requests_errored) == (0, 4)
    assert not row.clean
    assert (row.ttft_ms_p50, row.output_tokens_per_s) == (None, None)
    assert row.first_error.startswith("400 ") and '"param":"min_tokens"' in row.first_error


def test_aiperf_export_missing_parts_are_errors():
    with pytest.raises(FiguresError, match="no request records"):
        aiperf_figures("chat@4", "", None)
    with pytest.raises(FiguresError, match="no aggregate"):
        aiperf_figures("chat@4", (DATA / "aiperf_chat_ok.jsonl").read_text(), None)


# ---------------------------------------------------------------- the summary


def test_clean_needs_a_served_request_and_nothing_else():
    base = dict(tool="t", profile="p", ttft_ms_p50=None, ttft_ms_p95=None, itl_ms_p50=None, itl_ms_p95=None)
    assert RunFigures(
        num_requests_ok=3, num_requests_errored=0, num_requests_incomplete=0, **base, output_tokens_per_s=1.0
    ).clean
    assert not RunFigures(
        num_requests_ok=0, num_requests_errored=0, num_requests_incomplete=0, **base, output_tokens_per_s=None
    ).clean
    assert not RunFigures(
        num_requests_ok=3, num_requests_errored=0, num_requests_incomplete=1, **base, output_tokens_per_s=1.0
    ).clean
    assert not RunFigures(
        num_requests_ok=3, num_requests_errored=1, num_requests_incomplete=0, **base, output_tokens_per_s=1.0
    ).clean


def test_table_prints_every_run_and_never_invents_a_figure():
    ok = aiperf_figures("chat@4", (DATA / "aiperf_chat_ok.jsonl").read_text(), _json("aiperf_chat_ok_aggregate.json"))
    (refused,) = guidellm_figures(_json("guidellm_sync_ignore_eos_refused.json"))
    lines = figures_table([ok, refused]).splitlines()
    assert lines[0].split()[:4] == ["tool", "profile", "ok", "errors"]
    assert lines[1].split()[:4] == ["aiperf", "chat@4", "4", "0"]
    assert lines[1].split()[-1] == f"{ok.output_tokens_per_s:.1f}"
    assert lines[2].split() == ["guidellm", "synchronous", "0", "2", "-", "-", "-", "-", "-"]
    assert lines[3].startswith("  first error: HTTPStatusError")


# ---------------------------------------------------------------- the script


def test_script_loads_and_lists_its_flags():
    done = subprocess.run(
        [sys.executable, "-m", "bench.load_tools", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--quick", "--url", "--api-key", "--venv", "--out", "--port-base"):
        assert flag in done.stdout


def test_commands_ask_for_the_documented_workloads(tmp_path):
    target = load_tools.Target(tmp_path / "venv", "http://h:1", "k", "m", tmp_path / "tok")
    guidellm = load_tools.guidellm_argv(target, "synchronous", 3, tmp_path / "g.json")
    assert guidellm[:2] == [str(tmp_path / "venv" / "bin" / "guidellm"), "run"]
    assert "kind=synthetic_text,prompt_tokens=256,output_tokens=128" in guidellm
    assert "kind=max_requests,count=3" in guidellm
    assert "kind=openai_http,target=http://h:1,api_key=k,model=m" in guidellm
    assert f"kind=hf_auto,model={tmp_path / 'tok'}" in guidellm
    aiperf = load_tools.aiperf_argv(target, 5, tmp_path / "a")
    extra = [aiperf[i + 1] for i, a in enumerate(aiperf) if a == "--extra-inputs"]
    assert extra == ["max_tokens:128", "min_tokens:128", "ignore_eos:true"]
    assert aiperf[aiperf.index("--endpoint-type") + 1] == "chat" and "--streaming" in aiperf
    assert aiperf[aiperf.index("--request-count") + 1] == "5"


def test_port_block_skips_a_taken_port():
    start = load_tools.free_port_block(21000, 3)  # positive control: a free block is found where one is
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", start + 1))
        taken.listen()
        base = load_tools.free_port_block(start, 3)
    assert base >= start + 2
