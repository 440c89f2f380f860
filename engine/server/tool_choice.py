"""``tools`` and ``tool_choice`` of a chat request: which calls the answer may or must make.

``none`` and ``auto`` leave decoding free; ``auto`` answers are read back by ``engine/server/tool_parser.py``.
A named function or ``required`` is enforced by a grammar (vLLM does the same):

- a named function: the output is that function's ``arguments`` object, valid against its
  ``parameters`` schema; the call's name is known before the first token;
- ``required``: the output is ``{"name": "<one of the tools>", "arguments": {...}}`` with the
  arguments valid against the chosen function's schema (one call).
"""

import json
from dataclasses import dataclass
from typing import Any, Literal

from engine.model.grammar import Grammar, GrammarCompiler, json_rule
from protocol.openai import ChatCompletionRequest, NamedToolChoice
from protocol.openai_errors import bad_request

ChoiceKind = Literal["none", "auto", "required", "named"]
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolMode:
    """How a request's tools shape its answer."""

    kind: ChoiceKind
    functions: dict[str, dict[str, Any]]
    """Each function's parameters schema, by name, in the request's order."""
    named: str | None = None
    parallel: bool = True
    """False (``parallel_tool_calls: false``): an ``auto`` answer keeps only its first call."""


def required_prefix(name: str) -> str:
    """What a ``required`` answer writes before the arguments of a call to ``name``."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


def tool_mode(request: ChatCompletionRequest) -> ToolMode | None:
    """The request's tool mode (None: no tools); a 400 for a malformed tool or an unknown choice."""
    choice = request.tool_choice
    if not request.tools:
        if choice is not None and choice != "none":
            raise bad_request("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
        return None
    functions = {}
    for index, tool in enumerate(request.tools):
        name, parameters = _function(tool, index)
        functions[name] = parameters
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in functions:
            raise bad_request(
                f"tool_choice names function {choice.function.name!r}, which is not among the tools",
                "tool_choice",
                "invalid_value",
            )
        return ToolMode("named", functions, choice.function.name)
    return ToolMode(choice or "auto", functions, parallel=request.parallel_tool_calls is not False)


def tool_grammar(mode: ToolMode, compiler: GrammarCompiler) -> Grammar | None:
    """The grammar that enforces a named or required choice (None for ``none`` and ``auto``)."""
    if mode.kind == "named":
        assert mode.named is not None
        return compiler.json_schema(mode.functions[mode.named], "tool_choice")
    if mode.kind != "required":
        return None
    rules = ["start: " + " | ".join(f"call_{index}" for index in range(len(mode.functions)))]
    for index, (name, parameters) in enumerate(mode.functions.items()):
        prefix = json.dumps(required_prefix(name))
        rules.append(f'call_{index}: {prefix} args_{index} "}}"')
        rules.append(f"args_{index}: {json_rule(parameters)}")
    return compiler.lark("\n".join(rules) + "\n", "tools")


def _function(tool: Any, index: int) -> tuple[str, dict[str, Any]]:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad_request(f"{param}: only tools of type 'function' are supported", param, "unsupported_value")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise bad_request(f"{param}.function.name is missing", f"{param}.function.name")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema object", f"{param}.function.parameters")
    return function["name"], parameters or EMPTY_PARAMETERS
