"""A Messages request as the chat-completion body every backend serves.

``system`` becomes the first message; text blocks become text content parts (one part per
block, so a ``cache_control`` breakpoint names a part); an assistant's ``tool_use`` blocks become
its ``tool_calls``; a user's ``tool_result`` blocks become ``tool`` messages ahead of its text,
as OpenAI orders them. ``tools`` and ``tool_choice`` map to their function-calling forms.
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import OpenAIError, bad_request
from gateway.routing.cache_keys import SESSION_TTL
from protocol.anthropic import (
    CountTokensRequest,
    MessagesRequest,
    OutputConfig,
    TextBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from protocol.sampling_bounds import check_sampling_bounds

CACHE_KEY_PREFIX = "anthropic-cache:"
"""Marks a session key derived from a cache breakpoint's prefix."""
_TTL_ORDER = ("5m", "1h")
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""``cache_control.ttl`` as the session TTL the engine retains the breakpoint's prefix for."""


@dataclass(frozen=True)
class Breakpoint:
    """Where the prompt's cached prefix ends: after content part ``part`` of chat message
    ``message`` (the whole message when ``part`` is None)."""

    message: int
    part: int | None
    ttl: str


@dataclass(frozen=True)
class Translated:
    body: dict[str, Any]
    """The chat-completion body."""
    breakpoint: Breakpoint | None
    """The last ``cache_control`` breakpoint in the messages, if any."""
    ttl: str | None
    """The longest TTL any breakpoint asks for (tools' included); None when nothing is marked."""


class _Messages:
    """Chat messages built from Anthropic's, noting the last breakpoint as they are added."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.breakpoint: Breakpoint | None = None
        self.ttls: set[str] = set()

    def add(self, message: dict[str, Any], marked: list[tuple[int | None, str]]) -> None:
        """Append ``message``; ``marked``: (part index or None for the whole message, ttl) of its breakpoints."""
        for part, ttl in marked:
            self.breakpoint = Breakpoint(len(self.messages), part, ttl)
            self.ttls.add(ttl)
        self.messages.append(message)


def check_stop_sequences(stop_sequences: list[str] | None) -> None:
    """The gateway's bound on stop strings (protocol/sampling_bounds.py), as a 400 naming ``stop_sequences``."""
    try:
        check_sampling_bounds(stop_sequences, None)
    except OpenAIError as error:
        message = error.message.replace("'stop'", "'stop_sequences'")
        raise bad_request(message, param="stop_sequences", code=error.code) from None


def chat_body(request: MessagesRequest) -> Translated:
    """The chat-completion body for ``request`` (streaming ones ask for usage: the gateway reports it)."""
    translated = prompt_body(request)
    body = translated.body
    body["max_tokens"] = request.max_tokens
    optional = {
        "stop": request.stop_sequences,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if request.output_config is not None:
        body.update(_output_format(request.output_config))
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    user_id = request.metadata.user_id if request.metadata else None
    key = _session_key(user_id, translated)
    if key is not None:
        body["user"] = key
    if translated.ttl is not None:
        body[SESSION_TTL] = TTL_SECONDS[translated.ttl]
    return translated


def prompt_body(request: CountTokensRequest) -> Translated:
    """The prompt side alone (model, messages, tools, tool_choice): what ``count_tokens`` counts."""
    if request.messages[-1].role == "assistant":
        raise bad_request(
            "messages: the last message must have role 'user'; a final assistant message (prefill) "
            "is not supported by this gateway's backends",
            param=f"messages.{len(request.messages) - 1}.role",
        )
    chat = _Messages()
    tool_marks = [tool.cache_control.ttl for tool in request.tools or [] if tool.cache_control]
    if request.system:
        _add_system(chat, request.system, tool_marks)
    elif tool_marks:
        chat.ttls.update(tool_marks)
    for index, message in enumerate(request.messages):
        if isinstance(message.content, str):
            chat.add({"role": message.role, "content": message.content}, [])
        elif message.role == "assistant":
            _add_assistant(chat, message.content, index)
        else:
            _add_user(chat, message.content, index)
    if request.cache_control is not None:
        _mark_last(chat, request.cache_control.ttl)
    body: dict[str, Any] = {"model": request.model, "messages": chat.messages}
    if request.tools:
        body["tools"] = [_function(tool) for tool in request.tools]
    if request.tool_choice is not None:
        body.update(_tool_choice(request.tool_choice, request.tools or []))
    ttl = max(chat.ttls, key=_TTL_ORDER.index) if chat.ttls else None
    return Translated(body, chat.breakpoint, ttl)


def _mark_last(chat: _Messages, ttl: str) -> None:
    """Top-level ``cache_control``: a breakpoint on the last cacheable block, the last message's last."""
    content = chat.messages[-1].get("content")
    part = len(content) - 1 if isinstance(content, list) and content else None
    chat.breakpoint = Breakpoint(len(chat.messages) - 1, part, ttl)
    chat.ttls.add(ttl)


def _output_format(config: OutputConfig) -> dict[str, Any]:
    """``output_config.format`` as OpenAI's ``response_format``; an ``effort`` level has no meaning here."""
    if config.effort is not None:
        raise bad_request("output_config.effort: not supported by this gateway's models", param="output_config.effort")
    if config.format is None:
        return {}
    schema = {"name": "output", "schema": config.format.json_schema, "strict": True}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def _add_system(chat: _Messages, system: str | list[TextBlock], tool_marks: Sequence[str]) -> None:
    """The system message; a breakpoint on a tool covers it too, as tools are rendered with it."""
    marks: list[tuple[int | None, str]] = [(None, ttl) for ttl in tool_marks]
    if isinstance(system, str):
        chat.add({"role": "system", "content": system}, marks)
        return
    marks += [(index, block.cache_control.ttl) for index, block in enumerate(system) if block.cache_control]
    chat.add({"role": "system", "content": [_text_part(block) for block in system]}, marks)


def _add_assistant(chat: _Messages, blocks: list[Any], index: int) -> None:
    parts = [_text_part(block) for block in blocks if isinstance(block, TextBlock)]
    calls = [_tool_call(block) for block in blocks if isinstance(block, ToolUseBlock)]
    if any(isinstance(block, ToolResultBlock) for block in blocks):
        raise bad_request(
            f"messages.{index}: tool_result blocks belong in user messages", param=f"messages.{index}.content"
        )
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        message["tool_calls"] = calls
    chat.add(message, _marks(blocks, by_part=not calls))


def _add_user(chat: _Messages, blocks: list[Any], index: int) -> None:
    texts = [block for block in blocks if isinstance(block, TextBlock)]
    if any(isinstance(block, ToolUseBlock) for block in blocks):
        raise bad_request(f"messages.{index}: tool_use blocks belong in assistant messages", f"messages.{index}")
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            marks: list[tuple[int | None, str]] = [(None, block.cache_control.ttl)] if block.cache_control else []
            chat.add({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)}, marks)
    if texts:
        chat.add({"role": "user", "content": [_text_part(block) for block in texts]}, _marks(texts, by_part=True))


