"""The shape limits of a JSON schema, checked on its parsed document before anything compiles.

A schema's compile time grows with its nesting, its enums, its properties, and above all with the optional
properties of objects that admit keys they do not list (a schema that is not strict, without
`"additionalProperties": false`: each such property costs about 0.1 s with SmolLM2's vocabulary and 0.2 s with
Gemma's). Within these limits the compile time limit and the refusal cache bound the rest.

Common code: the engine checks every schema it is sent (gRPC clients too); the gateway checks an HTTP request's
schema right after parsing its body, so a refused one costs no engine call.
"""

from __future__ import annotations

# Levels of JSON objects and arrays in the schema document (about two per nested object schema).
MAX_SCHEMA_DEPTH = 64
MAX_ENUM_VALUES = 1_024
MAX_PROPERTIES = 256
# Optional properties in objects that admit other keys (summed over the schema): not strict, no
# "additionalProperties": false.
MAX_OPEN_OPTIONAL_PROPERTIES = 16

# Keywords whose value maps names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _pointer(path: tuple[str, ...]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)


def schema_shape_problem(schema: object, strict: bool) -> str | None:
    """The first limit the parsed schema exceeds, and where ("enum at /properties/c/enum has 1025 values, more
    than 1024"); None within every limit."""
    open_optional = 0
    # (node, its path, its depth, whether it maps names to schemas rather than being one)
    stack: list[tuple[object, tuple[str, ...], int, bool]] = [(schema, (), 1, False)]
    while stack:
        node, path, depth, is_map = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            return f"nested more than {MAX_SCHEMA_DEPTH} levels deep (at {_pointer(path)})"
        if isinstance(node, list):
            stack.extend((v, (*path, str(i)), depth + 1, False) for i, v in enumerate(node))
            continue
        if is_map:
            stack.extend((v, (*path, k), depth + 1, False) for k, v in node.items())
            continue
        enum = node.get("enum")
        if isinstance(enum, list) and len(enum) > MAX_ENUM_VALUES:
            return f"enum at {_pointer((*path, 'enum'))} has {len(enum)} values, more than {MAX_ENUM_VALUES}"
        properties = node.get("properties")
        if isinstance(properties, dict):
            if len(properties) > MAX_PROPERTIES:
                return f"object at {_pointer(path)} has {len(properties)} properties, more than {MAX_PROPERTIES}"
            required = node.get("required")
            required = (
                set(required) if isinstance(required, list) and all(isinstance(r, str) for r in required) else set()
            )
            if not strict and node.get("additionalProperties") is not False:
                open_optional += len(properties.keys() - required)
                if open_optional > MAX_OPEN_OPTIONAL_PROPERTIES:
                    return (
                        f"more than {MAX_OPEN_OPTIONAL_PROPERTIES} optional properties in objects that admit other "
                        f"keys (not strict, no additionalProperties false; at {_pointer(path)}): list them in "
                        "required, set additionalProperties false, or use strict"
                    )
        stack.extend((v, (*path, k), depth + 1, k in _SCHEMA_MAPS) for k, v in node.items())
    return None
