"""The body the backend gets: the client's, with the granted cap and the tenant's cache salt
(and, for bundled engines, the session key and its TTL as a retention hint)."""

from typing import Any

from gateway.admission.caps import TokenGrant
from gateway.routing.cache_keys import SESSION_TTL, session_ttl_s

CAP_ALIASES = ("max_tokens", "max_completion_tokens")
"""The names a client may give its completion cap; OpenAI reads either on chat, engines differ."""
SESSION_HINT = "kvgate_session"
"""The engine's retention hint: only the gateway writes it, scoped to the tenant; a client's own
(a session name like ``x-session-id``) was read when the request was parsed."""


def forwarded_body(
    body: dict[str, Any],
    grant: TokenGrant,
    cache_salt: str | None,
    limit_key: str = "max_tokens",
    *,
    model: str | None = None,
) -> dict[str, Any]:
    """``body`` (never mutated) with what admission decided written into it, and ``model`` as the
    backend knows it when given (an alias resolved to its model or adapter), in one copy.

    The backend always gets exactly one cap, ``max_tokens`` (the one name every engine reads on
    both endpoints; vLLM, SGLang and the bundled engine's completions ignore
    ``max_completion_tokens``), set to the tokens the gateway granted, reserved KV for and
    charged the tenant for. Every other alias is removed, so none can widen the grant. A
    Responses request's cap is ``limit_key="max_output_tokens"`` instead (per sample either way).
    The client's ``kvgate_session`` is removed: sent as is, it would name another tenant's session.
    """
    dropped = (*CAP_ALIASES, limit_key, SESSION_HINT)
    forwarded = {key: value for key, value in body.items() if key not in dropped}
    forwarded[limit_key] = grant.max_tokens
    if model is not None:
        forwarded["model"] = model
    if cache_salt is None:
        forwarded.pop("cache_salt", None)
    else:
        forwarded["cache_salt"] = cache_salt
    return forwarded


def with_retention_hint(body: dict[str, Any], session_key: str | None) -> dict[str, Any]:
    """``body`` with ``kvgate_session`` set to the scoped session key, the client's or one the router
    inferred (gateway/routing/retention_keys.py), and ``kvgate_session_ttl_s`` to how long the
    request asked it kept (gateway/routing/cache_keys.py; absent: the engine's default). Never
    mutated; without a key, as ``without_retention_hint`` leaves it."""
    if not session_key:
        return without_retention_hint(body)
    hinted = {**body, SESSION_HINT: session_key}
    ttl = session_ttl_s(body)
    if ttl is None:
        hinted.pop(SESSION_TTL, None)
    else:
        hinted[SESSION_TTL] = ttl
    return hinted


def without_retention_hint(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without ``kvgate_session_ttl_s``: a backend that takes no retention hints has no use
    for it (never mutated)."""
    if SESSION_TTL not in body:
        return body
    return {key: value for key, value in body.items() if key != SESSION_TTL}
