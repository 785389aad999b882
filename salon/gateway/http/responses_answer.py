"""One response of the Responses API being answered: the completion's events as a Response object or
as the stream of typed events the OpenAI SDKs parse.

    whole     {id: "resp_…", object: "response", status, output: [message {output_text}], usage, …}
    stream    event: <type>\\ndata: {type, sequence_number, …}\\n\\n, in this order:
                response.created, response.in_progress            (the response, status in_progress)
                response.output_item.added                        (the message, no content yet)
                response.content_part.added                       (an empty output_text part)
                response.output_text.delta …                      (one per text delta)
                response.output_text.done, response.content_part.done, response.output_item.done
                response.completed | response.incomplete          (the whole response, with usage)
              an error mid-stream: `error`, then response.failed

    status    completed (end of turn, stop string), incomplete with incomplete_details.reason
              "max_output_tokens" (the budget or the context ran out)

`finish` is awaited with the finished Response and its reply text before the last event is sent (or the
body returned): the stored response exists when the client learns the response is complete.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from salon.gateway.http import convert
from salon.gateway.http.choices import ChoiceEvent
from salon.gateway.http.completion import Completion
from salon.gateway.http.errors import ApiError


def response_usage(chat_usage: dict) -> dict:
    """A chat completion's usage (convert.usage) in the Responses API's terms."""
    details = chat_usage["prompt_tokens_details"]
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": details["cached_tokens"],
            "cached_tokens_by_source": details["cached_tokens_by_source"],
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


class ResponseAnswer:
    def __init__(
        self,
        completion: Completion,
        echo: dict,
        finish: Callable[[dict, str], Awaitable[None]],
    ):
        """`echo`: the Response fields that repeat the request (model, instructions, sampling, ...)."""
        self.completion = completion
        self.response_id = completion.response_id
        self.item_id = "msg_" + completion.response_id.removeprefix("resp_")
        self.created_at = completion.created
        self.echo = echo
        self._finish = finish
        self._sequence_number = 0

    # ---- objects ---------------------------------------------------------------------------------
    def _response(self, status: str, output: list[dict], usage: dict | None, **fields) -> dict:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "output": output,
            "usage": usage,
            **self.echo,
            **fields,
        }

    def _part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, status: str, content: list[dict]) -> dict:
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def _text(self) -> str:
        return "".join(self.completion.choices[0].text)

    def _finished(self) -> dict:
        choice = self.completion.choices[0]
        usage = self.completion.usage()
        if usage is None:
            raise convert.api_error_for_missing_final()
        complete = choice.finish_reason == "stop"
        fields = {"completed_at": int(time.time())}
        if not complete:
            fields["incomplete_details"] = {"reason": "max_output_tokens"}
        status = "completed" if complete else "incomplete"
        return self._response(status, [self._item(status, [self._part(self._text())])], response_usage(usage), **fields)

    # ---- whole body ------------------------------------------------------------------------------
    async def body(self) -> dict:
        try:
            while await self.completion.next_event() is not None:
                pass
            response = self._finished()
        finally:
            await self.completion.close()
        await self._finish(response, self._text())
        return response

    # ---- stream ----------------------------------------------------------------------------------
    def _event(self, type_: str, **fields) -> str:
        obj = {"type": type_, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return f"event: {type_}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

    async def sse(self, first: ChoiceEvent | None) -> AsyncIterator[str]:
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        try:
            started = self._response("in_progress", [], None)
            yield self._event("response.created", response=started)
            yield self._event("response.in_progress", response=started)
            yield self._event("response.output_item.added", output_index=0, item=self._item("in_progress", []))
            yield self._event("response.content_part.added", **where, part=self._part(""))
            item = first
            try:
                while item is not None:
                    if not item.event.HasField("final") and item.event.delta.text:
                        delta = item.event.delta.text
                        yield self._event("response.output_text.delta", **where, delta=delta, logprobs=[])
                    item = await self.completion.next_event()
                await self.completion.close()
                response = self._finished()
            except ApiError as exc:
                yield self._event("error", code=exc.code, message=exc.message, param=exc.param)
                failed = self._response("failed", [], None, error={"code": "server_error", "message": exc.message})
                yield self._event("response.failed", response=failed)
                return
            text = self._text()
            yield self._event("response.output_text.done", **where, text=text, logprobs=[])
            yield self._event("response.content_part.done", **where, part=self._part(text))
            yield self._event("response.output_item.done", output_index=0, item=response["output"][0])
            await self._finish(response, text)
            last = "response.completed" if response["status"] == "completed" else "response.incomplete"
            yield self._event(last, response=response)
        finally:
            await self.completion.close()
