"""Hostile requests: refused before any work, without slowing other tenants' requests.

Starts real processes on loopback: one engine (`--model`, default gemma-3-270m) and a gateway (the
development mode: no certificates). Kinds of hostile request, each just under the public message cap
(4 MiB) or as large as the issue that asked for this bench measured:

    messages      300,000 one-character messages (2.1 MB): their count alone cannot fit the context
    ids           one tokenized prompt of ~1.3 M ids (near the cap)
    message_ids   one dialogue message holding ~1.3 M ids
    text          one 2 MB text message: its byte length alone cannot fit

Pairs: an attacker process (its request serialized once, so its own CPU stays small) sends one
hostile request through the gateway at the moment this process sends a small request (a 4-token
prompt, 1 new token) of another tenant's kind; both are timed. `--pairs` pairs per kind. The baseline
is the same small requests with no attack, measured in the same run just before. `--flood` also
sends each kind back to back for a few seconds (no pause: far above any tenant's rate limit) while
small requests run, to show what a flood costs.

    python -m bench.hostile [--quick] [--model synthetic-tiny] [--flood]

Targets: a hostile request is refused in <= 50 ms, a concurrent small request's latency grows by
<= 20 ms. The last line is `RESULT {json}`: refusal_ms_p50/max per kind, small_request_ms_p50/p90
alone and alongside each kind, small_request_added_ms_p50 per kind, the gateway's and the engine's CPU
per pair next to their CPU per small request alone (Linux /proc, 10 ms ticks averaged over the pairs),
and flood_* figures with --flood.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.proc_stat import cpu_seconds
from salon.common.process import ServiceProcess, start_service

API_KEY = "bench-hostile-key-0123"
KINDS = ("messages", "ids", "message_ids", "text")
REFUSAL_TARGET_MS = 50.0
ADDED_TARGET_MS = 20.0
_GENERATE = "/salon.chat.v1.ChatService/Generate"


def hostile_request(kind: str) -> chat_pb2.GenerateRequest:
    """The request of one kind (see the module docstring)."""
    request = chat_pb2.GenerateRequest(conversation_id=f"hostile-{kind}")
    if kind == "messages":
        request.dialogue.messages.extend(chat_pb2.Message(role=chat_pb2.ROLE_USER, text="a") for _ in range(300_000))
    elif kind == "ids":
        request.tokens.token_ids.extend([262_000] * 1_300_000)  # 3-byte varints: 3.9 MB
    elif kind == "message_ids":
        request.dialogue.messages.add(role=chat_pb2.ROLE_USER, token_ids=[262_000] * 1_300_000)
    elif kind == "text":
        request.dialogue.messages.add(role=chat_pb2.ROLE_USER, text="sail " * 400_000)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return request


def small_request(i: int) -> chat_pb2.GenerateRequest:
    return chat_pb2.GenerateRequest(
        conversation_id=f"small-{i}",
        tokens=chat_pb2.TokenizedPrompt(token_ids=[2, 818, 5279, 529]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=1),
    )


def _metadata() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {API_KEY}"),)


def timed_small(stub, i: int) -> float:
    started = time.perf_counter()
    for event in stub.Generate(small_request(i), metadata=_metadata(), timeout=60):
        if event.HasField("final"):
            return (time.perf_counter() - started) * 1000
    raise RuntimeError("small request ended without a final")


def attack(address: str, kind: str, seconds: float | None) -> None:
    """The attacker process: with `seconds`, send `kind` back to back that long and print the refusal
    times (ms) as one JSON list; without, send one per line read from stdin and print each time."""
    payload = hostile_request(kind).SerializeToString()
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 8 << 20)]) as channel:
        call = channel.unary_stream(
            _GENERATE, request_serializer=lambda b: b, response_deserializer=chat_pb2.GenerateResponse.FromString
        )

        def once() -> float:
            started = time.perf_counter()
            try:
                list(call(payload, metadata=_metadata(), timeout=30))
                raise RuntimeError(f"hostile request {kind} was served")
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise RuntimeError(f"hostile request {kind}: {exc.code().name} {exc.details()}") from None
            return (time.perf_counter() - started) * 1000

        once()  # connect and warm up before the first measured request
        print("ready", flush=True)
        if seconds is None:
            for _ in sys.stdin:
                print(json.dumps(once()), flush=True)
            return
        times = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            times.append(once())
        print(json.dumps(times), flush=True)


def flood(stub, address: str, kind: str, alone: list[float], seconds: float = 4.0) -> dict:
    """Back-to-back hostile requests for `seconds` while small requests run one after another."""
    attacker = subprocess.Popen(
        [sys.executable, "-m", "bench.hostile", "--attack", address, "--kind", kind, "--attack-s", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert attacker.stdout.readline().strip() == "ready"
    during = []
    deadline = time.monotonic() + seconds - 0.5
    while time.monotonic() < deadline:
        during.append(timed_small(stub, 2000 + len(during)))
    refusals = json.loads(attacker.stdout.readline())
    if attacker.wait(60) != 0:
        raise RuntimeError(f"the {kind} flood failed")
    added = round(statistics.median(during) - statistics.median(alone), 2)
    print(
        f"flood {kind:<12} {len(refusals) / seconds:.0f} refusals/s, p50 {_p(refusals, 0.5)} ms; "
        f"small request p50 {_p(during, 0.5)} ms ({added:+} ms)",
        flush=True,
    )
    return {
        f"flood_refusals_per_s_{kind}": round(len(refusals) / seconds, 1),
        f"flood_refusal_ms_p50_{kind}": _p(refusals, 0.5),
        f"flood_small_request_added_ms_p50_{kind}": added,
    }


def start_stack(model: str, workdir: Path) -> tuple[ServiceProcess, ServiceProcess]:
    engine = start_service(
        "engine",
        ["--port", "0", "--model", model, "--engine-id", "e0", *INSECURE_LOOPBACK_FLAGS],
        log_path=workdir / "engine.log",
        timeout_s=1800,
    )
    tenants = workdir / "tenants.json"
    tenants.write_text(
        json.dumps({"tenants": [{"tenant_id": "bench", "api_key": API_KEY, "namespace_salt": "bench-hostile"}]})
    )
    gateway = start_service(
        "gateway",
        ["--port", "0", "--engines", f"e0={engine.address}", "--tenants-file", str(tenants), *INSECURE_LOOPBACK_FLAGS],
        log_path=workdir / "gateway.log",
        timeout_s=60,
    )
    return engine, gateway


def _cpu(*procs: ServiceProcess) -> list[float]:
    """CPU milliseconds each process has used so far (Linux /proc; nan elsewhere)."""
    out = []
    for proc in procs:
        cpu_s = cpu_seconds(proc.process.pid)
        out.append(float("nan") if cpu_s is None else cpu_s * 1000)
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 2)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        engine, gateway = start_stack(args.model, Path(tmp))
        try:
            with grpc.insecure_channel(gateway.address) as channel:
                stub = chat_pb2_grpc.ChatServiceStub(channel)
                for i in range(5):  # warm up the path (and the gateway's model info for the count bound)
                    timed_small(stub, i)
                cpu = _cpu(gateway, engine)
                alone = [timed_small(stub, i) for i in range(args.small_requests)]
                small_cpu = [(b - a) / len(alone) for a, b in zip(cpu, _cpu(gateway, engine))]
                result = {
                    "model": args.model,
                    "small_request_ms_p50_alone": _p(alone, 0.5),
                    "small_request_ms_p90_alone": _p(alone, 0.9),
                    "gateway_cpu_ms_per_small_request": round(small_cpu[0], 2),
                    "engine_cpu_ms_per_small_request": round(small_cpu[1], 2),
                }
                print(
                    f"small request alone: p50 {result['small_request_ms_p50_alone']} ms, "
                    f"p90 {result['small_request_ms_p90_alone']} ms",
                    flush=True,
                )
                for kind in args.kinds:
                    attacker = subprocess.Popen(
                        [sys.executable, "-m", "bench.hostile", "--attack", gateway.address, "--kind", kind],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    assert attacker.stdout.readline().strip() == "ready"
                    refusals, during = [], []
                    cpu = _cpu(gateway, engine)
                    for i in range(args.pairs):
                        attacker.stdin.write("go\n")
                        attacker.stdin.flush()
                        during.append(timed_small(stub, 1000 + i))  # sent as the hostile one arrives
                        refusals.append(float(attacker.stdout.readline()))
                    # CPU per pair (the hostile request and the small one); compare with the small
                    # request's own (measured alone) to see what the refusal cost.
                    spent = [(b - a) / args.pairs for a, b in zip(cpu, _cpu(gateway, engine))]
                    result[f"gateway_cpu_ms_per_pair_{kind}"] = round(spent[0], 2)
                    result[f"engine_cpu_ms_per_pair_{kind}"] = round(spent[1], 2)
                    attacker.stdin.close()
                    if attacker.wait(60) != 0:
                        raise RuntimeError(f"the {kind} attacker failed")
                    result[f"refusal_ms_p50_{kind}"] = _p(refusals, 0.5)
                    result[f"refusal_ms_max_{kind}"] = round(max(refusals), 2)
                    result[f"small_request_ms_p50_{kind}"] = _p(during, 0.5)
                    result[f"small_request_ms_p90_{kind}"] = _p(during, 0.9)
                    result[f"small_request_added_ms_p50_{kind}"] = round(
                        statistics.median(during) - statistics.median(alone), 2
                    )
                    print(
                        f"{kind:<12} refused in p50 {result[f'refusal_ms_p50_{kind}']} ms "
                        f"(max {result[f'refusal_ms_max_{kind}']} ms); the small request alongside: "
                        f"p50 {result[f'small_request_ms_p50_{kind}']} ms "
                        f"({result[f'small_request_added_ms_p50_{kind}']:+} ms); CPU per pair: gateway "
                        f"{result[f'gateway_cpu_ms_per_pair_{kind}']} ms (small alone "
                        f"{result['gateway_cpu_ms_per_small_request']}), engine "
                        f"{result[f'engine_cpu_ms_per_pair_{kind}']} ms (small alone "
                        f"{result['engine_cpu_ms_per_small_request']})",
                        flush=True,
                    )
                if args.flood:
                    for kind in args.kinds:
                        result.update(flood(stub, gateway.address, kind, alone))
        finally:
            gateway.stop()
            engine.stop()
    kinds = args.kinds
    result["refusal_ms_p50_worst"] = max(result[f"refusal_ms_p50_{k}"] for k in kinds)
    result["small_request_added_ms_p50_worst"] = max(result[f"small_request_added_ms_p50_{k}"] for k in kinds)
    result["refusal_target_ms"] = REFUSAL_TARGET_MS
    result["added_target_ms"] = ADDED_TARGET_MS
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="synthetic-tiny, 4 s per attack, fewer requests")
    parser.add_argument("--model", default=None, help="engine model (default gemma-3-270m; --quick: synthetic-tiny)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated kinds of {KINDS}")
    parser.add_argument("--pairs", type=int, default=None, help="hostile + small request pairs per kind (40; quick 15)")
    parser.add_argument("--small-requests", type=int, default=None, help="small requests of the baseline")
    parser.add_argument("--flood", action="store_true", help="also send each kind back to back for 4 s")
    parser.add_argument("--attack-s", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--attack", default=None, help=argparse.SUPPRESS)  # the attacker process: its target
    parser.add_argument("--kind", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        attack(args.attack, args.kind, args.attack_s)
        return
    args.model = args.model or ("synthetic-tiny" if args.quick else "gemma-3-270m")
    args.pairs = args.pairs or (15 if args.quick else 40)
    args.small_requests = args.small_requests or (15 if args.quick else 40)
    args.kinds = [k for k in args.kinds.split(",") if k]
    print("RESULT " + json.dumps(run(args)))


if __name__ == "__main__":
    main()
