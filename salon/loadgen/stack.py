"""Starts a local stack for the bench: kvstore + N engines + gateway, each its own OS process.

With the cache: the engines keep their prefix cache and use the kvstore (`--kvstore-target`), or
only their own prefix caches when `kvstore=False`.
Without (`cache=False`): no kvstore is started and every engine runs with `--no-prefix-cache true`, so
each turn recomputes its whole prompt — the same trace, the same processes, nothing reused.
All services listen on ports chosen by the OS (port 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import ServiceProcess, start_service, threads_per_process

# The engine's config field `no_prefix_cache: bool = False`; salon.common.config bool flags take a value.
NO_PREFIX_CACHE_ARGS = ("--no-prefix-cache", "true")


@dataclass(frozen=True)
class StackConfig:
    model: str = "gemma-3-270m"
    num_engines: int = 2
    cache: bool = True
    # With the cache: also start a kvstore (host tier). False: only the engines' own prefix caches.
    kvstore: bool = True
    api_key: str = "bench-key-0000"
    kvstore_capacity_bytes: int = 1 << 30
    # Each engine's paged KV cache (--kv-cache-bytes); None: the engine's default.
    engine_kv_cache_bytes: int | None = None
    engine_args: tuple[str, ...] = ()
    engine_timeout_s: float = 1800.0
    # Also serve the gateway's OpenAI-compatible HTTP API (Stack.http_url).
    http: bool = False


@dataclass
class Stack:
    gateway_address: str
    processes: list[ServiceProcess] = field(default_factory=list)
    kvstore_address: str | None = None
    # The gateway's HTTP API (StackConfig.http), e.g. http://127.0.0.1:PORT.
    http_url: str | None = None

    def stop(self) -> None:
        stop_processes(self.processes)

    def kvstore_stats(self, settle_s: float = 5.0) -> dict | None:
        """The kvstore's GetStats as a dict, once the reply KV still being put after the last turn has landed
        (its counts unchanged over 0.5 s, or settle_s passed); None without a kvstore."""
        if self.kvstore_address is None:
            return None
        from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc

        with grpc.insecure_channel(self.kvstore_address) as channel:
            stub = kvstore_pb2_grpc.KVStoreServiceStub(channel)

            def get():
                return stub.GetStats(kvstore_pb2.GetStatsRequest(), timeout=10)

            stats = get()
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline:
                time.sleep(0.5)
                again = get()
                settled = _state(again) == _state(stats)
                stats = again
                if settled:
                    break
        return {f.name: getattr(stats, f.name) for f in stats.DESCRIPTOR.fields}


def _state(stats) -> tuple[int, ...]:
    return (
        stats.used_bytes,
        stats.num_blocks,
        stats.num_local_blocks,
        stats.evicted_blocks,
        stats.evicted_local_blocks,
    )


def stop_processes(processes: Sequence[ServiceProcess]) -> None:
    for proc in reversed(processes):
        proc.stop()


def write_tenants_file(directory: Path, api_key: str) -> Path:
    path = directory / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"tenant_id": "bench", "api_key": api_key, "namespace_salt": "bench"}]}))
    path.chmod(0o600)
    return path


def engine_args(config: StackConfig, index: int, kvstore_address: str | None) -> list[str]:
    args = [
        "--port",
        "0",
        "--engine-id",
        f"engine-{index}",
        "--model",
        config.model,
        # Engines on one host split its cores: oversubscribed threads spin and slow every step.
        "--torch-threads",
        str(threads_per_process(config.num_engines)),
        *INSECURE_LOOPBACK_FLAGS,
    ]
    if config.engine_kv_cache_bytes is not None:
        args += ["--kv-cache-bytes", str(config.engine_kv_cache_bytes)]
    args += config.engine_args
    if not config.cache:
        args.extend(NO_PREFIX_CACHE_ARGS)
    elif kvstore_address is not None:
        args += ["--kvstore-target", kvstore_address]
    return args


def launch_stack(config: StackConfig, log_dir: Path) -> Stack:
    log_dir.mkdir(parents=True, exist_ok=True)
    label = "cache" if config.cache else "nocache"
    procs: list[ServiceProcess] = []
    try:
        kv_address = None
        if config.cache and config.kvstore:
            kv = start_service(
                "kvstore",
                ["--port", "0", "--capacity-bytes", str(config.kvstore_capacity_bytes), *INSECURE_LOOPBACK_FLAGS],
                log_path=log_dir / f"{label}-kvstore.log",
            )
            procs.append(kv)
            kv_address = kv.address
        engines = []
        for i in range(config.num_engines):
            # Start every engine before waiting for any: they load the model in parallel.
            engine = ServiceProcess(
                "engine", tuple(engine_args(config, i, kv_address)), log_dir / f"{label}-engine-{i}.log"
            ).start(timeout_s=config.engine_timeout_s)
            procs.append(engine)
            engines.append(engine)
        for engine in engines:
            engine.wait_serving(timeout_s=config.engine_timeout_s)
        targets = ",".join(f"engine-{i}={e.address}" for i, e in enumerate(engines))
        gateway = start_service(
            "gateway",
            [
                "--port",
                "0",
                "--engines",
                targets,
                *INSECURE_LOOPBACK_FLAGS,
                "--tenants-file",
                str(write_tenants_file(log_dir, config.api_key)),
                *(["--http-port", "0"] if config.http else []),
            ],
            log_path=log_dir / f"{label}-gateway.log",
        )
        procs.append(gateway)
    except BaseException:
        stop_processes(procs)
        raise
    http_url = f"http://127.0.0.1:{gateway.extra_ports['http_port']}" if config.http else None
    return Stack(gateway.address, procs, kv_address, http_url)
