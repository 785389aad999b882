"""The bounds of tool definitions and tool calls (OpenAI's function tools), checked alike by the gateway (HTTP,
with OpenAI's field names) and the engine (gRPC): a request's tools cost at most MAX_TOOLS_BYTES of JSON to
read before anything is rendered, and each arguments text at most MAX_TOOL_ARGUMENTS_BYTES."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_TOOLS = 128
# The tools of one request together, as JSON text.
MAX_TOOLS_BYTES = 65536
MAX_TOOL_DESCRIPTION_BYTES = 4096
MAX_TOOL_PARAMETERS_BYTES = 16384
# Tool calls in one assistant message.
MAX_TOOL_CALLS = 128
MAX_TOOL_ARGUMENTS_BYTES = 65536
MAX_TOOL_CALL_ID_BYTES = 256
# OpenAI's rule for function names.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def name_problem(name: Any) -> str | None:
    """Why `name` is not a function name (None when it is one)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return "must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'"
    return None


def json_object(text: str, max_bytes: int) -> tuple[dict | None, str | None]:
    """The JSON object `text` holds, or why it holds none (size checked before parsing; nesting too deep for
    the parser is refused, not raised)."""
    if len(text.encode("utf-8")) > max_bytes:
        return None, f"more than {max_bytes} bytes"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None, "is not valid JSON"
    if not isinstance(value, dict):
        return None, "must be a JSON object"
    return value, None
