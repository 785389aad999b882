"""Gateway benchmark: latency the gateway adds, and how it spreads a skewed workload.

Starts real processes on loopback: `--engines` engine processes (synthetic model) and one gateway.
  1. Added latency. At each request rate, an open-loop client sends short greedy requests
     (max_new_tokens=1) for `--seconds-per-rate`, alternating every 0.5 s between going straight to
     an engine (the baseline) and going through the gateway, so both paths see the same machine
     load. Latency is call start -> final event. added = gateway percentile - direct percentile.
     The gateway process's CPU time over the run, divided by the requests it served, is reported
     as its CPU cost per request (Linux /proc; an upper bound: it includes its idle watch streams).
  2. Load spread. Zipf-skewed dialogues whose hottest ones all hash to one engine, with longer
     replies, go through the gateway; the requests each engine served are compared with where pure
     consistent hashing (the ring owner, no load bound) would have put them.

    python -m bench.gateway [--quick] [--trace-sample-ratio R]

The last line is `RESULT {json}` with added_latency_ms_p50/p99 and requests_per_s at the target rate
(500/s, or the highest rate run), the per-rate table, and the spread figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.proc_stat import cpu_seconds
from salon.common.process import ServiceProcess, start_service
from salon.gateway.ring import HashRing
from salon.gateway.types import TenantId, dialogue_key

API_KEY = "bench-key-0123456789"
BENCH_TENANT = TenantId("bench")
PROMPT_TOKEN_IDS = [2, 818, 5279, 529, 506, 3004, 563, 496, 8351, 1124]
PHASE_S = 0.5
TARGET_RATE = 500


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def timed_call(call) -> float | None:
    """Milliseconds from the call's start to its final event; None if it failed."""
    started = time.perf_counter()
    try:
        async for event in call:
            if event.HasField("final"):
                return (time.perf_counter() - started) * 1000
    except grpc.aio.AioRpcError:
        return None
    return None


async def run_rate(
    rate: float, seconds: float, gateway_stub, engine_stubs, max_new_tokens: int, gateway_pid: int | None = None
) -> dict:
    """Open loop at `rate` requests/s; phases alternate between direct and gateway every PHASE_S."""
    latencies: dict[str, list[float]] = {"direct": [], "gateway": []}
    failures: Counter = Counter()
    tasks: list[asyncio.Task] = []
    sampling = chat_pb2.SamplingParams(max_new_tokens=max_new_tokens)
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    interval_s = 1.0 / rate
    cpu_before_s = cpu_seconds(gateway_pid) if gateway_pid else None
    start = time.perf_counter()
    num_sent = 0

    async def one(path: str, i: int) -> None:
        conv = f"lat-{i % 64}"
        if path == "gateway":
            call = gateway_stub.Generate(
                chat_pb2.GenerateRequest(
                    conversation_id=conv, tokens=chat_pb2.TokenizedPrompt(token_ids=PROMPT_TOKEN_IDS), sampling=sampling
                ),
                metadata=metadata,
                timeout=30,
            )
        else:
            stub = engine_stubs[i % len(engine_stubs)]
            call = stub.Generate(
                engine_pb2.GenerateRequest(
                    request_id=f"direct-{rate}-{i}",
                    conversation_id=conv,
                    tokens=chat_pb2.TokenizedPrompt(token_ids=PROMPT_TOKEN_IDS),
                    sampling=sampling,
                ),
                timeout=30,
            )
        ms = await timed_call(call)
        if ms is None:
            failures[path] += 1
        else:
            latencies[path].append(ms)

    while True:
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
        path = "direct" if int(elapsed / PHASE_S) % 2 == 0 else "gateway"
        tasks.append(asyncio.create_task(one(path, num_sent)))
        num_sent += 1
        next_at = start + num_sent * interval_s
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    send_s = time.perf_counter() - start
    await asyncio.gather(*tasks)
    cpu_after_s = cpu_seconds(gateway_pid) if gateway_pid else None
    row = {"rate_per_s": rate, "achieved_per_s": num_sent / send_s, "failures": dict(failures)}
    if cpu_before_s is not None and cpu_after_s is not None and latencies["gateway"]:
        row["gateway_cpu_ms_per_request"] = (cpu_after_s - cpu_before_s) * 1000 / len(latencies["gateway"])
    for path, values in latencies.items():
        row[f"{path}_ms_p50"] = percentile(values, 50)
        row[f"{path}_ms_p99"] = percentile(values, 99)
        row[f"{path}_count"] = len(values)
    row["added_ms_p50"] = row["gateway_ms_p50"] - row["direct_ms_p50"]
    row["added_ms_p99"] = row["gateway_ms_p99"] - row["direct_ms_p99"]
    return row


