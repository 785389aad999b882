"""The HTTP port's probes, unauthenticated as in vLLM: /ready (200 naming the served models while one
has an engine in its ring, 503 otherwise), /version, and FastAPI's /openapi.json."""

from __future__ import annotations

import importlib.metadata

import httpx
import pytest

from tests.hardening.hardening_stack import start_gateway, stop_all
from tests.openai.openai_stack import MODEL, start_stack, stop_stack


class _Dead:
    """An engine address nothing listens on."""

    address = "127.0.0.1:9"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = start_stack(tmp_path_factory.mktemp("probes"), num_engines=1)
    yield stack
    stop_stack(stack)


@pytest.fixture(scope="module")
def dead_url(stack, tmp_path_factory):
    """A gateway whose only engine is gone."""
    tmp = tmp_path_factory.mktemp("probes-dead")
    dead = start_gateway(
        {"e9": _Dead()}, stack.tenants_path, tmp, name="gw-dead", extra=["--http-port", "0"], wait=False
    )
    yield f"http://127.0.0.1:{dead.extra_ports['http_port']}"
    stop_all([dead])


def test_ready_names_the_served_models(stack):
    response = httpx.get(f"{stack.http_url}/ready")
    assert response.status_code == 200 and response.json() == {"models": [MODEL]}


def test_not_ready_without_an_engine(dead_url):
    assert httpx.get(f"{dead_url}/version").status_code == 200  # the gateway answers
    response = httpx.get(f"{dead_url}/ready")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_engine"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_version_is_the_package_version(stack):
    response = httpx.get(f"{stack.http_url}/version")
    assert response.status_code == 200 and response.json() == {"version": importlib.metadata.version("salon")}


def test_openapi_schema_lists_the_api(stack):
    response = httpx.get(f"{stack.http_url}/openapi.json")  # no API key, as vLLM serves it
    assert response.status_code == 200
    schema = response.json()
    assert schema["info"]["title"] == "salon" and schema["info"]["version"] == importlib.metadata.version("salon")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/ready", "/version"} <= set(schema["paths"])
