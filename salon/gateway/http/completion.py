"""One completion being answered: its choices' events turned into an OpenAI response body or SSE chunks.

It owns what the request holds until it ends, however it ends (finished, failed, client gone): the
tenant's admission slot and the request's span. `close()` releases both, exactly once.

    chat.completion(.chunk)   choices[i].message / delta {role, content}, logprobs.content, finish_reason
                              with tools: message.tool_calls / delta.tool_calls (salon/gateway/tool_calls.py
                              parses the reply; per call one chunk with index, id, name and arguments "",
                              then its arguments in fragments as they are generated), finish_reason
                              "tool_calls" when a reply that stopped made calls
    text_completion           choices[i].text, legacy logprobs {tokens, token_logprobs, top_logprobs, text_offset}
    stream                    data: {chunk}\\n\\n ... [data: {usage chunk}] data: [DONE]\\n\\n
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

from opentelemetry.trace import Span, Status, StatusCode

from salon.api.chat.v1 import chat_pb2
from salon.common.errors import SalonError
from salon.gateway.genai_span import set_response_attributes
from salon.gateway.http import convert
from salon.gateway.http.choices import ChoiceEvent
from salon.gateway.http.errors import ApiError, from_salon_error
from salon.gateway.tool_calls import CallArguments, CallStart, ToolCallParser, new_call_id, parse_reply


class _Choice:
    def __init__(self, index: int):
        self.index = index
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.chat_logprobs: list[dict] = []
        self.completion_logprobs: list[dict] = []
        self.num_text_chars = 0
        self.final: chat_pb2.GenerateFinal | None = None
        # With tools: the stream's parser, and how many calls the reply made.
        self.parser: ToolCallParser | None = None
        self.num_calls = 0

    @property
    def finish_reason(self) -> str | None:
        if self.final is None:
            return None
        reason = convert.FINISH_REASONS.get(self.final.finish_reason, "stop")
        return "tool_calls" if reason == "stop" and self.num_calls else reason


class Completion:
    def __init__(
        self,
        *,
        kind: str,
        response_id: str,
        model: str,
        num_choices: int,
        events: AsyncIterator[ChoiceEvent],
        span: Span,
        release: Callable[[], None],
        logprobs: bool,
        include_usage: bool,
        arrived_s: float,
        return_token_ids: bool = False,
        choices_per_prompt: int = 1,
        echo: list[str] | None = None,
        tool_names: list[str] | None = None,
        parallel_tool_calls: bool = True,
        fields: dict[str, str] | None = None,
    ):
        self.kind = kind  # "chat" or "text_completion"
        self.response_id = response_id
        self.model = model
        self.created = int(time.time())
        self.choices = [_Choice(i) for i in range(num_choices)]
        self.events = events
        self.span = span
        self._release = release
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.arrived_s = arrived_s
        self.ttft_s: float | None = None
        self.return_token_ids = return_token_ids
        self.choices_per_prompt = choices_per_prompt
        # Per choice, the text echoed before its own (vLLM's echo): the prompt, or the last assistant message.
        self.echo = echo or [""] * num_choices
        # The tools whose calls the replies are parsed for (none: replies are text).
        self.tool_names = tool_names or []
        self.parallel_tool_calls = parallel_tool_calls
        # Engine fields -> the request's fields that gave them, for the engine's refusals (errors.from_salon_error).
        self.fields = fields
        self._closed = False

    # ---- events ----------------------------------------------------------------------------------
    async def next_event(self) -> ChoiceEvent | None:
        """The next event (recorded), None at the end; errors come as ApiError."""
        try:
            item = await self.events.__anext__()
        except StopAsyncIteration:
            return None
        except SalonError as exc:
            raise from_salon_error(exc, self.fields) from None
        choice = self.choices[item.index]
        event = item.event
        if event.HasField("final"):
            choice.final = event.final
        else:
            if self.ttft_s is None and event.delta.token_ids:
                self.ttft_s = time.perf_counter() - self.arrived_s
            choice.text.append(event.delta.text)
            choice.token_ids.extend(event.delta.token_ids)
            if self.logprobs:
                if self.kind == "chat":
                    choice.chat_logprobs.extend(convert.chat_logprobs(event.delta))
                else:
                    choice.completion_logprobs.append(convert.completion_logprobs(event.delta, choice.num_text_chars))
            choice.num_text_chars += len(event.delta.text)
        return item

    def usage(self) -> dict | None:
        finals = [c.final for c in self.choices if c.final is not None]
        return convert.usage(finals, self.choices_per_prompt) if len(finals) == len(self.choices) else None

    # ---- whole body ------------------------------------------------------------------------------
    async def body(self) -> dict:
        try:
            while await self.next_event() is not None:
                pass
            usage = self.usage()
            if usage is None:
                raise convert.api_error_for_missing_final()
            return {
                "id": self.response_id,
                "object": "chat.completion" if self.kind == "chat" else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [self._whole_choice(c) for c in self.choices],
                "usage": usage,
                "system_fingerprint": None,
            }
        finally:
            await self.close()

    def _whole_choice(self, c: _Choice) -> dict:
        out = self._whole_choice_fields(c)
        if self.return_token_ids:
            out["token_ids"] = c.token_ids
        return out

    def _whole_choice_fields(self, c: _Choice) -> dict:
        text = self.echo[c.index] + "".join(c.text)
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": text}
            if self.tool_names:
                reply = parse_reply("".join(c.text), self.tool_names, self.parallel_tool_calls)
                c.num_calls = len(reply.calls)
                message["content"] = self.echo[c.index] + reply.content if reply.content is not None else None
                if reply.calls:
                    message["tool_calls"] = [
                        {
                            "id": new_call_id(),
                            "type": "function",
                            "function": {"name": k.name, "arguments": k.arguments},
                        }
                        for k in reply.calls
                    ]
            return {
                "index": c.index,
                "message": message,
                "logprobs": {"content": c.chat_logprobs} if self.logprobs else None,
                "finish_reason": c.finish_reason,
            }
        logprobs = None
        if self.logprobs:
            logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            for part in c.completion_logprobs:
                for key in logprobs:
                    logprobs[key].extend(part[key] or [])
        return {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason}

    @property
    def engine_id(self) -> str:
        final = self.choices[0].final
        return final.engine_id if final is not None else ""

    # ---- stream ----------------------------------------------------------------------------------
    def _chunk(self, choices: list[dict], usage: dict | None = None, with_usage: bool = True) -> str:
        obj = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage and with_usage:
            obj["usage"] = usage
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

    def _delta_choice(self, index: int, delta: chat_pb2.TokenDelta | None, finish_reason: str | None) -> dict:
        out = self._delta_choice_fields(index, delta, finish_reason)
        if self.return_token_ids:
            out["token_ids"] = list(delta.token_ids) if delta is not None else []
        return out

    def _delta_choice_fields(self, index: int, delta: chat_pb2.TokenDelta | None, finish_reason: str | None) -> dict:
        if self.kind == "chat":
            logprobs = {"content": convert.chat_logprobs(delta)} if (self.logprobs and delta is not None) else None
            return {
                "index": index,
                "delta": {"content": delta.text} if delta is not None else {},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        logprobs = None
        if self.logprobs and delta is not None:
            logprobs = convert.completion_logprobs(delta, self.choices[index].num_text_chars - len(delta.text))
        return {
            "index": index,
            "text": delta.text if delta is not None else "",
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    def _echo_choice(self, index: int) -> dict:
        text = self.echo[index]
        if self.kind == "chat":
            return {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": None}

    async def first(self) -> ChoiceEvent | None:
        """The first event, read before the response starts (so errors get their HTTP status)."""
        try:
            return await self.next_event()
        except BaseException:
            await self.close()
            raise

    async def sse(self, first: ChoiceEvent | None) -> AsyncIterator[str]:
        try:
            if self.kind == "chat":
                for c in self.choices:
                    yield self._chunk(
                        [
                            {
                                "index": c.index,
                                # With tools the reply may be only calls: its content is null until text comes.
                                "delta": {"role": "assistant", "content": None if self.tool_names else ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
            for c in self.choices:
                if self.echo[c.index]:
                    yield self._chunk([self._echo_choice(c.index)])
            item = first
            while item is not None:
                if self.tool_names and self.kind == "chat":
                    for chunk in self._tool_chunks(item):
                        yield chunk
                elif item.event.HasField("final"):
                    yield self._chunk([self._delta_choice(item.index, None, self.choices[item.index].finish_reason)])
                else:
                    yield self._chunk([self._delta_choice(item.index, item.event.delta, None)])
                try:
                    item = await self.next_event()
                except ApiError as exc:
                    yield f"data: {json.dumps(exc.body())}\n\n"
                    return
            if self.include_usage:
                yield self._chunk([], self.usage())
            yield "data: [DONE]\n\n"
        finally:
            await self.close()

    def _tool_chunks(self, item: ChoiceEvent) -> list[str]:
        """The chunks of one event of a chat with tools: its text through the choice's parser (content, calls'
        heads and argument fragments, in order); the final event flushes the parser before the finish."""
        c = self.choices[item.index]
        if c.parser is None:
            c.parser = ToolCallParser(self.tool_names, self.parallel_tool_calls)
        final = item.event.HasField("final")
        delta = None if final else item.event.delta
        pieces = c.parser.finish() if final else c.parser.feed(delta.text)
        deltas: list[dict] = []
        for piece in pieces:
            if isinstance(piece, CallStart):
                c.num_calls += 1
                function = {"name": piece.name, "arguments": ""}
                head = {"index": piece.index, "id": new_call_id(), "type": "function", "function": function}
                deltas.append({"tool_calls": [head]})
            elif isinstance(piece, CallArguments):
                deltas.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]})
            else:
                deltas.append({"content": piece})
        if delta is not None and not deltas and (self.logprobs or self.return_token_ids):
            deltas.append({})  # the tokens' logprobs / ids still go out
        chunks = []
        for k, fields in enumerate(deltas):
            out = self._delta_choice(item.index, delta if k == 0 else None, None)
            out["delta"] = fields
            chunks.append(self._chunk([out]))
        if final:
            chunks.append(self._chunk([self._delta_choice(item.index, None, c.finish_reason)]))
        return chunks

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.events.aclose()
        finally:
            self._release()
            finals = [c.final for c in self.choices if c.final is not None]
            set_response_attributes(
                self.span,
                self.response_id,
                self.model,
                [c.finish_reason or "abort" for c in self.choices],
                finals,
                self.ttft_s,
            )
            if len(finals) != len(self.choices):
                self.span.set_status(Status(StatusCode.ERROR, "the completion did not finish"))
            self.span.end()
