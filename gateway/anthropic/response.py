"""A chat completion (whole) as an Anthropic message, and the pieces the stream shares with it:
the stop reason, tool-use input, and usage split the way Anthropic prices a prompt."""

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from protocol.usage import reported_cached_tokens

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class CacheAccounting:
    """What usage needs beyond the backend's numbers: where the last breakpoint ends in the prompt."""

    breakpoint_tokens: int
    """Prompt tokens up to the last ``cache_control`` breakpoint (0: none)."""
    block_size: int
    ttl: str | None


def anthropic_usage(usage: dict[str, Any] | None, accounting: CacheAccounting) -> dict[str, Any]:
    """Anthropic's usage from the backend's: ``cache_read_input_tokens`` is the engine's cached
    tokens; ``cache_creation_input_tokens`` the tokens up to the last breakpoint that the engine
    newly cached (whole blocks only: the engine caches no partial block); ``input_tokens`` the
    rest. The three add up to the prompt."""
    usage = usage or {}
    reported = usage.get("prompt_tokens")
    prompt = reported if isinstance(reported, int) else 0
    read = min(reported_cached_tokens(usage) or 0, prompt)
    cacheable = min(accounting.breakpoint_tokens, prompt) // accounting.block_size * accounting.block_size
    created = max(0, cacheable - read)
    completion = usage.get("completion_tokens")
    result: dict[str, Any] = {
        "input_tokens": prompt - read - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": completion if isinstance(completion, int) else 0,
    }
    if accounting.ttl is not None:
        result["cache_creation"] = {
            "ephemeral_5m_input_tokens": created if accounting.ttl == "5m" else 0,
            "ephemeral_1h_input_tokens": created if accounting.ttl == "1h" else 0,
        }
    return result


def stop_reason(choice: dict[str, Any], stop_sequences: list[str], used_tools: bool) -> tuple[str, str | None]:
    """(Anthropic's stop reason, the stop sequence that matched). The matched sequence is known only
    from a backend that reports it (vLLM's ``stop_reason``); otherwise a stop is ``end_turn``."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if used_tools and finish in ("tool_calls", "stop"):
        return "tool_use", None
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish or "stop", "end_turn"), None


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A tool call's arguments as the ``input`` object; None when they are not a JSON object."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def whole_message(
    completion: dict[str, Any], model: str, stop_sequences: list[str], accounting: CacheAccounting
) -> dict[str, Any]:
    """The Anthropic message for a whole chat completion (its first choice: Anthropic has no ``n``)."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    used_tools = False
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parsed = tool_input(function.get("arguments", ""))
        if parsed is None:
            content.append({"type": "text", "text": function.get("arguments", "")})
            continue
        used_tools = True
        content.append(
            {"type": "tool_use", "id": call.get("id") or _tool_id(), "name": function.get("name"), "input": parsed}
        )
    reason, sequence = stop_reason(choice, stop_sequences, used_tools)
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": anthropic_usage(completion.get("usage"), accounting),
    }


def _tool_id() -> str:
    return f"toolu_{secrets.token_hex(12)}"
