"""A Responses request's ``tools``, ``tool_choice`` and ``text.format``, checked and mapped onto the chat machinery.

Responses tools are flat (``{"type": "function", "name", "parameters", "strict"}``) and a named
choice is ``{"type": "function", "name": ...}``; both become the same ``ToolMode`` a chat request
gets (``engine/server/tool_choice.py``), so rendering, grammars and parsing are chat's. Built-in tools
(``web_search``, ``file_search``, ``computer_use_preview``, ``code_interpreter`` ...) and their
choices need a server that runs them: a 400 names them.
"""

from typing import Any

from engine.model.grammar import Grammar, GrammarCompiler
from engine.server.structured_output import ANY_JSON_OBJECT
from engine.server.tool_choice import EMPTY_PARAMETERS, ToolMode, tool_grammar
from protocol.openai import ResponsesRequest
from protocol.openai_errors import bad_request


def responses_tool_mode(request: ResponsesRequest) -> ToolMode | None:
    """The request's tool mode (None: no tools); a 400 for a built-in or malformed tool or choice."""
    choice = request.tool_choice
    if not request.tools:
        if choice is not None and choice != "none":
            raise bad_request("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
        return None
    functions = dict(_function(tool, index) for index, tool in enumerate(request.tools))
    parallel = request.parallel_tool_calls is not False
    if isinstance(choice, dict):
        return ToolMode("named", functions, _named(choice, functions), parallel)
    return ToolMode(choice or "auto", functions, parallel=parallel)


def responses_grammar(
    request: ResponsesRequest, tools: ToolMode | None, compiler: GrammarCompiler | None
) -> Grammar | None:
    """The grammar the answer must follow (``text.format``, a forced call); runs off the event loop."""
    text_format = request.text.format if request.text is not None else None
    structured = text_format is not None and text_format.type != "text"
    forced = tools is not None and tools.kind in ("named", "required")
    if structured and forced:
        raise bad_request("a forced tool call cannot also follow text.format: give one of them", "tool_choice")
    if not (structured or forced):
        return None
    param = "text.format" if structured else "tool_choice"
    if compiler is None:
        raise bad_request(
            f"{param} needs constrained decoding, which this engine's runner (--sim) cannot do",
            param,
            "unsupported_parameter",
        )
    if tools is not None and forced:
        return tool_grammar(tools, compiler)
    assert text_format is not None
    if text_format.type == "json_object":
        return compiler.json_schema(ANY_JSON_OBJECT, "text.format")
    if text_format.schema_ is None:
        raise bad_request(
            "text.format of type 'json_schema' needs a schema", "text.format.schema", "missing_required_parameter"
        )
    return compiler.json_schema(text_format.schema_, "text.format.schema")


def _function(tool: Any, index: int) -> tuple[str, dict[str, Any]]:
    param = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise bad_request(f"{param} must be an object", param)
    kind = tool.get("type")
    if kind != "function":
        raise bad_request(
            f"{param}: tools of type {kind!r} are not supported by this engine; only 'function' tools are",
            f"{param}.type",
            "unsupported_value",
        )
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{param}.name is missing", f"{param}.name", "missing_required_parameter")
    parameters = tool.get("parameters") or EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request(f"{param}.parameters must be a JSON schema object", f"{param}.parameters")
    return name, parameters


def _named(choice: dict[str, Any], functions: dict[str, dict[str, Any]]) -> str:
    """The function a ``{"type": "function", "name": ...}`` choice names; other choice types are refused."""
    kind = choice.get("type")
    if kind != "function":
        raise bad_request(
            f"tool_choice of type {kind!r} is not supported by this engine; use 'none', 'auto', 'required' "
            "or {'type': 'function', 'name': ...}",
            "tool_choice",
            "unsupported_value",
        )
    name = choice.get("name")
    if name not in functions:
        raise bad_request(
            f"tool_choice names function {name!r}, which is not among the tools", "tool_choice", "invalid_value"
        )
    return str(name)
