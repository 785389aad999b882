"""How long the gateway waits for an engine stream's next event before it fails the stream over.

A hung engine (stopped, its event loop blocked, its host cut off) keeps the connection open and sends
nothing; without these bounds its streams would wait for the client's deadline. Each read of an engine
stream is bounded (`StallTimeouts`):

    first event   waits while the engine is busy with other work, not while it is silent:
                    * the engine's load reports go stale (membership.py) -> give up at once
                      (`engine_silent`): a silent engine is hung, whatever its queue;
                    * else at most first_token_timeout_s, counted from the later of the attempt's
                      start and the engine's last load report with requests waiting in its queue
                      (`first_token`): a reply queued behind others waits for them without limit
                      as long as the engine keeps reporting, and its own prefill then gets the whole
                      timeout (a long prompt on a CPU takes tens of seconds);
    next event    at most inter_token_timeout_s after the previous one was handed on (`inter_token`).
                  Only the engine's silence counts: the clock starts when the gateway asks for the next
                  event, so a slow client (gRPC flow control holding the engine back) costs nothing.

A stream given up this way ends like one whose engine died (dispatch.py): the engine leaves the ring
until its health watch says SERVING again, and the reply resumes on another engine after the tokens
already sent. A 0 turns the bound off.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import grpc

from salon.gateway.membership import EngineHandle

FIRST_TOKEN_TIMEOUT_S = 60.0
INTER_TOKEN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class StallTimeouts:
    first_token_timeout_s: float = FIRST_TOKEN_TIMEOUT_S
    inter_token_timeout_s: float = INTER_TOKEN_TIMEOUT_S


class EngineStalled(Exception):
    """The engine sent nothing within its bound; `kind` is first_token, inter_token or engine_silent."""

    def __init__(self, kind: str, waited_s: float):
        super().__init__(f"stalled ({kind}): no event for {waited_s:.1f} s")
        self.kind = kind


async def first_event(call: grpc.aio.UnaryStreamCall, handle: EngineHandle, timeouts: StallTimeouts) -> Any:
    """The stream's first event (or grpc.aio.EOF); EngineStalled when the engine is silent or the
    first-token bound passes (see the module docstring)."""
    started_s = time.monotonic()
    if handle.silent.is_set():
        raise EngineStalled("engine_silent", 0.0)
    read = asyncio.ensure_future(call.read())
    silent = asyncio.ensure_future(handle.silent.wait())
    try:
        while True:
            timeout_s = None
            if timeouts.first_token_timeout_s > 0:
                deadline_s = max(started_s, handle.queue_seen_s) + timeouts.first_token_timeout_s
                timeout_s = deadline_s - time.monotonic()
                if timeout_s <= 0:
                    raise EngineStalled("first_token", time.monotonic() - started_s)
            done, _ = await asyncio.wait((read, silent), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if read in done:
                return read.result()
            if silent in done:
                raise EngineStalled("engine_silent", time.monotonic() - started_s)
            # The bound passed, or moved while we waited (a report showed a queue): look again.
    finally:
        silent.cancel()
        if not read.done():
            read.cancel()  # cancels the call too
        elif not read.cancelled():
            read.exception()  # an error that lost the race to a stall is not reported as unretrieved


async def next_event(call: grpc.aio.UnaryStreamCall, timeouts: StallTimeouts) -> Any:
    """The stream's next event (or grpc.aio.EOF); EngineStalled after inter_token_timeout_s of silence."""
    if timeouts.inter_token_timeout_s <= 0:
        return await call.read()
    try:
        async with asyncio.timeout(timeouts.inter_token_timeout_s):
            return await call.read()
    except TimeoutError:
        raise EngineStalled("inter_token", timeouts.inter_token_timeout_s) from None
