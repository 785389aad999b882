"""The n choices of one completion, run through the dispatcher and merged into one event stream.

    choice 0 ──dispatcher.stream──▶ engine E ──▶ first token: its prompt is computed
    choice i ──(after that) ───────▶ engine E, prefill_from_request_id = choice 0's id, seed + i
                                     (same conversation id: the session table sends it to E; E copies
                                      choice 0's prompt KV instead of computing it again)

Each choice runs in its own task, created with the request's context (trace span, log fields), and
hands its events over a small bounded queue, so a slow client still slows the engine streams. Closing
the merged stream (client gone, error) cancels every task: each one's dispatcher generator then
cancels its engine call, which aborts the engine's work and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.gateway.dispatch import Dispatcher
from salon.gateway.types import TenantId

_QUEUE_EVENTS = 16


@dataclass(frozen=True)
class ChoiceEvent:
    index: int
    event: chat_pb2.GenerateResponse


class _Done:
    def __init__(self, index: int, error: BaseException | None):
        self.index = index
        self.error = error


def choice_request(base: engine_pb2.GenerateRequest, index: int) -> engine_pb2.GenerateRequest:
    """Choice `index` of the completion `base` describes (choice 0 is `base` itself)."""
    if index == 0:
        return base
    request = engine_pb2.GenerateRequest()
    request.CopyFrom(base)
    request.request_id = f"{base.request_id}-{index}"
    request.prefill_from_request_id = base.request_id
    if base.sampling.HasField("seed"):
        request.sampling.seed = (base.sampling.seed + index) % (1 << 64)
    return request


async def run_choices(
    dispatcher: Dispatcher,
    bases: list[engine_pb2.GenerateRequest],
    n: int,
    tenant_id: TenantId,
    deadline_s: float | None,
    arrived_s: float,
    context: contextvars.Context,
    model: str = "",
) -> AsyncIterator[ChoiceEvent]:
    """Every choice's events, tagged with the choice's index; raises the first choice error. Each of `bases`
    (the prompts of a completion) has n choices: choice i of prompt p has index p * n + i (vLLM's)."""
    queue: asyncio.Queue[ChoiceEvent | _Done] = asyncio.Queue(maxsize=_QUEUE_EVENTS)
    computed = [asyncio.Event() for _ in bases]

    async def pump(p: int, i: int) -> None:
        base, prompt_computed, index = bases[p], computed[p], p * n + i
        error: BaseException | None = None
        try:
            if i > 0:
                await prompt_computed.wait()
            request = choice_request(base, i)
            async with contextlib.aclosing(
                dispatcher.stream(request, tenant_id, deadline_s, arrived_s, model)
            ) as events:
                async for event in events:
                    if i == 0 and not prompt_computed.is_set() and (event.HasField("final") or event.delta.token_ids):
                        prompt_computed.set()
                    await queue.put(ChoiceEvent(index, event))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the reader, which raises it
            error = exc
        finally:
            if i == 0:
                prompt_computed.set()  # the others run anyway (without a copy) if choice 0 failed
        await queue.put(_Done(index, error))

    tasks = [asyncio.create_task(pump(p, i), context=context.copy()) for p in range(len(bases)) for i in range(n)]
    try:
        num_done = 0
        while num_done < len(tasks):
            item = await queue.get()
            if isinstance(item, _Done):
                num_done += 1
                if item.error is not None:
                    raise item.error
                continue
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
