"""What operators and their tools ask of the HTTP port, none of it authenticated (as in vLLM):

    GET /ready         200 {"models": [...]} while some served model has an engine in its ring, else 503
    GET /version       {"version": "<the salon package's version>"}
    GET /metrics       the gateway's Prometheus registry, less the series that name tenants
    GET /openapi.json  FastAPI's schema of the API (app.py)

/metrics shows this gateway only: each engine serves its own `vllm:*` series on its metrics port
(docs/metrics.md says why they are not aggregated here). Series with a `tenant` label are left out:
the API port faces every tenant, and one tenant must not learn another's name or traffic; they stay
on the metrics port, which only the monitoring namespace reaches.
"""

from __future__ import annotations

import asyncio
import importlib.metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

router = APIRouter()

TENANT_LABEL = "tenant"
VERSION = importlib.metadata.version("salon")


class _WithoutTenants:
    """The default registry's families, less those whose samples carry a tenant label."""

    def collect(self):
        for family in REGISTRY.collect():
            if not any(TENANT_LABEL in sample.labels for sample in family.samples):
                yield family


_PUBLIC_REGISTRY = _WithoutTenants()


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics() -> Response:
    # Off the event loop: rendering grows with the series (engines x models x buckets).
    body = await asyncio.to_thread(generate_latest, _PUBLIC_REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/ready")
async def ready(request: Request) -> Response:
    pools = request.app.state.front.catalog.pools
    models = [model for model in pools.models() if any(h.routable for h in pools.handles(model))]
    if models:
        return JSONResponse({"models": models})
    return JSONResponse(
        {
            "error": {
                "message": "not ready: no served model has an engine in its ring",
                "type": "service_unavailable",
                "param": None,
                "code": "no_engine",
            }
        },
        status_code=503,
    )


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": VERSION}
