"""A request's tool_choice made good before it reaches an engine, alike for both fronts (HTTP's chat completions
convert OpenAI's fields into the same salon.chat.v1 fields first, tool_request.py):

    AUTO / unset, NONE        passed on; the reply is parsed for calls of the tools (none with NONE)
    REQUIRED, FUNCTION        the reply is decoded inside the JSON schema of its calls
                              (salon/common/tool_call_schema.py): the schema becomes sampling.constraint and the
                              engine gets AUTO (the tools stay in the prompt); another constraint is refused

The tools' sizes are checked before any of their parameters is read (salon/common/tool_specs.py). A forced call's
schema is checked for shape (salon/common/schema_shape.py) before it goes anywhere: each tool's parameters, then the
calls' schema that nests them, so a schema past a limit costs no engine call and its refusal names the tool
(ToolSchemaRefused). The engine checks every other field of the tools, and the constraint's shape again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from salon.api.chat.v1 import chat_pb2
from salon.common import tool_specs
from salon.common.errors import InvalidArgument
from salon.common.schema_shape import schema_shape_problem
from salon.common.tool_call_schema import reply_schema

_FORCED = (chat_pb2.TOOL_CHOICE_MODE_REQUIRED, chat_pb2.TOOL_CHOICE_MODE_FUNCTION)


class ToolSchemaRefused(InvalidArgument):
    """A forced call's schema past a shape limit: tool_index names the tool whose parameters exceed it (None: the
    calls' schema as a whole, which nests every tool's parameters a few levels deeper)."""

    def __init__(self, tool_index: int | None, problem: str) -> None:
        where = "tools" if tool_index is None else f"tools[{tool_index}].parameters_json"
        super().__init__(f"{where}: {problem}")
        self.tool_index = tool_index
        self.problem = problem


@dataclass(frozen=True)
class ToolReplies:
    """What a reply is parsed for: calls of these tools (salon/gateway/tool_calls.py)."""

    tool_names: tuple[str, ...]
    parallel_tool_calls: bool


def apply_tool_choice(request) -> ToolReplies | None:
    """Check the request's tool_choice against its tools; for a forced choice set the constraint of its calls and
    pass AUTO on. What the reply is parsed for, None when it is text (no tools, or NONE)."""
    choice = request.tool_choice
    tools = request.tools
    mode = choice.mode
    if mode not in chat_pb2.ToolChoiceMode.values():
        raise InvalidArgument(f"tool_choice.mode: {mode} is not a known mode")
    if choice.function_name and mode != chat_pb2.TOOL_CHOICE_MODE_FUNCTION:
        raise InvalidArgument("tool_choice.function_name: only with TOOL_CHOICE_MODE_FUNCTION")
    parallel = not request.HasField("parallel_tool_calls") or request.parallel_tool_calls
    if mode in _FORCED:
        _forced_call(request, parallel)
    if not tools or mode == chat_pb2.TOOL_CHOICE_MODE_NONE:
        return None
    return ToolReplies(tuple(t.name for t in tools), parallel)


def _forced_call(request, parallel: bool) -> None:
    choice, tools = request.tool_choice, request.tools
    what = "REQUIRED" if choice.mode == chat_pb2.TOOL_CHOICE_MODE_REQUIRED else "FUNCTION"
    if not tools:
        raise InvalidArgument(f"tool_choice: {what} needs tools")
    if len(tools) > tool_specs.MAX_TOOLS:
        raise InvalidArgument(f"tools: more than {tool_specs.MAX_TOOLS} tools")
    if sum(len(t.name) + len(t.description.encode()) + len(t.parameters_json.encode()) for t in tools) > (
        tool_specs.MAX_TOOLS_BYTES
    ):
        raise InvalidArgument(f"tools: more than {tool_specs.MAX_TOOLS_BYTES} bytes together")
    forced = None
    if choice.mode == chat_pb2.TOOL_CHOICE_MODE_FUNCTION:
        forced = choice.function_name
        if forced not in {t.name for t in tools}:
            raise InvalidArgument(f"tool_choice.function_name: {forced!r} is not one of the request's tools")
    if request.sampling.HasField("constraint"):
        raise InvalidArgument(f"tool_choice: {what} cannot be combined with sampling.constraint")
    functions = []
    for i, t in enumerate(tools):
        parameters = None
        if t.parameters_json:
            parameters, problem = tool_specs.json_object(t.parameters_json, tool_specs.MAX_TOOL_PARAMETERS_BYTES)
            if problem:
                raise InvalidArgument(f"tools[{i}].parameters_json: {problem}")
            problem = schema_shape_problem(parameters, strict=True)
            if problem:
                raise ToolSchemaRefused(i, problem)
        functions.append({"name": t.name, "parameters": parameters})
    schema = reply_schema(functions, forced, required=forced is None, parallel_tool_calls=parallel)
    problem = schema_shape_problem(schema, strict=True)
    if problem:
        raise ToolSchemaRefused(None, f"in the calls' schema: {problem}")
    request.sampling.constraint.json_schema.schema = json.dumps(schema, separators=(",", ":"))
    request.sampling.constraint.json_schema.strict = True
    request.tool_choice.mode = chat_pb2.TOOL_CHOICE_MODE_AUTO
    request.tool_choice.function_name = ""
