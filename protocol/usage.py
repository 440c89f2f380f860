"""Reading an OpenAI `usage` object as a backend sends it (fields may be missing or null)."""

from typing import Any


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, the prompt tokens the backend served from its KV cache."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


def total_tokens(usage: dict[str, Any] | None) -> int | None:
    """`usage.total_tokens`; None when the backend did not say."""
    total = (usage or {}).get("total_tokens")
    return total if isinstance(total, int) else None
