"""Soak: many concurrent streams through the gateway, bounded in time and count, loopback only.

Starts real processes: two engines (synthetic model, small queues) and a gateway with two tenants,
one unlimited and one allowed `LIMITED_STREAMS` streams at once. Phases:

  warm-up      a few hundred tokens through every process; RSS (VmRSS) of each process is read after it
  below        `concurrency` closed-loop workers, well under capacity: every request must succeed
  above        4x the capacity of the engines (running + waiting slots) from the unlimited tenant,
               plus 4x its limit from the limited tenant: the excess must get RESOURCE_EXHAUSTED fast
               (never a timeout, never another error), the admitted streams must finish
  below again  the below phase once more, after the overload
  RSS          after each phase; growth = last figure - lowest earlier figure, per process
  accounting   each engine ends with no work and no leaked KV block

Capacity of one engine = max_num_running + max_waiting_requests streams.

    python -m bench.soak [--quick]

The baseline is the below-capacity phase itself: its latency percentiles are printed next to the
above-capacity figures. Last line: `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import ServiceProcess, start_service

KEY_OPEN = "sk-soak-open-4b1d9e"
KEY_LIMITED = "sk-soak-limited-77c0aa"
LIMITED_STREAMS = 4
MAX_NUM_RUNNING = 8
MAX_WAITING_REQUESTS = 4
ENGINE_IDS = ("e0", "e1")
PROMPT = [2, 818, 5279, 529, 506, 3004, 563, 496, 8351, 1124, 236764, 11052, 6524, 236761]


@dataclass
class PhaseResult:
    """What the clients saw in one phase."""

    name: str
    num_requests: int = 0
    num_ok: int = 0
    num_resource_exhausted: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # any other status code -> count
    num_generated_tokens: int = 0
    wall_s: float = 0.0
    ok_latency_ms: list[float] = field(default_factory=list, repr=False)
    refusal_latency_ms: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not k.endswith("latency_ms")}
        d["ok_latency_ms_p50"] = percentile(self.ok_latency_ms, 50)
        d["ok_latency_ms_p99"] = percentile(self.ok_latency_ms, 99)
        d["refusal_latency_ms_p50"] = percentile(self.refusal_latency_ms, 50)
        d["refusal_latency_ms_max"] = max(self.refusal_latency_ms, default=None)
        d["requests_per_s"] = self.num_requests / self.wall_s if self.wall_s else 0.0
        return d


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Stack:
    engines: dict[str, ServiceProcess]
    gateway: ServiceProcess

    def processes(self) -> dict[str, ServiceProcess]:
        return {**self.engines, "gateway": self.gateway}

    def rss_kib(self) -> dict[str, int]:
        return {name: vm_rss_kib(p.process.pid) for name, p in self.processes().items()}

    def stop(self) -> None:
        for p in [self.gateway, *self.engines.values()]:
            p.stop()


def start_stack(workdir: Path) -> Stack:
    tenants = workdir / "tenants.json"
    tenants.write_text(
        json.dumps(
            {
                "tenants": [
                    {"tenant_id": "open", "api_key": KEY_OPEN, "namespace_salt": "soak-open"},
                    {
                        "tenant_id": "limited",
                        "api_key": KEY_LIMITED,
                        "namespace_salt": "soak-limited",
                        "max_concurrent_streams": LIMITED_STREAMS,
                    },
                ]
            }
        )
    )
    engines: dict[str, ServiceProcess] = {}
    try:
        for engine_id in ENGINE_IDS:
            engines[engine_id] = start_service(
                "engine",
                [
                    "--port",
                    "0",
                    "--model",
                    "synthetic-tiny",
                    "--engine-id",
                    engine_id,
                    "--kv-cache-bytes",
                    str(32 << 20),
                    "--max-num-running",
                    str(MAX_NUM_RUNNING),
                    "--max-waiting-requests",
                    str(MAX_WAITING_REQUESTS),
                    *INSECURE_LOOPBACK_FLAGS,
                ],
                log_path=workdir / f"soak-{engine_id}.log",
                timeout_s=180,
            )
        spec = ",".join(f"{e}={p.address}" for e, p in engines.items())
        gateway = start_service(
            "gateway",
            [
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--engines",
                spec,
                "--tenants-file",
                str(tenants),
                "--load-interval-ms",
                "100",
                "--grace-s",
                "1",
                *INSECURE_LOOPBACK_FLAGS,
            ],
            log_path=workdir / "soak-gateway.log",
            timeout_s=60,
        )
    except BaseException:
        for p in engines.values():
            p.kill()
        raise
    return Stack(engines, gateway)


async def _wait_routable(address: str, timeout_s: float = 30.0) -> None:
    """The gateway learns engine health asynchronously: wait until a request goes through."""
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        while True:
            try:
                async for _ in stub.Generate(_request("ready", 1), metadata=_auth(KEY_OPEN), timeout=10):
                    pass
                return
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


def _request(conversation_id: str, max_new_tokens: int) -> chat_pb2.GenerateRequest:
    return chat_pb2.GenerateRequest(
        conversation_id=conversation_id,
        tokens=chat_pb2.TokenizedPrompt(token_ids=PROMPT),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )


def _auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def run_phase(
    address: str,
    name: str,
    workers: list[tuple[str, int]],
    num_requests: int,
    max_new_tokens: int,
    time_limit_s: float,
    call_timeout_s: float,
) -> PhaseResult:
    """Closed-loop workers, one (api key, worker index) each, sharing a budget of `num_requests`; the
    phase also ends at `time_limit_s`. A refused worker waits 20 ms before its next request."""
    result = PhaseResult(name)
    budget = iter(range(num_requests))
    stop_at = time.monotonic() + time_limit_s

    async def worker(stub, key: str, index: int) -> None:
        for n in budget:
            if time.monotonic() > stop_at:
                return
            started = time.perf_counter()
            result.num_requests += 1
            try:
                num_tokens = 0
                async for event in stub.Generate(
                    _request(f"{name}-{key[-4:]}-{index}-{n}", max_new_tokens),
                    metadata=_auth(key),
                    timeout=call_timeout_s,
                ):
                    num_tokens += len(event.delta.token_ids)
                result.num_ok += 1
                result.num_generated_tokens += num_tokens
                result.ok_latency_ms.append((time.perf_counter() - started) * 1000)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    result.num_resource_exhausted += 1
                    result.refusal_latency_ms.append((time.perf_counter() - started) * 1000)
                    await asyncio.sleep(0.02)
                else:
                    result.errors[exc.code().name] = result.errors.get(exc.code().name, 0) + 1

    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        await asyncio.gather(*(worker(stub, key, i) for key, i in workers))
    result.wall_s = time.perf_counter() - started
    return result


@dataclass
class SoakReport:
    phases: list[PhaseResult]
    rss_kib: dict[str, dict[str, int]]  # checkpoint -> process -> KiB
    # Engine -> its accounting ended with no work and no leaked KV block (free + cached == total).
    engines_clean: dict[str, bool]

    def rss_growth_kib(self) -> dict[str, int]:
        """Last checkpoint minus the lowest earlier one, per process. (The lowest, not the first: an
        engine's RSS can drop after warm-up when the allocator returns model-loading memory, and a
        high baseline would hide growth.)"""
        checkpoints = list(self.rss_kib.values())
        last, earlier = checkpoints[-1], checkpoints[:-1]
        return {name: last[name] - min(c[name] for c in earlier) for name in last}


async def _engine_clean(address: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        while True:
            load = (await stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=5)).load
            if (
                load.running_requests == 0
                and load.waiting_requests == 0
                and load.free_kv_blocks + load.cached_kv_blocks == load.total_kv_blocks
            ):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)


def run_soak(workdir: Path, quick: bool) -> SoakReport:
    scale = 1 if quick else 4
    capacity = len(ENGINE_IDS) * (MAX_NUM_RUNNING + MAX_WAITING_REQUESTS)
    stack = start_stack(workdir)
    try:
        address = stack.gateway.address

        async def main() -> SoakReport:
            await _wait_routable(address)
            rss: dict[str, dict[str, int]] = {}
            phases = []
            warm = await run_phase(address, "warmup", [(KEY_OPEN, i) for i in range(8)], 48, 16, 60, 60)
            phases.append(warm)
            rss["after_warmup"] = stack.rss_kib()
            below = await run_phase(
                address, "below", [(KEY_OPEN, i) for i in range(MAX_NUM_RUNNING)], 160 * scale, 16, 60 * scale, 60
            )
            phases.append(below)
            rss["after_below"] = stack.rss_kib()
            workers = [(KEY_OPEN, i) for i in range(4 * capacity)] + [
                (KEY_LIMITED, i) for i in range(4 * LIMITED_STREAMS)
            ]
            above = await run_phase(address, "above", workers, 600 * scale, 48, 60 * scale, 60)
            phases.append(above)
            rss["after_above"] = stack.rss_kib()
            again = await run_phase(
                address, "below_again", [(KEY_OPEN, i) for i in range(MAX_NUM_RUNNING)], 160 * scale, 16, 60 * scale, 60
            )
            phases.append(again)
            rss["after_below_again"] = stack.rss_kib()
            clean = {e: await _engine_clean(p.address) for e, p in stack.engines.items()}
            return SoakReport(phases, rss, clean)

        return asyncio.run(main())
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_soak(Path(tmp), args.quick)
    for phase in report.phases:
        print(json.dumps(phase.summary()))
    for checkpoint, values in report.rss_kib.items():
        print(checkpoint, {k: f"{v / 1024:.1f} MiB" for k, v in values.items()})
    phases = {p.name: p.summary() for p in report.phases}
    result = {
        "below_requests": phases["below"]["num_requests"],
        "below_failed_requests": phases["below"]["num_requests"] - phases["below"]["num_ok"],
        "below_latency_ms_p50": phases["below"]["ok_latency_ms_p50"],
        "below_latency_ms_p99": phases["below"]["ok_latency_ms_p99"],
        "below_requests_per_s": phases["below"]["requests_per_s"],
        "above_requests": phases["above"]["num_requests"],
        "above_ok": phases["above"]["num_ok"],
        "above_resource_exhausted": phases["above"]["num_resource_exhausted"],
        "above_other_errors": sum(phases["above"]["errors"].values()),
        "above_refusal_latency_ms_p50": phases["above"]["refusal_latency_ms_p50"],
        "above_refusal_latency_ms_max": phases["above"]["refusal_latency_ms_max"],
        "above_ok_latency_ms_p99": phases["above"]["ok_latency_ms_p99"],
        "below_again_failed_requests": phases["below_again"]["num_requests"] - phases["below_again"]["num_ok"],
        "rss_growth_kib": report.rss_growth_kib(),
        "engines_clean": all(report.engines_clean.values()),
        "rss_after_warmup_kib": report.rss_kib["after_warmup"],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