async def run_skew(
    gateway_stub, engine_ids: list[str], num_requests: int, concurrency: int, max_new_tokens: int, seed: int = 0
) -> dict:
    """Zipf(1.1) over 200 dialogues whose 10 hottest all live on the first engine's ring arcs (the
    worst case for pure consistent hashing), `concurrency` requests in flight; where did each go?"""
    rng = random.Random(seed)
    ring = HashRing(engine_ids)
    names = [f"skew-{i}" for i in range(2000)]
    on_first = [c for c in names if ring.owner(dialogue_key(BENCH_TENANT, c)) == engine_ids[0]]
    conversations = on_first[:10] + [c for c in names if c not in on_first[:10]][:190]
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(len(conversations))]
    picks = rng.choices(conversations, weights, k=num_requests)
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    served: Counter = Counter()
    semaphore = asyncio.Semaphore(concurrency)

    async def one(conv: str) -> None:
        async with semaphore:
            call = gateway_stub.Generate(
                chat_pb2.GenerateRequest(
                    conversation_id=conv,
                    tokens=chat_pb2.TokenizedPrompt(token_ids=PROMPT_TOKEN_IDS),
                    sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
                ),
                metadata=metadata,
                timeout=120,
            )
            async for event in call:
                if event.HasField("final"):
                    served[event.final.engine_id] += 1

    await asyncio.gather(*(one(conv) for conv in picks))
    ring_only = Counter(ring.owner(dialogue_key(BENCH_TENANT, conv)) for conv in picks)
    mean = num_requests / len(engine_ids)
    return {
        "requests_by_engine": {e: served[e] for e in engine_ids},
        "ring_only_requests_by_engine": {e: ring_only[e] for e in engine_ids},
        "max_over_mean": max(served[e] for e in engine_ids) / mean,
        "ring_only_max_over_mean": max(ring_only[e] for e in engine_ids) / mean,
        "hottest_dialogue_share": Counter(picks).most_common(1)[0][1] / num_requests,
    }


def start_stack(
    num_engines: int, workdir: Path, engine_args: list[str], gateway_args: list[str] = ()
) -> tuple[list[ServiceProcess], ServiceProcess]:
    # Started together, then waited on: model loading overlaps.
    engines = [
        ServiceProcess(
            "engine",
            (
                "--port",
                "0",
                "--model",
                "synthetic-tiny",
                "--engine-id",
                f"e{i}",
                "--kv-cache-bytes",
                str(64 << 20),
                *INSECURE_LOOPBACK_FLAGS,
                *engine_args,
            ),
            workdir / f"engine-{i}.log",
        ).start(600)
        for i in range(num_engines)
    ]
    for engine in engines:
        engine.wait_serving(600)
    tenants = workdir / "tenants.json"
    tenants.write_text(
        json.dumps({"tenants": [{"tenant_id": BENCH_TENANT, "api_key": API_KEY, "namespace_salt": "bench-salt"}]})
    )
    spec = ",".join(f"e{i}={e.address}" for i, e in enumerate(engines))
    gateway = start_service(
        "gateway",
        [
            "--port",
            "0",
            "--engines",
            spec,
            "--tenants-file",
            str(tenants),
            "--log-json",
            "true",
            *INSECURE_LOOPBACK_FLAGS,
            *gateway_args,
        ],
        log_path=workdir / "gateway.log",
        timeout_s=60,
    )
    return engines, gateway


async def wait_all_engines_routable(gateway_stub, num_engines: int, timeout_s: float = 30.0) -> None:
    """Until the gateway has seen every engine: probe dialogues owned by each engine on the ring."""
    ring = HashRing([f"e{i}" for i in range(num_engines)])
    probes = {}
    for i in range(10_000):
        probes.setdefault(ring.owner(dialogue_key(BENCH_TENANT, f"probe-{i}")), f"probe-{i}")
        if len(probes) == num_engines:
            break
    deadline = time.monotonic() + timeout_s
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    while True:
        seen = set()
        for conv in probes.values():
            call = gateway_stub.Generate(
                chat_pb2.GenerateRequest(
                    conversation_id=conv,
                    tokens=chat_pb2.TokenizedPrompt(token_ids=PROMPT_TOKEN_IDS),
                    sampling=chat_pb2.SamplingParams(max_new_tokens=1),
                ),
                metadata=metadata,
                timeout=30,
            )
            async for event in call:
                if event.HasField("final"):
                    seen.add(event.final.engine_id)
        if len(seen) == num_engines or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)


async def main_async(args: argparse.Namespace) -> dict:
    rates = [50, 100, 250, 500] if args.quick else [50, 100, 250, 500, 750, 1000]
    seconds = 3.0 if args.quick else args.seconds_per_rate
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        workdir = Path(tmp)
        # The same ratio for every process: direct calls to an engine are new traces there, gateway
        # calls inherit the gateway's decision, so both paths record the same share of requests.
        ratio = [] if args.trace_sample_ratio is None else ["--trace-sample-ratio", str(args.trace_sample_ratio)]
        engines, gateway = start_stack(args.engines, workdir, [*args.engine_arg, *ratio], ratio)
        try:
            gateway_channel = grpc.aio.insecure_channel(gateway.address)
            engine_channels = [grpc.aio.insecure_channel(e.address) for e in engines]
            gateway_stub = chat_pb2_grpc.ChatServiceStub(gateway_channel)
            engine_stubs = [engine_pb2_grpc.EngineServiceStub(c) for c in engine_channels]
            await wait_all_engines_routable(gateway_stub, args.engines)
            # Warm both paths (connections, code paths) before measuring.
            await run_rate(50, 1.0, gateway_stub, engine_stubs, 1)
            rows = []
            print(
                f"{'rate/s':>7} {'sent/s':>7} {'direct p50':>10} {'p99':>7} {'gateway p50':>11} {'p99':>7} "
                f"{'added p50':>9} {'p99':>7} {'gw cpu ms/req':>13}  failures"
            )
            for rate in rates:
                row = await run_rate(rate, seconds, gateway_stub, engine_stubs, 1, gateway.process.pid)
                rows.append(row)
                print(
                    f"{rate:>7} {row['achieved_per_s']:>7.0f} {row['direct_ms_p50']:>10.2f} "
                    f"{row['direct_ms_p99']:>7.2f} {row['gateway_ms_p50']:>11.2f} {row['gateway_ms_p99']:>7.2f} "
                    f"{row['added_ms_p50']:>9.2f} {row['added_ms_p99']:>7.2f} "
                    f"{row.get('gateway_cpu_ms_per_request', float('nan')):>13.3f}  {row['failures']}",
                    flush=True,
                )
            skew = await run_skew(
                gateway_stub,
                [f"e{i}" for i in range(args.engines)],
                num_requests=300 if args.quick else 1500,
                concurrency=48,
                max_new_tokens=8 if args.quick else 16,
            )
            print(
                f"skewed workload (hottest dialogue {skew['hottest_dialogue_share']:.0%} of requests): "
                f"served {skew['requests_by_engine']} max/mean {skew['max_over_mean']:.2f}; "
                f"ring only {skew['ring_only_requests_by_engine']} max/mean {skew['ring_only_max_over_mean']:.2f}"
            )
            await gateway_channel.close()
            for c in engine_channels:
                await c.close()
        finally:
            gateway.stop()
            for e in engines:
                e.stop()
    target = next((r for r in rows if r["rate_per_s"] == TARGET_RATE), rows[-1])
    return {
        "added_latency_ms_p50": round(target["added_ms_p50"], 3),
        "added_latency_ms_p99": round(target["added_ms_p99"], 3),
        "requests_per_s": round(target["achieved_per_s"], 1),
        "direct_latency_ms_p50": round(target["direct_ms_p50"], 3),
        "direct_latency_ms_p99": round(target["direct_ms_p99"], 3),
        "gateway_latency_ms_p50": round(target["gateway_ms_p50"], 3),
        "gateway_latency_ms_p99": round(target["gateway_ms_p99"], 3),
        "gateway_cpu_ms_per_request": (
            round(target["gateway_cpu_ms_per_request"], 3) if "gateway_cpu_ms_per_request" in target else None
        ),
        "trace_sample_ratio": args.trace_sample_ratio,
        "num_engines": args.engines,
        "added_latency_ms_p99_by_rate": {str(r["rate_per_s"]): round(r["added_ms_p99"], 3) for r in rows},
        "direct_latency_ms_p99_by_rate": {str(r["rate_per_s"]): round(r["direct_ms_p99"], 3) for r in rows},
        "per_rate": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        "skew_max_over_mean": round(skew["max_over_mean"], 3),
        "skew_ring_only_max_over_mean": round(skew["ring_only_max_over_mean"], 3),
        "skew_requests_by_engine": skew["requests_by_engine"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="rates 50/100/250/500 for 3 s each, short skew run")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--seconds-per-rate", type=float, default=8.0)
    parser.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=None,
        help="--trace-sample-ratio of every process (default: the services' default, every trace)",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="extra flag for the engines, e.g. --engine-arg=--device=cuda (repeatable)",
    )
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
