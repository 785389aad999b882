"""`salon up`: start the local stack — kvstore, engine(s), gateway — as separate OS processes.

Waits until each reports SERVING on grpc.health.v1, prints where everything listens, and stops them
all cleanly (SIGTERM, then the grace period) on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from services.common.process import ServiceProcess, ServiceStartError, start_service, threads_per_process


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="salon up", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma-3-270m", help="model to serve (gemma-3-270m or synthetic-tiny)")
    p.add_argument("--engines", type=int, default=1, help="number of engine processes")
    p.add_argument("--gateway-port", type=int, default=50051)
    p.add_argument("--kvstore-port", type=int, default=50061)
    p.add_argument("--engine-base-port", type=int, default=50071, help="engine i listens on base + i")
    p.add_argument("--metrics-base-port", type=int, default=9100, help="gateway, kvstore, engines: base, +1, +2...")
    p.add_argument("--kvstore-capacity-bytes", type=int, default=2 << 30)
    p.add_argument("--redis-url", default=None, help="share the session table through Redis")
    p.add_argument("--api-key", default=os.environ.get("SALON_API_KEY", "salon-dev-key"), help="key of the local tenant")
    p.add_argument("--state-dir", type=Path, default=Path.home() / ".cache" / "salon" / "stack")
    p.add_argument("--exit-when-serving", action="store_true", help="stop everything once all are SERVING")
    return p


def write_tenants_file(state_dir: Path, api_key: str) -> Path:
    path = state_dir / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"tenant_id": "local", "api_key": api_key, "namespace_salt": "local"}]}))
    path.chmod(0o600)
    return path


def start_stack(args: argparse.Namespace) -> list[ServiceProcess]:
    args.state_dir.mkdir(parents=True, exist_ok=True)
    logs = args.state_dir
    procs: list[ServiceProcess] = []
    metrics_port = args.metrics_base_port
    try:
        kv = start_service(
            "kvstore",
            ["--port", str(args.kvstore_port), "--metrics-port", str(metrics_port + 1),
             "--capacity-bytes", str(args.kvstore_capacity_bytes)],
            log_path=logs / "kvstore.log",
        )
        procs.append(kv)
        engine_targets = []
        for i in range(args.engines):
            port = args.engine_base_port + i
            engine = ServiceProcess(
                "engine",
                ("--port", str(port), "--metrics-port", str(metrics_port + 2 + i), "--engine-id", f"engine-{i}",
                 "--model", args.model, "--kvstore-target", kv.address,
                 "--torch-threads", str(threads_per_process(args.engines))),
                logs / f"engine-{i}.log",
            ).start()
            procs.append(engine)
            engine_targets.append(f"engine-{i}={engine.address}")
        print(f"loading {args.model} in {args.engines} engine(s) (the first run converts the GGUF once)...", flush=True)
        for engine in procs[1:]:
            engine.wait_serving(timeout_s=1800)
        gateway_args = ["--port", str(args.gateway_port), "--metrics-port", str(metrics_port),
                        "--engines", ",".join(engine_targets),
                        "--tenants-file", str(write_tenants_file(args.state_dir, args.api_key))]
        if args.redis_url:
            gateway_args += ["--redis-url", args.redis_url]
        procs.append(start_service("gateway", gateway_args, log_path=logs / "gateway.log"))
    except BaseException:
        stop_stack(procs)
        raise
    return procs


def stop_stack(procs: list[ServiceProcess]) -> None:
    for proc in reversed(procs):
        proc.stop()


def describe(procs: list[ServiceProcess], args: argparse.Namespace) -> str:
    rows = [f"  {p.service:<8} {p.address:<18} metrics http://127.0.0.1:{p.metrics_port}/metrics" for p in procs]
    return "\n".join(
        ["salon is up:", *rows, f"  logs     {args.state_dir}",
         f"chat with it:  salon chat --target 127.0.0.1:{args.gateway_port} --api-key {args.api_key}",
         "Ctrl-C stops everything."]
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        procs = start_stack(args)
    except ServiceStartError as exc:
        print(f"salon up failed: {exc}", file=sys.stderr)
        return 1
    print(describe(procs, args), flush=True)
    stop = {"now": args.exit_when_serving}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        while not stop["now"]:
            dead = [p for p in procs if p.process is not None and p.process.poll() is not None]
            if dead:
                print(f"{dead[0].service} exited with {dead[0].process.returncode}; stopping", file=sys.stderr)
                break
            time.sleep(0.5)
    finally:
        print("stopping...", flush=True)
        stop_stack(procs)
    return 0
