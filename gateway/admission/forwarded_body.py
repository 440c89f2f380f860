"""The body the backend gets: the client's, with the granted cap and the tenant's cache salt
(and, for bundled engines, the session key as a retention hint)."""

import hashlib
from typing import Any

from gateway.admission.caps import TokenGrant

CAP_ALIASES = ("max_tokens", "max_completion_tokens")
"""The names a client may give its completion cap; OpenAI reads either on chat, engines differ."""


def forwarded_body(
    body: dict[str, Any], grant: TokenGrant, cache_salt: str | None, limit_key: str = "max_tokens"
) -> dict[str, Any]:
    """``body`` (never mutated) with what admission decided written into it.

    The backend always gets exactly one cap, ``max_tokens`` (the one name every engine reads on
    both endpoints; vLLM, SGLang and the bundled engine's completions ignore
    ``max_completion_tokens``), set to the tokens the gateway granted, reserved KV for and
    charged the tenant for. Every other alias is removed, so none can widen the grant. A
    Responses request's cap is ``limit_key="max_output_tokens"`` instead (per sample either way).
    """
    forwarded = {key: value for key, value in body.items() if key not in CAP_ALIASES and key != limit_key}
    forwarded[limit_key] = grant.max_tokens
    if cache_salt is None:
        forwarded.pop("cache_salt", None)
    else:
        forwarded["cache_salt"] = cache_salt
    return forwarded


MAX_SESSION_HINT_CHARS = 256
"""The longest ``kvgate_session`` the bundled engine accepts; longer keys are sent as a digest."""


def with_retention_hint(body: dict[str, Any], session_key: str | None) -> dict[str, Any]:
    """``body`` with ``kvgate_session`` set to the session key, the client's or one the router inferred
    (never mutated; as is without a key)."""
    if not session_key:
        return body
    if len(session_key) > MAX_SESSION_HINT_CHARS:
        session_key = hashlib.blake2b(session_key.encode(), digest_size=16).hexdigest()
    return {**body, "kvgate_session": session_key}
