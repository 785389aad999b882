"""guidellm and aiperf, two load tools nobody here wrote, against `salon up`'s OpenAI HTTP API.

    python -m bench.load_tools [--quick] [--url URL --api-key KEY] [--venv DIR] [--out DIR]

1. The tools' own virtual environment (`.venv-loadtools/` unless --venv): both pull in their own torch and
   transformers, so they never share salon's. Made once with the versions pinned below.
2. A Hugging Face tokenizer for their synthetic prompts, exported from the served model's GGUF
   (transformers reads a GGUF's tokenizer; no network).
3. `salon up` with its defaults (model, engines, auth) in a temporary state directory, on free loopback
   ports (a block of seven from --port-base, or the first free block above it), unless --url names a
   running server.
4. guidellm's default synthetic data (256 prompt tokens, 128 output tokens; it sends `ignore_eos: true`
   so each reply is the full 128) in its synchronous profile, then its concurrent profile at 4 streams,
   each bounded by a request count.
5. aiperf's chat profile (`--endpoint-type chat --streaming`, synthetic 256-token prompts) with the extra
   inputs its documentation recommends for a fixed output length (`max_tokens`, `min_tokens`, `ignore_eos`)
   at a concurrency of 4, bounded by a request count.

Each tool's JSON output is read back (bench/load_tools_figures.py) into requests ok / errored, TTFT and ITL
p50 / p95 and output tokens/s over the run. The figures are salon's alone: these tools measure one server,
so the peer is null. The load average is printed beside them (the tools and the server share the host).
Exit status 1 unless every request of every run succeeded. Last line: `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.load_tools_figures import RunFigures, aiperf_figures, figures_table, guidellm_figures

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"guidellm": "0.8.1", "aiperf": "0.13.0", "gguf": "0.19.0"}
DEFAULT_VENV = ROOT / ".venv-loadtools"
PROMPT_TOKENS = 256  # guidellm's documented default synthetic shape
OUTPUT_TOKENS = 128
CONCURRENCY = 4
NUM_PORTS = 7  # http, gateway, kvstore, engine, metrics x3
TOOL_TIMEOUT_S = 900
UP_TIMEOUT_S = 1800  # a first run converts the GGUF


@dataclass(frozen=True)
class Workload:
    sync_requests: int
    concurrent_requests: int
    aiperf_requests: int


@dataclass(frozen=True)
class Target:
    """Where the tools send their requests and what they need to build them."""

    venv: Path  # the tools' venv
    url: str  # the server's HTTP base, http://HOST:PORT
    api_key: str
    model: str  # the served model's id
    tokenizer: Path  # a Hugging Face tokenizer directory


FULL = Workload(sync_requests=8, concurrent_requests=16, aiperf_requests=16)
QUICK = Workload(sync_requests=2, concurrent_requests=4, aiperf_requests=4)


# ---------------------------------------------------------------- the tools' environment


def ensure_venv(venv: Path) -> Path:
    """The tools' venv with the pinned versions (made or completed here); returns its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making {venv} for the load tools (pip output in {venv}/pip.log)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    missing = [f"{name}=={version}" for name, version in PINNED.items() if _installed(python, name) != version]
    if missing:
        print(f"installing {' '.join(missing)} into {venv}...", flush=True)
        with open(venv / "pip.log", "ab") as log:
            done = subprocess.run([str(python), "-m", "pip", "install", *missing], stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise SystemExit(f"load_tools: pip could not install {' '.join(missing)} (see {venv / 'pip.log'})")
    return python


def _installed(python: Path, name: str) -> str | None:
    probe = f"import importlib.metadata as m; print(m.version({name!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


_EXPORT = """
import sys
from pathlib import Path
from transformers import AutoTokenizer
gguf = Path(sys.argv[1])
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[2])
"""


def export_tokenizer(python: Path, model: str, cache_root: Path) -> Path:
    """A Hugging Face tokenizer directory made from the model's GGUF, once per file (keyed by its sha256)."""
    from salon.engine.model.sources import resolve_source

    source = resolve_source(model)
    out = cache_root / source.sha256[:16]
    if not (out / "tokenizer.json").exists():
        print(f"exporting the tokenizer of {source.path.name} to {out}...", flush=True)
        tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
        subprocess.run([str(python), "-c", _EXPORT, str(source.path), str(tmp)], check=True, capture_output=True)
        tmp.rename(out)
    return out


# ---------------------------------------------------------------- the server


def free_port_block(start: int, count: int) -> int:
    """The first port >= start with `count` consecutive ports free on 127.0.0.1."""
    for base in range(start, 65535 - count):
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports above {start}")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SalonUp:
    """`salon up` as a child process: started with its defaults but for ports and state directory, ready
    once it prints its HTTP line, stopped with SIGINT (its Ctrl-C)."""

    def __init__(self, state_dir: Path, port_base: int, api_key: str) -> None:
        self.base = free_port_block(port_base, NUM_PORTS)
        self.api_key = api_key
        state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = state_dir / "salon-up.log"
        argv = [
            sys.executable,
            "-m",
            "salon.cli.main",
            "up",
            "--state-dir",
            str(state_dir),
            "--api-key",
            api_key,
            "--http-port",
            str(self.base),
            "--gateway-port",
            str(self.base + 1),
            "--kvstore-port",
            str(self.base + 2),
            "--engine-base-port",
            str(self.base + 3),
            "--metrics-base-port",
            str(self.base + 4),
        ]
        self.log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.base}"

    def wait_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"salon up exited with {self.proc.returncode}:\n{self.log_path.read_text()[-2000:]}")
            if f"{self.url}/v1" in self.log_path.read_text():
                return
            time.sleep(0.5)
        raise RuntimeError(f"salon up did not serve within {timeout_s:.0f} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def served_model(url: str, api_key: str) -> str:
    """The server's default model: the first id /v1/models lists."""
    request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)["data"][0]["id"]


