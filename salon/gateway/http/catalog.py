"""Which models the stack serves, as the HTTP front sees them, and calls to an engine of a model.

The same per-model pools as the gRPC API (salon/gateway/model_pools.py): /v1/models lists every served
model, `resolve` maps a body's `model` to its ModelInfo (None: the default model; 404 naming the served
models for any other name), and the routes dispatch within that model's pool.
"""

from __future__ import annotations

import time

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.common.errors import NotFound, Unavailable
from salon.gateway.http.errors import model_not_found
from salon.gateway.membership import EngineHandle
from salon.gateway.model_pools import ModelPools

_CALL_TIMEOUT_S = 5.0


class ModelCatalog:
    def __init__(self, pools: ModelPools):
        self.pools = pools
        self.pool = pools.pool
        self.created_unix_s = int(time.time())

    def accepting_handles(self, model: str | None = None) -> list[EngineHandle]:
        """Accepting engines (of `model`, or of any model), least loaded first."""
        handles = self.pool.handles() if model is None else self.pools.handles(model)
        return sorted((h for h in handles if h.accepting), key=lambda h: h.num_inflight)

    async def models(self) -> list[chat_pb2.ModelInfo]:
        """Every served model (Unavailable when none can say)."""
        out = []
        for model in self.pools.models():
            try:
                out.append(await self.pools.info(model))
            except Unavailable:
                continue
        if not out:
            raise Unavailable("no model information: no engine is serving")
        return out

    async def resolve(self, model: str | None) -> chat_pb2.ModelInfo:
        """The served model named `model` (None: the default); 404 for any other name."""
        try:
            model_id = self.pools.resolve(model or "")
        except NotFound:
            raise model_not_found(model or "", self.pools.models()) from None
        return await self.pools.info(model_id)

    async def call_any(self, method: str, request, model: str):
        """Call a unary EngineService method on the least loaded accepting engine of `model` (the next on failure)."""
        last: grpc.aio.AioRpcError | None = None
        for handle in self.accepting_handles(model):
            try:
                return await getattr(handle.stub, method)(request, timeout=_CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                last = exc
        raise Unavailable(f"{method}: no engine of {model} is serving" + (f" ({last.details()})" if last else ""))
