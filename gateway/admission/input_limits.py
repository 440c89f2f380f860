"""Caps on the shape of a request body: containers, nesting depth, messages, tools, content length.

The container count is checked on the raw bytes, before the body is parsed (parsing a body of
many small objects is what holds the event loop longest); the rest right after it is parsed,
before any part of the gateway walks it. The body size itself is capped by aiohttp
(`client_max_size`, 413).
"""

from typing import Any

import numpy as np

from gateway.admission.config import LimitsConfig
from gateway.errors import bad_request

_CONTAINERS = (dict, list)


def check_raw_body(raw: bytes, limits: LimitsConfig) -> None:
    """Raise 400 when the body holds more than ``max_json_containers`` objects and arrays.

    Counting brackets is a fast upper bound; only when it is over the limit are brackets inside
    strings (code in a prompt, say) left out to count exactly.
    """
    limit = limits.max_json_containers
    if len(raw) <= limit:  # each container opens with a byte of its own; counting costs ~5 us per 16 kB
        return
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return
    containers = _containers_outside_strings(raw)
    if containers > limit:
        raise bad_request(
            f"The request body holds {containers} JSON objects and arrays; the limit is {limit}.",
            code="too_many_json_values",
        )


def check_input(body: dict[str, Any], limits: LimitsConfig) -> None:
    """Raise 400 when the body nests too deep, has too many messages or too long a content."""
    if _depth(body, limits.max_json_depth) > limits.max_json_depth:
        raise bad_request(f"The request body nests deeper than {limits.max_json_depth} levels.", code="invalid_value")
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > limits.max_messages:
            raise bad_request(
                f"The request has {len(messages)} messages; the limit is {limits.max_messages}.",
                param="messages",
                code="too_many_messages",
            )
        for index, message in enumerate(messages):
            if isinstance(message, dict):
                _check_length(_content_chars(message.get("content")), limits, f"messages.{index}.content")
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise bad_request(
            f"The request has {len(tools)} tools; the limit is {limits.max_tools}.",
            param="tools",
            code="too_many_tools",
        )
    prompt = body.get("prompt")
    if isinstance(prompt, (str, list)):
        _check_length(len(prompt), limits, "prompt")
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        _check_length(len(instructions), limits, "instructions")
    _check_inputs(body.get("input"), limits)


def _check_inputs(value: Any, limits: LimitsConfig) -> None:
    """The `input` of embeddings (texts or token ids) and responses (text or message items)."""
    if isinstance(value, str):
        _check_length(len(value), limits, "input")
    if not isinstance(value, list):
        return
    if len(value) > limits.max_messages:
        raise bad_request(
            f"The request has {len(value)} input items; the limit is {limits.max_messages}.",
            param="input",
            code="too_many_messages",
        )
    for index, item in enumerate(value):
        if isinstance(item, (str, list)):
            _check_length(len(item), limits, f"input.{index}")
        elif isinstance(item, dict):
            _check_length(_content_chars(item.get("content")), limits, f"input.{index}.content")


def _containers_outside_strings(raw: bytes) -> int:
    """Brackets that open an object or array: with escaped backslashes and escaped quotes taken out
    (C-speed replaces), every quote left delimits a string, so a bracket is outside the strings
    when an even number of quotes precede it."""
    cleaned = np.frombuffer(raw.replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    quotes = np.flatnonzero(cleaned == ord('"'))
    brackets = np.flatnonzero((cleaned == ord("{")) | (cleaned == ord("[")))
    return int(np.count_nonzero(np.searchsorted(quotes, brackets) % 2 == 0))


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counted no further than ``limit + 1`` (level by level)."""
    if not isinstance(value, (dict, list)):
        return 0
    depth = 0
    level = [value]
    while level:
        depth += 1
        if depth > limit:
            break
        below = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) in _CONTAINERS:
                    below.append(child)
        level = below
    return depth


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return 0


def _check_length(length: int, limits: LimitsConfig, param: str) -> None:
    if length > limits.max_content_chars:
        raise bad_request(
            f"'{param}' is {length} characters long; the limit is {limits.max_content_chars}.",
            param=param,
            code="content_too_long",
        )
