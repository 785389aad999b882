"""kvstore benchmark: match latency with 10,000 stored dialogues, fetch/put throughput vs memcpy.

    python -m bench.kvstore [--quick]

1. Match latency (the store's own work: KVStore.match, in process) for 1k, 8k and 32k-token contexts
   (stored history + a new 20-token message) while 10,000 dialogues are stored: 100 characters
   with 512-token definitions, each dialogue a character plus its own history.
2. Fetch and put throughput of one 32k-token context with the default model's sizes (Gemma 3 270M:
   24,960 B global + 124,800 B local KV per 16-token block; local KV for the last 40 blocks) against
   a real kvstore process on loopback, through KVStoreClient: over gRPC and over shared memory.
   Baseline in the same run: a plain numpy copy of the same number of bytes. Also Match over gRPC.
Ends with `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.kvstore_contract.client import KVStoreClient
from salon.common.kvstore_contract.layout import KVLayout
from salon.common.prefix_hash import encode_token_ids, namespace_digest
from salon.kvstore.arena import Arena
from salon.kvstore.radix_tree import RadixTree
from salon.kvstore.store import KVStore

REPO_ROOT = Path(__file__).resolve().parents[1]
GEMMA = KVLayout(16, 3 * 16 * 520, 15 * 16 * 520, 512)
TINY = KVLayout(16, 64, 0, 0)  # match latency does not depend on payload size
VOCAB = 262144


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_match(num_dialogues: int, history_tokens_mean: int, num_queries: int) -> dict:
    rng = random.Random(0)
    ns = namespace_digest("gemma-3-270m", "bench", "tenant")
    characters = [[rng.randrange(VOCAB) for _ in range(512)] for _ in range(100)]
    num_nodes_est = num_dialogues * (history_tokens_mean // 16 + 2) + 3 * 2048 * 4
    with tempfile.TemporaryDirectory() as tmp:
        capacity = num_nodes_est * 64 * 2
        store = KVStore(RadixTree(capacity), Arena(tmp, capacity), lease_ttl_s=30)
        payload = bytes(64)
        t0 = time.perf_counter()

        def put(tokens: list[int]) -> None:
            session = store.begin_put(ns, TINY, encode_token_ids(tokens), "")
            for i in range(len(tokens) // 16):
                session.add_block(i, payload, None)
            session.close()

        for d in range(num_dialogues):
            history = [rng.randrange(VOCAB) for _ in range(max(16, int(rng.expovariate(1 / history_tokens_mean))))]
            put(characters[d % 100] + history)
        long_contexts = {}
        for size in (1024, 8192, 32768):
            contexts = []
            for j in range(4):
                ctx = characters[j] + [rng.randrange(VOCAB) for _ in range(size - 512 - 20)]
                put(ctx)
                contexts.append(ctx + [rng.randrange(VOCAB) for _ in range(20)])  # + the new message
            long_contexts[size] = contexts
        build_s = time.perf_counter() - t0
        out = {"num_dialogues": num_dialogues, "num_blocks_stored": store.tree.num_blocks, "build_s": round(build_s, 2)}
        for size, contexts in long_contexts.items():
            encoded = [encode_token_ids(c) for c in contexts]
            times, cpu_times = [], []
            for q in range(num_queries):
                tb = encoded[q % len(encoded)]
                t, c = time.perf_counter(), time.thread_time()
                result = store.match(ns, TINY, tb)
                cpu_times.append((time.thread_time() - c) * 1000)
                times.append((time.perf_counter() - t) * 1000)
                assert result.usable_tokens == (len(tb) // 4 - 20) // 16 * 16, result
            label = f"{size // 1024}k"
            out[f"match_ms_p50_{label}"] = round(statistics.median(times), 4)
            out[f"match_ms_p99_{label}"] = round(percentile(times, 0.99), 4)
            # CPU time of the same calls: the store's own work, without time the OS gave other processes
            out[f"match_cpu_ms_p99_{label}"] = round(percentile(cpu_times, 0.99), 4)
            # the client's side of a match: encoding the ids (the engine may keep them encoded)
            t = time.perf_counter()
            for _ in range(20):
                encode_token_ids(contexts[0])
            out[f"encode_ms_{label}"] = round((time.perf_counter() - t) / 20 * 1000, 4)
        store.close()
        store.arena.close()
    return out


def start_kvstore(shm_dir: str, capacity_bytes: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "salon.kvstore",
            "--port",
            "0",
            "--capacity-bytes",
            str(capacity_bytes),
            "--shm-dir",
            shm_dir,
            "--log-json",
            "true",
            *INSECURE_LOOPBACK_FLAGS,
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("LISTENING kvstore"):
            return proc, f"127.0.0.1:{int(line.split('port=')[1].split()[0])}"
    raise RuntimeError("kvstore did not start")


def memcpy_gb_per_s(num_bytes: int, repeats: int) -> float:
    src = np.random.default_rng(0).integers(0, 256, num_bytes, np.uint8)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return num_bytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


async def bench_transfer(context_tokens: int, repeats: int) -> dict:
    rng = np.random.default_rng(1)
    num_blocks = context_tokens // 16
    local_blocks = 40
    ctx = encode_token_ids(rng.integers(0, VOCAB, context_tokens + 20).tolist())  # engines pass ids encoded once
    global_kv = rng.integers(0, 256, (num_blocks, GEMMA.global_bytes_per_block), np.uint8)
    local_kv = rng.integers(0, 256, (local_blocks, GEMMA.local_bytes_per_block), np.uint8)
    total_bytes = global_kv.nbytes + local_kv.nbytes
    capacity = total_bytes * (repeats + 3)
    out = {"transfer_context_tokens": context_tokens, "transfer_bytes": total_bytes}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as shm_dir:
        proc, target = start_kvstore(shm_dir, capacity)
        try:
            shm_client = KVStoreClient(target, True, timeout_s=60, arena_dir=shm_dir)
            assert await shm_client.map_arena(), "the kvstore's arena could not be mapped"
            clients = {"grpc": KVStoreClient(target, timeout_s=60), "shm": shm_client}
            for name, client in clients.items():
                times = []
                for r in range(repeats):
                    ns = f"{name}-{r}".encode().ljust(32, b"\0")  # a fresh namespace: every block is new
                    t = time.perf_counter()
                    result = await client.put(
                        ns, ctx, GEMMA, global_kv, local_kv, local_first_block=num_blocks - local_blocks
                    )
                    times.append(time.perf_counter() - t)
                    assert result is not None and result.stored_blocks == num_blocks, result
                out[f"put_gb_per_s_{name}"] = round(total_bytes / min(times) / 1e9, 3)
            ns = f"shm-{repeats - 1}".encode().ljust(32, b"\0")  # the latest put: never evicted yet
            # Into buffers the engine reuses (as the memcpy baseline's destination is), and into fresh
            # arrays (first-touch page faults included).
            out_global, out_local = np.zeros_like(global_kv), np.zeros_like(local_kv)
            for name, client in clients.items():
                for mode, buffers in (("", (out_global, out_local)), ("_fresh", (None, None))):
                    times = []
                    for _ in range(repeats * 4):
                        t = time.perf_counter()
                        result = await client.fetch(ns, ctx, GEMMA, out_global=buffers[0], out_local=buffers[1])
                        times.append(time.perf_counter() - t)
                        assert result.num_tokens == context_tokens
                    np.testing.assert_array_equal(result.global_kv, global_kv)
                    np.testing.assert_array_equal(result.local_kv, local_kv[-len(result.local_kv) :])
                    out[f"fetch_gb_per_s_{name}{mode}"] = round(total_bytes / min(times) / 1e9, 3)
                    out[f"fetch_ms_{name}{mode}"] = round(min(times) * 1000, 2)
            times = []
            for _ in range(repeats * 20):
                t = time.perf_counter()
                await clients["grpc"].match(ns, ctx, GEMMA)
                times.append((time.perf_counter() - t) * 1000)
            out["match_grpc_ms_p50_32k" if context_tokens == 32768 else "match_grpc_ms_p50"] = round(
                statistics.median(times), 3
            )
            out["match_grpc_ms_p99_32k" if context_tokens == 32768 else "match_grpc_ms_p99"] = round(
                percentile(times, 0.99), 3
            )
            for client in clients.values():
                await client.close()
        finally:
            proc.terminate()
            proc.wait(30)
    out["memcpy_gb_per_s"] = round(memcpy_gb_per_s(total_bytes, max(5, repeats)), 3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter histories and fewer repeats (~1 minute)")
    args = parser.parse_args(argv)
    history_mean = 256 if args.quick else 1024
    match = bench_match(10_000, history_mean, 200 if args.quick else 1000)
    print(
        f"match: {match['num_dialogues']} dialogues, {match['num_blocks_stored']} blocks stored (built in "
        f"{match['build_s']} s)"
    )
    for label in ("1k", "8k", "32k"):
        print(
            f"  {label:>3} tokens: p50 {match[f'match_ms_p50_{label}']:.3f} ms  p99 "
            f"{match[f'match_ms_p99_{label}']:.3f} ms"
            f"  (CPU-time p99 {match[f'match_cpu_ms_p99_{label}']:.3f} ms)"
            f"  (client-side id encoding {match[f'encode_ms_{label}']:.3f} ms)"
        )
    transfer = asyncio.run(bench_transfer(32768, 3 if args.quick else 8))
    mb = transfer["transfer_bytes"] / 1e6
    print(f"transfer: one 32k-token context, {mb:.1f} MB (global KV of 2048 blocks + local KV of 40)")
    print(f"  memcpy baseline   {transfer['memcpy_gb_per_s']:.2f} GB/s")
    for name in ("grpc", "shm"):
        print(
            f"  {name:>4}: fetch {transfer[f'fetch_gb_per_s_{name}']:.2f} GB/s ({transfer[f'fetch_ms_{name}']} ms)"
            f"  into fresh arrays {transfer[f'fetch_gb_per_s_{name}_fresh']:.2f} GB/s"
            f"  put {transfer[f'put_gb_per_s_{name}']:.2f} GB/s"
        )
    print(
        f"  Match over gRPC (32k tokens): p50 {transfer['match_grpc_ms_p50_32k']} ms  p99 "
        f"{transfer['match_grpc_ms_p99_32k']} ms"
    )
    result = {**match, **transfer}
    result["shm_fetch_fraction_of_memcpy"] = round(transfer["fetch_gb_per_s_shm"] / transfer["memcpy_gb_per_s"], 3)
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