# ---------------------------------------------------------------- the tools


def guidellm_argv(target: Target, profile: str, num_requests: int, out: Path) -> list[str]:
    """guidellm's default synthetic benchmark in one profile (`synchronous` or `concurrent,streams=N`)."""
    return [
        str(target.venv / "bin" / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={target.url},api_key={target.api_key},model={target.model}",
        "--profile",
        f"kind={profile}",
        "--constraint",
        f"kind=max_requests,count={num_requests}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--tokenizer",
        f"kind=hf_auto,model={target.tokenizer}",
        "--output",
        f"kind=json,path={out}",
        "--disable-progress",
    ]


def aiperf_argv(target: Target, num_requests: int, out_dir: Path) -> list[str]:
    """aiperf's chat profile with the extra inputs it recommends for a fixed output length."""
    return [
        str(target.venv / "bin" / "aiperf"),
        "profile",
        "--model",
        target.model,
        "--url",
        target.url,
        "--api-key",
        target.api_key,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--tokenizer",
        str(target.tokenizer),
        "--synthetic-input-tokens-mean",
        str(PROMPT_TOKENS),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(OUTPUT_TOKENS),
        "--extra-inputs",
        f"max_tokens:{OUTPUT_TOKENS}",
        "--extra-inputs",
        f"min_tokens:{OUTPUT_TOKENS}",
        "--extra-inputs",
        "ignore_eos:true",
        "--concurrency",
        str(CONCURRENCY),
        "--request-count",
        str(num_requests),
        "--random-seed",
        "0",
        "--output-artifact-dir",
        str(out_dir),
        "--ui-type",
        "none",
        "--no-gpu-telemetry",
    ]


def run_tool(argv: list[str], log_path: Path, secret: str) -> int:
    """Run one tool to its end (or TOOL_TIMEOUT_S: 124), its output in log_path; the key is not echoed."""
    print("$ " + " ".join(argv).replace(secret, "KEY"), flush=True)
    with open(log_path, "w") as log:
        try:
            return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=TOOL_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            return 124


def run_guidellm(target: Target, profile: str, label: str, num_requests: int, out_dir: Path) -> list[RunFigures]:
    out = out_dir / f"guidellm-{label}.json"
    log = out.with_suffix(".log")
    code = run_tool(guidellm_argv(target, profile, num_requests, out), log, target.api_key)
    try:
        return guidellm_figures(json.loads(out.read_text()))
    except (OSError, ValueError, KeyError) as exc:
        return [_failed("guidellm", label, f"exit {code}, no readable report ({exc}); log {log}")]


def run_aiperf(target: Target, num_requests: int, out_dir: Path) -> RunFigures:
    artifacts, log = out_dir / "aiperf", out_dir / "aiperf.log"
    label = f"chat@{CONCURRENCY}"
    code = run_tool(aiperf_argv(target, num_requests, artifacts), log, target.api_key)
    aggregate_path = artifacts / "profile_export_aiperf.json"
    try:
        records = (artifacts / "profile_export.jsonl").read_text()
        aggregate = json.loads(aggregate_path.read_text()) if aggregate_path.exists() else None
        return aiperf_figures(label, records, aggregate)
    except (OSError, ValueError, KeyError) as exc:
        return _failed("aiperf", label, f"exit {code}, no readable export ({exc}); log {log}")


def _load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _failed(tool: str, profile: str, why: str) -> RunFigures:
    """A run the tool left no readable output of."""
    return RunFigures(
        tool,
        profile,
        0,
        0,
        0,
        ttft_ms_p50=None,
        ttft_ms_p95=None,
        itl_ms_p50=None,
        itl_ms_p95=None,
        output_tokens_per_s=None,
        first_error=why,
    )


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load_tools", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests per run (2 / 4 / 4)")
    p.add_argument("--url", default=None, help="a running server's HTTP base (http://HOST:PORT); default: salon up")
    p.add_argument("--api-key", default="bench-load-tools-key")
    p.add_argument("--model", default=None, help="the GGUF behind the tokenizer (default: salon up's model)")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"the tools' venv (default: {DEFAULT_VENV.name})")
    p.add_argument("--out", type=Path, default=None, help="where the tools write (default: a temporary directory)")
    p.add_argument("--port-base", type=int, default=18000, help="first port tried for salon up's seven ports")
    args = p.parse_args(argv)
    work = QUICK if args.quick else FULL

    from salon.cli.up import DEFAULT_MODEL

    python = ensure_venv(args.venv)
    tokenizer = export_tokenizer(
        python, args.model or DEFAULT_MODEL, Path.home() / ".cache" / "salon" / "hf-tokenizers"
    )
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="salon-load-tools-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if url is None:
        server = SalonUp(out_dir / "stack", args.port_base, args.api_key)
        url = server.url
    rows: list[RunFigures] = []
    load: dict[str, list[float]] = {}
    try:
        if server is not None:
            print(f"starting salon up on {url} (log {server.log_path})...", flush=True)
            server.wait_up(UP_TIMEOUT_S)
        target = Target(args.venv, url, args.api_key, served_model(url, args.api_key), tokenizer)
        load["before"] = _load_avg()
        rows += run_guidellm(target, "synchronous", "sync", work.sync_requests, out_dir)
        load["after_guidellm_sync"] = _load_avg()
        streams = f"concurrent,streams={CONCURRENCY}"
        rows += run_guidellm(target, streams, f"concurrent{CONCURRENCY}", work.concurrent_requests, out_dir)
        load["after_guidellm_concurrent"] = _load_avg()
        rows.append(run_aiperf(target, work.aiperf_requests, out_dir))
        load["after_aiperf"] = _load_avg()
    finally:
        if server is not None:
            server.stop()

    print()
    print(f"salon alone at {url} (model {target.model}; {PROMPT_TOKENS} prompt tokens, {OUTPUT_TOKENS} output tokens)")
    print("latency in ms; out tok/s: generated tokens over the run's wall time; peer: none (these tools measure")
    print("one server)")
    print(figures_table(rows))
    print("load average (1/5/15 min): " + "; ".join(f"{k} {' '.join(f'{x:.2f}' for x in v)}" for k, v in load.items()))
    print(f"outputs: {out_dir}")
    clean = bool(rows) and all(r.clean for r in rows)
    result = {
        "quick": args.quick,
        "model": target.model,
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "tool_versions": {"guidellm": PINNED["guidellm"], "aiperf": PINNED["aiperf"]},
        "runs": [asdict(r) for r in rows],
        "num_requests_errored": sum(r.num_requests_errored + r.num_requests_incomplete for r in rows),
        "all_ok": clean,
        "load_avg_1_5_15": load,
        "peer": None,
    }
    print("RESULT " + json.dumps(result))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
