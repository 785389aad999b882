"""Structured output fields of the OpenAI and vLLM APIs -> salon.chat.v1 Constraint (docs/structured-output.md).

    response_format {"type": "text"}                                     no constraint
    response_format {"type": "json_object"}                              json_object
    response_format {"type": "json_schema", "json_schema": {name, schema, strict}}
                                                                         json_schema (strict as given; OpenAI's
                                                                         default is not strict)
    structured_outputs {"json": schema} / guided_json                    json_schema, strict (vLLM's xgrammar
                                                                         default: no properties beyond those listed)
    structured_outputs {"json_object": true}                             json_object
    structured_outputs {"regex": r} / guided_regex                       regex
    structured_outputs {"choice": [..]} / guided_choice                  choice
    structured_outputs {"grammar": g} / guided_grammar                   grammar (GBNF with a `root` rule, or Lark
                                                                         with a `start` rule: the engine tells them
                                                                         apart as vLLM does)

At most one of them per request; anything else is a 400 naming the field. Sizes, and a schema's shape
(salon/common/schema_shape.py), are checked here, so a schema past a limit costs no engine call (the engine checks
them again, and compiles); a constraint that does not compile comes back from the engine as a 400 naming the
problem, and the field that gave it (constraint_field).
"""

from __future__ import annotations

import json
from typing import Any

from salon.api.chat.v1 import chat_pb2
from salon.common.schema_shape import schema_shape_problem
from salon.gateway.http.errors import invalid, unsupported

MAX_CONSTRAINT_BYTES = 65_536
_STRUCTURED_KEYS = ("json", "json_object", "regex", "choice", "grammar")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _schema_text(param: str, schema: Any, strict: bool) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise invalid(param, f"not valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise invalid(param, "a JSON schema is an object")
    problem = schema_shape_problem(schema, strict)
    if problem is not None:
        raise invalid(param, problem)
    text = json.dumps(schema)
    if len(text.encode()) > MAX_CONSTRAINT_BYTES:
        raise invalid(param, f"more than {MAX_CONSTRAINT_BYTES} bytes")
    return text


def _text(param: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(param, "must be a non-empty string")
    if len(value.encode()) > MAX_CONSTRAINT_BYTES:
        raise invalid(param, f"more than {MAX_CONSTRAINT_BYTES} bytes")
    return value


def _vllm(param: str, key: str, value: Any) -> chat_pb2.Constraint:
    if key == "json":
        return chat_pb2.Constraint(
            json_schema=chat_pb2.JsonSchema(schema=_schema_text(param, value, strict=True), strict=True)
        )
    if key == "json_object":
        if value is not True:
            raise invalid(param, "must be true when set")
        return chat_pb2.Constraint(json_object=True)
    if key == "regex":
        return chat_pb2.Constraint(regex=_text(param, value))
    if key == "grammar":
        return chat_pb2.Constraint(grammar=_text(param, value))
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise invalid(param, "must be a non-empty list of non-empty strings")
    return chat_pb2.Constraint(choice=chat_pb2.Choice(choices=value))


def _response_format(rf: dict[str, Any]) -> chat_pb2.Constraint | None:
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return chat_pb2.Constraint(json_object=True)
    if kind != "json_schema":
        raise unsupported("response_format.type", f"{kind!r} is not supported (text, json_object or json_schema)")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema", "is required with type 'json_schema'")
    if "schema" not in spec:
        raise invalid("response_format.json_schema.schema", "is required")
    strict = spec.get("strict") or False
    if not isinstance(strict, bool):
        raise invalid("response_format.json_schema.strict", "must be a boolean")
    text = _schema_text("response_format.json_schema.schema", spec["schema"], strict)
    return chat_pb2.Constraint(json_schema=chat_pb2.JsonSchema(schema=text, strict=strict))


def constraint_of(body) -> chat_pb2.Constraint | None:
    """The request's one constraint (None: free text); 400 naming the field for anything malformed or doubled."""
    found = [(field, _constraint(body, field)) for field in _set_fields(body)]
    if len(found) > 1:
        raise invalid(found[1][0], f"only one structured output constraint per request (also {found[0][0]})")
    return found[0][1] if found else None


def constraint_field(body) -> str | None:
    """The field that gave the request's constraint (response_format, structured_outputs or a guided_ one), which
    a refusal of it by the engine (it does not compile) names; None without one. For a body constraint_of took."""
    fields = _set_fields(body)
    return fields[0] if fields else None


def _set_fields(body) -> list[str]:
    """The structured output fields the request sets, in the order they are read (a response_format of type
    text sets none)."""
    rf = getattr(body, "response_format", None)
    fields = ["response_format"] if rf is not None and rf.get("type", "text") != "text" else []
    if getattr(body, "structured_outputs", None) is not None:
        fields.append("structured_outputs")
    return fields + [field for field in _GUIDED if getattr(body, field, None) is not None]


def _constraint(body, field: str) -> chat_pb2.Constraint:
    """The constraint that `field` (one _set_fields names) gives; 400 naming the field where it is malformed."""
    value = getattr(body, field)
    if field == "response_format":
        return _response_format(value)
    if field == "structured_outputs":
        keys = [k for k in value if value[k] is not None]
        unknown = [k for k in keys if k not in _STRUCTURED_KEYS]
        if unknown:
            raise unsupported(
                f"structured_outputs.{unknown[0]}", f"not supported (one of {', '.join(_STRUCTURED_KEYS)})"
            )
        if len(keys) != 1:
            raise invalid("structured_outputs", f"exactly one of {', '.join(_STRUCTURED_KEYS)} is required")
        return _vllm(f"structured_outputs.{keys[0]}", keys[0], value[keys[0]])
    return _vllm(field, _GUIDED[field], value)
