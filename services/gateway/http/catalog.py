"""Which models the stack serves, as the HTTP front sees them, and calls to any engine of a model.

Today every engine serves the one default model: the catalog asks an accepting engine for its
ModelInfo (cached for `ttl_s`) and `resolve` accepts exactly that model's id. When the gateway keeps
one engine pool per model, `resolve` returns the model's pool and the routes dispatch within it;
nothing else in the HTTP front changes.
"""

from __future__ import annotations

import time

import grpc

from salon.chat.v1 import chat_pb2
from salon.engine.v1 import engine_pb2
from services.common.errors import Unavailable
from services.gateway.http.errors import model_not_found
from services.gateway.membership import EngineHandle, EnginePool

_CALL_TIMEOUT_S = 5.0


class ModelCatalog:
    def __init__(self, pool: EnginePool, ttl_s: float = 30.0):
        self.pool = pool
        self.ttl_s = ttl_s
        self._info: chat_pb2.ModelInfo | None = None
        self._expires_s = 0.0
        self.created_unix_s = int(time.time())

    def accepting_handles(self) -> list[EngineHandle]:
        """Accepting engines, least loaded first."""
        handles = [h for h in self.pool.handles() if h.accepting]
        return sorted(handles, key=lambda h: h.num_inflight)

    async def models(self) -> list[chat_pb2.ModelInfo]:
        """The served models (Unavailable when no engine can say)."""
        if self._info is not None and time.monotonic() < self._expires_s:
            return [self._info]
        last_error = "no engine is serving"
        for handle in self.accepting_handles():
            try:
                response = await handle.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=_CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                last_error = f"engine {handle.engine_id}: {exc.code().name}"
                continue
            self._info, self._expires_s = response.model, time.monotonic() + self.ttl_s
            return [self._info]
        if self._info is not None:
            return [self._info]  # stale beats nothing while engines come back
        raise Unavailable(f"no model information: {last_error}")

    async def resolve(self, model: str | None) -> chat_pb2.ModelInfo:
        """The served model named `model` (None: the default); 404 for any other name."""
        served = await self.models()
        if model is None:
            return served[0]
        for info in served:
            if info.model_id == model:
                return info
        raise model_not_found(model, [m.model_id for m in served])

    async def call_any(self, method: str, request):
        """Call a unary EngineService method on the least loaded accepting engine (the next on failure)."""
        last: grpc.aio.AioRpcError | None = None
        for handle in self.accepting_handles():
            try:
                return await getattr(handle.stub, method)(request, timeout=_CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                last = exc
        raise Unavailable(f"{method}: no engine is serving" + (f" ({last.details()})" if last else ""))
