"""The tool-calling fields of a chat request, checked and carried to the engine (salon.chat.v1 Tool, ToolChoice,
ToolCall), with OpenAI's names in every 400:

    tools                  [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
                           at most MAX_TOOLS, names unique, sizes bounded (salon/common/tool_specs.py);
                           "strict": true is refused (a free reply cannot promise it; a forced call's
                           arguments always follow the tool's parameters)
    tool_choice            "auto" (the default), "none" (no tools in the prompt, a text reply), "required" or
                           {"type": "function", "function": {"name"}}: the reply is decoded inside the JSON
                           schema of its calls (salon/gateway/tool_choice.py, as for gRPC), one more
                           constraint being a 400; a tool's parameters past a schema shape limit are a 400
                           naming tools[i].function.parameters (no engine call)
    parallel_tool_calls    true (the default) or false: at most one call is returned
    assistant tool_calls   [{"id", "type": "function", "function": {"name", "arguments": "<JSON object>"}}]
    tool messages          {"role": "tool", "tool_call_id", "content"}
"""

from __future__ import annotations

import json
from typing import Any

from salon.api.chat.v1 import chat_pb2
from salon.common import tool_specs
from salon.common.errors import InvalidArgument
from salon.gateway.http.errors import invalid, unsupported
from salon.gateway.http.schemas import ChatCompletionRequest, ChatMessage
from salon.gateway.tool_choice import ToolSchemaRefused, apply_tool_choice


def _function_of(tool: Any, where: str) -> dict:
    if not isinstance(tool, dict):
        raise invalid(where, "must be an object")
    if tool.get("type") != "function":
        raise unsupported(f"{where}.type", f"{tool.get('type')!r} tools are not supported; only 'function'")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise invalid(f"{where}.function", "must be an object")
    return function


def _tool(tool: Any, where: str) -> chat_pb2.Tool:
    function = _function_of(tool, where)
    name = function.get("name")
    problem = tool_specs.name_problem(name)
    if problem:
        raise invalid(f"{where}.function.name", problem)
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise invalid(f"{where}.function.description", "must be a string")
    if len(description.encode()) > tool_specs.MAX_TOOL_DESCRIPTION_BYTES:
        raise invalid(f"{where}.function.description", f"more than {tool_specs.MAX_TOOL_DESCRIPTION_BYTES} bytes")
    parameters = function.get("parameters")
    parameters_json = ""
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise invalid(f"{where}.function.parameters", "must be a JSON Schema object")
        if parameters.get("type", "object") != "object":
            raise invalid(f"{where}.function.parameters.type", "must be 'object' (the arguments are an object)")
        parameters_json = json.dumps(parameters, ensure_ascii=False)
        if len(parameters_json.encode()) > tool_specs.MAX_TOOL_PARAMETERS_BYTES:
            raise invalid(f"{where}.function.parameters", f"more than {tool_specs.MAX_TOOL_PARAMETERS_BYTES} bytes")
    if function.get("strict"):
        raise unsupported(
            f"{where}.function.strict",
            "strict is not served with tool_choice 'auto'; a forced call ('required' or a named function) "
            "always follows the tool's parameters",
        )
    return chat_pb2.Tool(name=name, description=description, parameters_json=parameters_json)


