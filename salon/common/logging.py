"""structlog setup shared by every service.

Services log JSON lines to stderr (one object per line); on a TTY the output is readable console
text instead. Every line logged inside a request carries the request id (bound with
`bind_request_context`) and the current OpenTelemetry `trace_id` / `span_id`, so a log line can be
found from a trace and the other way round.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from opentelemetry import trace

_configured = False

# Keys whose values must never reach a log line, whatever a caller binds by mistake.
_SECRET_KEYS = frozenset({"api_key", "authorization", "password", "secret", "token"})


def _add_trace_context(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event.setdefault("span_id", format(span_context.span_id, "016x"))
    return event


def _redact_secrets(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in _SECRET_KEYS.intersection(event):
        event[key] = "[redacted]"
    return event


def configure_logging(service: str, json_lines: bool | None = None, level: int = logging.INFO) -> None:
    """Configure structlog (and stdlib logging) once per process. json_lines=None: JSON unless stderr is a TTY."""
    global _configured
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_context,
            _redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _configured = True


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)


def bind_request_context(**values: Any) -> None:
    """Bind values (request_id, conversation_id, ...) to every log line of the current task."""
    structlog.contextvars.bind_contextvars(**values)