def _marks(blocks: list[Any], by_part: bool) -> list[tuple[int | None, str]]:
    """Breakpoints of a message's blocks: at their text part, or at the whole message."""
    marks: list[tuple[int | None, str]] = []
    for index, block in enumerate(blocks):
        if block.cache_control is not None:
            marks.append((index if by_part else None, block.cache_control.ttl))
    return marks


def _text_part(block: TextBlock) -> dict[str, Any]:
    return {"type": "text", "text": block.text}


def _result_text(block: ToolResultBlock) -> str:
    text = block.content if isinstance(block.content, str) else "".join(part.text for part in block.content)
    return f"Error: {text}" if block.is_error else text


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = orjson.dumps(block.input).decode()
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _function(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice, tools: list[Tool]) -> dict[str, Any]:
    """OpenAI's ``tool_choice`` (and ``parallel_tool_calls``) for Anthropic's."""
    if choice.type != "none" and not tools:
        raise bad_request("tool_choice: requires tools", param="tool_choice")
    mapped: dict[str, Any] = {}
    if choice.type == "tool":
        if choice.name is None:
            raise bad_request("tool_choice.name: Field required", param="tool_choice.name")
        if choice.name not in {tool.name for tool in tools}:
            raise bad_request(f"tool_choice.name: no tool is named {choice.name!r}", param="tool_choice.name")
        mapped["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        mapped["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use is not None:
        mapped["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return mapped


def prefix_messages(messages: list[dict[str, Any]], breakpoint: Breakpoint) -> list[dict[str, Any]]:
    """The messages up to and including the breakpoint (its message cut after its part)."""
    last = messages[breakpoint.message]
    if breakpoint.part is not None and isinstance(last.get("content"), list):
        last = {**last, "content": last["content"][: breakpoint.part + 1]}
    return [*messages[: breakpoint.message], last]


def _session_key(user_id: str | None, translated: Translated) -> str | None:
    """The session key the engine retains the prompt under: one per cached prefix (with the client's
    user and the TTL), so that every request sharing a breakpoint's prefix refreshes the same
    session; the client's ``metadata.user_id`` alone when nothing is marked for caching."""
    if translated.ttl is None:
        return user_id
    body, breakpoint = translated.body, translated.breakpoint
    prefix = prefix_messages(body["messages"], breakpoint) if breakpoint else []
    material = [user_id, translated.ttl, body.get("tools"), prefix]
    digest = hashlib.blake2b(orjson.dumps(material, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()
    return f"{CACHE_KEY_PREFIX}{digest}"
