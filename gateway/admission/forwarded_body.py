"""The body the backend gets: the client's, with the granted max_tokens and the tenant's cache salt."""

from typing import Any

from gateway.admission.caps import TokenGrant


def forwarded_body(body: dict[str, Any], grant: TokenGrant, cache_salt: str | None) -> dict[str, Any]:
    """``body`` (never mutated) with what admission decided written into it."""
    updates: dict[str, Any] = {}
    if grant.forward:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        updates[key] = grant.max_tokens
    if cache_salt != body.get("cache_salt"):
        updates["cache_salt"] = cache_salt
    return {**body, **updates} if updates else body
