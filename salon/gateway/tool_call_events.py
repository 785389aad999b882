"""The Generate stream of a request with tools, as the gRPC API answers it: each delta's text read by the reply's
tool-call parser (tool_calls.py, as for HTTP) into TokenDelta.content and TokenDelta.tool_calls, the parser's
held text flushed in one more delta before the final, and the final with the whole calls (GenerateFinal.
tool_calls) and FINISH_REASON_TOOL_CALLS when a reply that stopped made calls."""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.gateway.tool_calls import CallArguments, CallStart, Piece, ToolCallParser, new_call_id
from salon.gateway.tool_choice import ToolReplies

_STOPPED = (chat_pb2.FINISH_REASON_STOP_TOKEN, chat_pb2.FINISH_REASON_STOP_STRING)


class ToolCallEvents:
    """One reply's events in, the same events with its content and calls out."""

    def __init__(self, replies: ToolReplies) -> None:
        self.parser = ToolCallParser(replies.tool_names, replies.parallel_tool_calls)
        self.calls: list[chat_pb2.ToolCall] = []

    def events(self, event: chat_pb2.GenerateResponse) -> list[chat_pb2.GenerateResponse]:
        if not event.HasField("final"):
            self._fill(event.delta, self.parser.feed(event.delta.text))
            return [event]
        out = []
        held = self.parser.finish()
        if held:
            flush = chat_pb2.GenerateResponse(delta=chat_pb2.TokenDelta())
            self._fill(flush.delta, held)
            out.append(flush)
        event.final.tool_calls.extend(self.calls)
        if self.calls and event.final.finish_reason in _STOPPED:
            event.final.finish_reason = chat_pb2.FINISH_REASON_TOOL_CALLS
        out.append(event)
        return out

    def _fill(self, delta: chat_pb2.TokenDelta, pieces: list[Piece]) -> None:
        delta.content = "".join(p for p in pieces if isinstance(p, str))
        for p in pieces:
            if isinstance(p, CallStart):
                call = chat_pb2.ToolCall(id=new_call_id(), name=p.name)
                self.calls.append(call)
                delta.tool_calls.add(index=p.index, id=call.id, name=p.name)
            elif isinstance(p, CallArguments):
                self.calls[p.index].arguments_json += p.text
                delta.tool_calls.add(index=p.index, arguments_json=p.text)
