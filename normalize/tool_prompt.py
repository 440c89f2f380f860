"""Tools for chat templates that know none (SmolLM2's): the Hermes rendering, as Qwen2.5's template writes it.

A template that reads ``tools`` renders them itself. One that does not would drop them, so the tool
definitions go into the system message instead, each as one JSON line inside ``<tools></tools>``,
with the instruction to answer with ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
earlier assistant ``tool_calls`` become that text in the assistant's turn, and ``tool`` results a
user turn inside ``<tool_response></tool_response>``. The engine's ``auto`` parser reads the same
format back (``engine/server/tool_parser.py``). Gateway and engine both render through here, so the
gateway hashes the tokens the engine computes.
"""

import contextlib
import json
from collections.abc import Sequence
from typing import Any

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def template_reads_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself."""
    return template is not None and "tools" in template


def with_tools_rendered(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The messages with tool definitions, tool calls and tool results written out as text."""
    rendered = [_rendered_message(message) for message in messages]
    if not tools:
        return rendered
    block = TOOLS_HEADER + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + TOOLS_FOOTER
    if rendered and rendered[0].get("role") == "system":
        system = rendered[0].get("content") or ""
        rendered[0] = {**rendered[0], "content": f"{system}\n\n{block}" if system else block}
    else:
        rendered.insert(0, {"role": "system", "content": block})
    return rendered


def tool_call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it: ``<tool_call>`` and a JSON object of name and arguments."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _rendered_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role == "tool":
        content = _text(message.get("content"))
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        parts = [_text(message.get("content"))] if message.get("content") else []
        parts.extend(_call_text(call) for call in calls)
        return {"role": "assistant", "content": "\n".join(parts)}
    return dict(message)


def _call_text(call: Any) -> str:
    function = call.get("function", {}) if isinstance(call, dict) else {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return tool_call_text(str(function.get("name", "")), arguments)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
