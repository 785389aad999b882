"""The OpenAI transport: the gateway's /v1/chat/completions over HTTP (SSE), as a stateless client.

No conversation id is sent: the gateway routes each turn by the hash of the dialogue's opening
(salon/gateway/routing.py), which is what this transport measures. The character becomes the
system message, history messages go as text with the author as `name`. OpenAI messages carry text
only, so a reply generated in this run goes back as the text it was streamed as (remembered here by
its token ids); the engine maps that text back to the ids it generated. Token ids come with the
stream through vLLM's `return_token_ids` extension, so the driver times and counts tokens exactly
as over gRPC.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from salon.loadgen.dialogue import ChatMessage
from salon.loadgen.transport import ModelInfo, TokenDelta, TransportError, TurnRequest, TurnUsage
from salon.loadgen.workload import Role


class OpenAIHttpTransport:
    name = "salon-openai"

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str | None = None,
        request_timeout_s: float = 600.0,
        max_connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.request_timeout_s = request_timeout_s
        self._headers = {"authorization": f"Bearer {api_key}"}
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None
        # token ids of a reply (with and without its trailing stop token) -> the text it was streamed as
        self._reply_text: dict[tuple[int, ...], str] = {}

    async def __aenter__(self) -> OpenAIHttpTransport:
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, limits=self._limits, timeout=self.request_timeout_s
        )
        return self

    async def __aexit__(self, *exc) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def model_info(self) -> ModelInfo:
        response = await self._client.get("/v1/models")
        if response.status_code != 200:
            raise TransportError(f"HTTP {response.status_code}: {response.text}")
        entry = response.json()["data"][0]
        self.model = self.model or entry["id"]
        # EOS ids are not part of the OpenAI API; the driver strips them from replies, which a stateless
        # client never sees (the reply text has no stop token).
        return ModelInfo(entry["id"], entry["max_model_len"], frozenset())

    def _text_of(self, message: ChatMessage) -> str:
        if message.token_ids is None:
            return message.text or ""
        text = self._reply_text.get(tuple(message.token_ids))
        if text is None:
            raise TransportError(f"CLIENT: no text for a reply of {len(message.token_ids)} tokens")
        return text

    def prepare(self, turn: TurnRequest) -> dict:
        definition = (
            f"You are {turn.character_name}.\n{turn.character_definition}"
            if turn.character_name
            else turn.character_definition
        )
        messages = [{"role": "system", "content": definition}]
        for m in turn.messages:
            entry = {"role": "user" if m.role is Role.USER else "assistant", "content": self._text_of(m)}
            if m.role is Role.USER and m.author:
                entry["name"] = m.author
            messages.append(entry)
        body = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": turn.max_new_tokens,
            "temperature": turn.temperature,
            "return_token_ids": True,
        }
        if turn.top_p:
            body["top_p"] = turn.top_p
        if turn.seed is not None:
            body["seed"] = turn.seed
        return body

    async def generate(self, body: dict) -> AsyncIterator[TokenDelta | TurnUsage]:
        ids: list[int] = []
        text: list[str] = []
        usage = finish = engine_id = None
        try:
            async with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    raise TransportError(f"HTTP {response.status_code}: {(await response.aread()).decode()}")
                engine_id = response.headers.get("x-salon-engine-id", "")
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise TransportError(f"STREAM: {chunk['error'].get('message')}")
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk["choices"]:
                        new_ids = choice.get("token_ids") or []
                        text.append(choice.get("delta", {}).get("content") or "")
                        finish = choice.get("finish_reason") or finish
                        if new_ids:
                            ids.extend(new_ids)
                            yield TokenDelta(tuple(new_ids))
        except httpx.HTTPError as exc:
            raise TransportError(f"HTTP: {exc!r}") from exc
        if usage is None:
            raise TransportError("PROTOCOL: stream ended without usage")
        reply = "".join(text)
        self._reply_text[tuple(ids)] = reply
        self._reply_text[tuple(ids[:-1])] = reply  # the driver may strip the trailing stop token
        details = usage.get("prompt_tokens_details") or {}
        by_source = details.get("cached_tokens_by_source") or {}
        yield TurnUsage(
            prompt_tokens=usage["prompt_tokens"],
            cached_device_tokens=by_source.get("device", 0),
            cached_host_tokens=by_source.get("host", 0),
            generated_tokens=usage["completion_tokens"],
            engine_id=engine_id or "",
            finish_reason=finish or "",
        )
