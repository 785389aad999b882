"""The request body, read whole and bounded before any route sees it (a pure ASGI middleware).

    Content-Length over the cap           -> 413 at once, nothing read
    the body streams past the cap         -> 413 as soon as it does, the rest never read
    the body is not all there in time     -> 408 (a client dribbling its body holds no slot for long)
    otherwise                             -> the app gets the body as one message

So a route's `await request.body()` never waits on the client and never holds more than the cap, and
parsing (body_parse.py) starts only on a body known to be complete and small enough.
"""

from __future__ import annotations

import asyncio
import json

MAX_BODY_BYTES = 4 << 20


class BodyLimit:
    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = 60.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(send, 413, f"Content-Length {declared} is over the limit of {self.max_body_bytes} bytes")
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            await self._refuse(send, 408, f"the body did not arrive within {self.body_timeout_s:g} s")
            return
        if body is None:  # the client went away
            return
        if len(body) > self.max_body_bytes:
            await self._refuse(send, 413, f"more than the limit of {self.max_body_bytes} bytes")
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive) -> bytes | None:
        """The whole body, or the first chunks past the cap (the rest unread); None on disconnect."""
        chunks: list[bytes] = []
        num_bytes = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            num_bytes += len(chunk)
            if num_bytes > self.max_body_bytes or not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(send, status: int, message: str) -> None:
        code = "request_too_large" if status == 413 else "request_timeout"
        body = json.dumps(
            {"error": {"message": f"body: {message}", "type": "invalid_request_error", "param": "body", "code": code}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _replay(body: bytes, receive):
    """A receive that gives `body` once, then waits on the client (for its disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
