"""What the HTTP front adds to a turn, measured against the gRPC front on the same stack and moment.

Pairs of the same one-token turn (a short greedy prompt, cached after the first pair) go alternately
through the gateway's gRPC API and its OpenAI HTTP API, one at a time, so both see the same engine
and cache state. Each latency is client-side, from sending the request to the complete reply; the
added latency is the HTTP time minus the gRPC time of each pair (median and p99 of those).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.loadgen.report import percentile

_TEXT = "Hello! How are you today?"
_SYSTEM = "You are Ada."


async def measure(grpc_target: str, http_url: str, api_key: str, num_pairs: int = 40) -> dict:
    metadata = (("authorization", f"Bearer {api_key}"),)
    request = chat_pb2.GenerateRequest(
        conversation_id="http-overhead",
        character=chat_pb2.Character(definition=_SYSTEM),
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text=_TEXT)]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=1),
    )
    body = {
        "model": None,
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _TEXT}],
    }
    grpc_ms, http_ms = [], []
    async with (
        grpc.aio.insecure_channel(grpc_target) as channel,
        httpx.AsyncClient(base_url=http_url, headers={"authorization": f"Bearer {api_key}"}, timeout=60) as client,
    ):
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        models = await client.get("/v1/models")
        models.raise_for_status()
        body["model"] = models.json()["data"][0]["id"]
        for i in range(num_pairs + 2):  # the first two pairs warm connections and caches, unmeasured
            started = time.perf_counter()
            async for _event in stub.Generate(request, metadata=metadata, timeout=60):
                pass
            g = (time.perf_counter() - started) * 1000.0
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            h = (time.perf_counter() - started) * 1000.0
            response.raise_for_status()
            if i >= 2:
                grpc_ms.append(g)
                http_ms.append(h)
    added = [h - g for g, h in zip(grpc_ms, http_ms)]
    return {
        "num_pairs": num_pairs,
        "grpc_turn_ms_p50": percentile(grpc_ms, 50),
        "http_turn_ms_p50": percentile(http_ms, 50),
        "http_added_latency_ms_p50": percentile(added, 50),
        "http_added_latency_ms_p99": percentile(added, 99),
    }


def measure_sync(grpc_target: str, http_url: str, api_key: str, num_pairs: int = 40) -> dict:
    return asyncio.run(measure(grpc_target, http_url, api_key, num_pairs))
