"""One engine pool per served model, over the gateway's one set of engine channels (membership.py).

An engine joins the pool of the model its LoadReports name (`LoadReport.model_id`); until its first
report it is in no pool. Each pool routes with its own policy instance (its own ring, sticky and
bounded-load within the pool, routing.py), so two models never share or spill onto each other's
engines.

    request.model ── "" ──> the default model: --default-model when it is served, else the model of the
         │                  first configured engine that reports one, else the first served id
         ├── served ──> that model's pool
         └── other ───> NOT_FOUND naming the served models (UNAVAILABLE while some engine has not yet
                        said which model it serves: it may be that one)

ModelInfo (context length, vocabulary, architecture, ...) is asked of an accepting engine of the
model and kept for `info_ttl_s`; a stale answer is kept while no engine of the model answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.common.errors import NotFound, Unavailable
from salon.gateway.membership import EngineHandle, EnginePool
from salon.gateway.routing import EngineLoad, RoutingPolicy
from salon.gateway.types import EngineId

_INFO_TIMEOUT_S = 5.0


class ModelPools:
    def __init__(
        self,
        pool: EnginePool,
        make_policy: Callable[[], RoutingPolicy],
        default_model: str = "",
        info_ttl_s: float = 30.0,
    ) -> None:
        self.pool = pool
        self._make_policy = make_policy
        self._policies: dict[str, RoutingPolicy] = {}
        self.configured_default = default_model
        self.info_ttl_s = info_ttl_s
        self._info: dict[str, tuple[chat_pb2.ModelInfo, float]] = {}
        self._refresh: dict[str, asyncio.Task] = {}

    # -- membership

    def models(self) -> list[str]:
        """Ids of the models some known engine serves (reported), sorted."""
        return sorted({h.report.model_id for h in self.pool.handles() if h.report is not None and h.report.model_id})

    def default_model(self) -> str | None:
        """The configured default (served or not: requests for it wait for its engines like any named model),
        else the model of the first configured engine that has reported; None before any has."""
        if self.configured_default:
            return self.configured_default
        served = self.models()
        if not served:
            return None
        for handle in self.pool.handles():  # in the order the engines were configured
            if handle.report is not None and handle.report.model_id:
                return handle.report.model_id
        return served[0]

    def resolve(self, model: str) -> str:
        """The served model a request names ("" = the default); NotFound naming the served ones otherwise."""
        served = self.models()
        if not model:
            model = self.default_model()
            if model is None:
                raise Unavailable("no engine has reported its model yet; retry shortly")
        if model not in served:
            if any(h.report is None or not h.report.model_id for h in self.pool.handles()) or not served:
                # Some engine has not said what it serves (loading, or unreachable): it may be this model.
                raise Unavailable(
                    f"model: {model!r} is not served by any engine that has reported "
                    f"(served: {', '.join(served) or 'none yet'}); others are not serving"
                )
            raise NotFound(f"model: {model!r} is not served here (served: {', '.join(served) or 'none yet'})")
        return model

    def handles(self, model: str) -> list[EngineHandle]:
        return [h for h in self.pool.handles() if h.report is not None and h.report.model_id == model]

    def snapshot(self, model: str) -> dict[EngineId, EngineLoad]:
        """Loads of the model's engines (as EnginePool.snapshot, within the pool)."""
        loads: dict[EngineId, EngineLoad] = {}
        for handle in self.handles(model):
            if handle.engine_id is None:
                continue
            current = loads.get(handle.engine_id)
            if current is None or (handle.accepting and not current.accepting):
                loads[handle.engine_id] = handle.load()
        return loads

    def policy(self, model: str) -> RoutingPolicy:
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = self._make_policy()
        return policy

    # -- model information

    def cached_info(self, model: str) -> chat_pb2.ModelInfo | None:
        """The model's last known ModelInfo (refreshed in the background when stale); None until known."""
        entry = self._info.get(model)
        if entry is None or time.monotonic() >= entry[1]:
            self._refresh_later(model)
        return entry[0] if entry is not None else None

    async def info(self, model: str) -> chat_pb2.ModelInfo:
        entry = self._info.get(model)
        if entry is not None and time.monotonic() < entry[1]:
            return entry[0]
        try:
            return await self._fetch(model)
        except Unavailable:
            if entry is not None:
                return entry[0]  # stale beats nothing while engines come back
            raise

    async def _fetch(self, model: str) -> chat_pb2.ModelInfo:
        last_error = "no engine of it is serving"
        for handle in sorted(self.handles(model), key=lambda h: (not h.accepting, h.num_inflight)):
            if not handle.accepting:
                break
            try:
                response = await handle.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=_INFO_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                last_error = f"engine {handle.engine_id}: {exc.code().name}"
                continue
            self._info[model] = (response.model, time.monotonic() + self.info_ttl_s)
            return response.model
        raise Unavailable(f"model {model}: {last_error}")

    def _refresh_later(self, model: str) -> None:
        task = self._refresh.get(model)
        if task is not None and not task.done():
            return

        async def refresh() -> None:
            try:
                await self._fetch(model)
            except Unavailable:
                pass

        # A fresh context: this runs for the gateway, not inside the request's trace or log fields.
        self._refresh[model] = asyncio.get_running_loop().create_task(
            refresh(), name=f"model-info:{model}", context=contextvars.Context()
        )

    async def list_models(self) -> chat_pb2.ListModelsResponse:
        """Every served model with its engines and their resident memory."""
        out = chat_pb2.ListModelsResponse(default_model_id=self.default_model() or "")
        for model in self.models():
            try:
                info = await self.info(model)
            except Unavailable:
                info = chat_pb2.ModelInfo(model_id=model)  # its engines are not serving: listed, undescribed
            served = out.models.add(model=info)
            for handle in sorted(self.handles(model), key=lambda h: h.engine_id or ""):
                served.engines.add(
                    engine_id=handle.engine_id or "", serving=handle.accepting, resident=handle.report.resident
                )
        return out