def chat_tools(body: ChatCompletionRequest, request) -> list[str]:
    """Set the request's tools, tool_choice and parallel_tool_calls from the body; the names of the tools
    whose calls the reply may hold (none with tool_choice "none")."""
    tools = body.tools
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools", "must be an array of tools")
    tools = tools or []
    if len(tools) > tool_specs.MAX_TOOLS:
        raise invalid("tools", f"at most {tool_specs.MAX_TOOLS} tools")
    converted = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    names: set[str] = set()
    for i, t in enumerate(converted):
        if t.name in names:
            raise invalid(f"tools[{i}].function.name", f"{t.name!r} is defined twice")
        names.add(t.name)
    if sum(len(t.name) + len(t.description.encode()) + len(t.parameters_json.encode()) for t in converted) > (
        tool_specs.MAX_TOOLS_BYTES
    ):
        raise invalid("tools", f"more than {tool_specs.MAX_TOOLS_BYTES} bytes together")
    parallel = body.parallel_tool_calls
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "must be a boolean")
    mode, forced = _tool_choice(body.tool_choice, names)
    request.tools.extend(converted)
    if mode in ("required", "function") and request.sampling.HasField("constraint"):
        raise invalid("tool_choice", f"{mode!r} cannot be combined with another structured output constraint")
    if converted:
        request.tool_choice.mode = _MODES[mode]
        request.tool_choice.function_name = forced or ""
    if parallel is not None:
        request.parallel_tool_calls = parallel
    # A forced call: the reply is decoded inside the JSON schema of its calls (the calls as the parser's generic
    # JSON form), so even a small model answers with a valid call of an offered tool; the engine gets AUTO.
    try:
        replies = apply_tool_choice(request)
    except ToolSchemaRefused as exc:
        where = "tools" if exc.tool_index is None else f"tools[{exc.tool_index}].function.parameters"
        raise invalid(where, exc.problem) from None
    except InvalidArgument as exc:
        raise invalid("tool_choice", exc.message.removeprefix("tool_choice: ")) from None
    return list(replies.tool_names) if replies else []


_MODES = {
    "auto": chat_pb2.TOOL_CHOICE_MODE_AUTO,
    "none": chat_pb2.TOOL_CHOICE_MODE_NONE,
    "required": chat_pb2.TOOL_CHOICE_MODE_REQUIRED,
    "function": chat_pb2.TOOL_CHOICE_MODE_FUNCTION,
}


def _tool_choice(choice: Any, names: set[str]) -> tuple[str, str | None]:
    """(mode, the forced function's name) of a tool_choice."""
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise invalid("tool_choice", "'required' needs tools")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise invalid("tool_choice.function.name", f"{name!r} is not one of the request's tools")
        return "function", name
    raise invalid("tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name'}}")


def assistant_tool_calls(message: ChatMessage, where: str) -> list[chat_pb2.ToolCall]:
    """An assistant message's tool_calls (empty when it has none)."""
    calls = (message.model_extra or {}).get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", "must be an array")
    if len(calls) > tool_specs.MAX_TOOL_CALLS:
        raise invalid(f"{where}.tool_calls", f"at most {tool_specs.MAX_TOOL_CALLS} calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = _function_of(call, at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or len(call_id.encode()) > tool_specs.MAX_TOOL_CALL_ID_BYTES:
            raise invalid(f"{at}.id", f"must be a string of 1 to {tool_specs.MAX_TOOL_CALL_ID_BYTES} bytes")
        problem = tool_specs.name_problem(function.get("name"))
        if problem:
            raise invalid(f"{at}.function.name", problem)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise invalid(f"{at}.function.arguments", "must be a string (a JSON object)")
        _, problem = tool_specs.json_object(arguments or "{}", tool_specs.MAX_TOOL_ARGUMENTS_BYTES)
        if problem:
            raise invalid(f"{at}.function.arguments", problem)
        out.append(chat_pb2.ToolCall(id=call_id, name=function["name"], arguments_json=arguments or "{}"))
    return out


def tool_call_id(message: ChatMessage, where: str) -> str:
    """A tool message's tool_call_id (required)."""
    call_id = (message.model_extra or {}).get("tool_call_id")
    if not isinstance(call_id, str) or not call_id or len(call_id.encode()) > tool_specs.MAX_TOOL_CALL_ID_BYTES:
        raise invalid(
            f"{where}.tool_call_id", f"is required: a string of 1 to {tool_specs.MAX_TOOL_CALL_ID_BYTES} bytes"
        )
    return call_id
