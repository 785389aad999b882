"""Function tools in a chat prompt: the tools a request offers, the calls an assistant message made, and how
they reach the model.

A template that references `tools` gets them natively, as transformers' apply_chat_template passes them:
`tools=[{"type": "function", "function": {"name", "description", "parameters"}}]`, an assistant message's calls
as `tool_calls=[{"id", "type": "function", "function": {"name", "arguments": <dict>}}]` (arguments as a dict,
as vLLM passes them, so `tojson` writes them once) and tool results as `{"role": "tool", "content",
"tool_call_id"}` messages.

A template without tool support (SmolLM2's ChatML, Gemma's turn format) gets the Hermes format in plain
messages instead (the fallback):

    tools         -> a block in the system prompt: the tools' JSON within <tools></tools> and the format
                     of a call (TOOLS_PREAMBLE, TOOLS_FORMAT)
    tool calls    -> the assistant message's text, then each call as
                     <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call> (joined by "\\n")
    tool results  -> user messages <tool_response>\\n{result}\\n</tool_response>

The fallback writes a call exactly as json.dumps writes it (", " and ": " separators), which is how models
trained on the Hermes format write theirs: a reply in that form renders back to the very text generated, so
the next turn reuses its KV.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FORMAT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call."""

    name: str
    description: str = ""
    # The arguments' JSON Schema (None: no parameters).
    parameters: dict | None = None

    def as_template_tool(self) -> dict:
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCallSpec:
    """One call an assistant message made."""

    id: str
    name: str
    # The arguments as JSON text (an object).
    arguments_json: str

    def as_template_call(self) -> dict:
        arguments = json.loads(self.arguments_json) if self.arguments_json else {}
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


def template_supports_tools(source: str) -> bool:
    """Whether a chat template renders tools itself (it reads the `tools` variable)."""
    return re.search(r"\btools\b", source) is not None


def tools_block(tools: tuple[ToolSpec, ...]) -> str:
    """The fallback's system-prompt block describing the tools and the call format."""
    listed = "\n".join(json.dumps(t.as_template_tool(), ensure_ascii=False) for t in tools)
    return TOOLS_PREAMBLE + listed + TOOLS_FORMAT


def call_text(call: ToolCallSpec) -> str:
    """One call as the fallback writes it (and as a Hermes-trained model writes it)."""
    arguments = json.loads(call.arguments_json) if call.arguments_json else {}
    return (
        "<tool_call>\n" + json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
    )


def calls_text(content: str, calls: tuple[ToolCallSpec, ...]) -> str:
    """An assistant message with tool calls as the fallback writes it: its text, then its calls."""
    return "\n".join(([content] if content else []) + [call_text(c) for c in calls])


def tool_result_text(content: str) -> str:
    """A tool result as the fallback writes it (in a user message)."""
    return f"<tool_response>\n{content}\n</tool_response>"
