"""The JSON Schema a reply must follow when the request's tool_choice forces a call: the hook where tool
calling meets constrained decoding. Defined once for the gateway (which sets it as the request's constraint,
salon/gateway/tool_choice.py) and the engine (which sets it for a request that reaches it directly with a forced
choice, salon/engine/api/validation.py).

    tool_choice "auto" / "none"      -> None: the reply is free (text or calls the parser finds)
    tool_choice "required"           -> an array of 1.. calls (at most 1 without parallel_tool_calls), each
                                        {"name": <one of the tools>, "arguments": <that tool's parameters>}
    tool_choice {"function": {"name"}} -> the same with that one tool

The array is the generic JSON form the reply parser reads (salon/gateway/tool_calls.py), so a reply decoded
under this schema parses into exactly the calls it holds.
"""

from __future__ import annotations

from typing import Any

# Parameters of a function that declares none: an object with any members.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def reply_schema(
    functions: list[dict[str, Any]], forced_name: str | None, required: bool, parallel_tool_calls: bool
) -> dict[str, Any] | None:
    """The schema of a reply to `functions` (OpenAI function objects: name, parameters) when a call is forced:
    `forced_name` for a named choice, `required` for "required"; None when nothing is forced."""
    if forced_name is None and not required:
        return None
    chosen = [f for f in functions if forced_name is None or f["name"] == forced_name]
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [f["name"]]},
                "arguments": f.get("parameters") or _ANY_OBJECT,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in chosen
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": variants[0] if len(variants) == 1 else {"anyOf": variants},
        "minItems": 1,
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema
