"""A backend's `usage` object, read once where it arrives (fields may be missing, null or not numbers)."""

from typing import Any

import msgspec


class Usage(msgspec.Struct, frozen=True):
    """A backend's token counts in chat-completion terms; each None when the backend did not say."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None
    """`usage.prompt_tokens_details.cached_tokens`, the prompt tokens the backend served from its KV cache."""


def parse_usage(usage: object) -> Usage | None:
    """A chat-completion `usage` object as a ``Usage``; None when there is no such object."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        total_tokens=_count(usage.get("total_tokens")),
        cached_tokens=_count(details.get("cached_tokens") if isinstance(details, dict) else None),
    )


def reported_cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of a usage object still in its wire form."""
    parsed = parse_usage(usage)
    return parsed.cached_tokens if parsed else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) else None
