"""Which session a request names: a configured session header, OpenAI's ``prompt_cache_key``,
``user`` or ``kvgate_session``, in that order. All feed the same session key
(``retention_keys.client_session_key``: scoped to the tenant and cache salt), which routes the
request (session footprints; the ``session`` policy's ring) and is the bundled engine's retention hint.

How long a bundled engine retains the session (``session_ttl_s``, sent as ``kvgate_session_ttl_s``
beside the key): ``prompt_cache_retention`` (OpenAI) ``in_memory`` is the engine's ``--session-ttl-s``
(5 min by default, like OpenAI's in-memory retention), ``24h`` is 86400 s (capped by the engine's
``--max-session-ttl-s``); a ``kvgate_session_ttl_s`` in the body (what the Anthropic front end writes
for ``cache_control.ttl``, or a client's own) wins. Any other value is a 400 naming the field.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.routing.types import RouteReason
from protocol.openai_errors import bad_request

PROMPT_CACHE_KEY = "prompt_cache_key"
RETENTION_TTL_S: dict[str, float | None] = {"in_memory": None, "24h": 86400.0}
"""OpenAI's ``prompt_cache_retention`` values as session TTLs (None: the engine's default)."""
SESSION_TTL = "kvgate_session_ttl_s"
MAX_KEY_CHARS = 1024


@dataclass(frozen=True)
class NamedSession:
    key: str
    source: str
    """Where the client named it: a header's name, ``prompt_cache_key``, ``user`` or ``kvgate_session``."""


def named_session(
    header: Callable[[str], str | None], session_headers: list[str], body: dict[str, Any], user: str | None
) -> NamedSession | None:
    """The session the request names (None: none); a malformed ``prompt_cache_key`` or
    ``prompt_cache_retention`` is a 400 naming it."""
    check_cache_retention(body)
    for name in session_headers:
        value = header(name)
        if value:
            return NamedSession(value, name)
    cache_key = body.get(PROMPT_CACHE_KEY)
    if cache_key is not None:
        if not isinstance(cache_key, str) or not cache_key or len(cache_key) > MAX_KEY_CHARS:
            raise bad_request(
                f"prompt_cache_key must be a string of 1 to {MAX_KEY_CHARS} characters", param=PROMPT_CACHE_KEY
            )
        return NamedSession(cache_key, PROMPT_CACHE_KEY)
    if user:
        return NamedSession(user, "user")
    hint = body.get("kvgate_session")
    return NamedSession(hint, "kvgate_session") if isinstance(hint, str) and hint else None


def check_cache_retention(body: dict[str, Any]) -> None:
    """A 400 naming ``prompt_cache_retention`` or ``kvgate_session_ttl_s`` when it is not one we serve."""
    retention = body.get("prompt_cache_retention")
    if retention is not None and (not isinstance(retention, str) or retention not in RETENTION_TTL_S):
        raise bad_request(
            f"prompt_cache_retention must be one of {', '.join(RETENTION_TTL_S)}", param="prompt_cache_retention"
        )
    ttl = body.get(SESSION_TTL)
    if ttl is not None and not _is_positive_number(ttl):
        raise bad_request(f"{SESSION_TTL} must be a positive number of seconds", param=SESSION_TTL)


def session_ttl_s(body: dict[str, Any]) -> float | None:
    """How long the request asks the engine to retain its session (None: the engine's default);
    ``body`` passed ``check_cache_retention``."""
    ttl = body.get(SESSION_TTL)
    if ttl is not None:
        return float(ttl)
    retention = body.get("prompt_cache_retention")
    return RETENTION_TTL_S[retention] if retention is not None else None


def _is_positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def keyed_reason(reason: RouteReason, source: str | None) -> RouteReason:
    """The route reason, marked when the session came from ``prompt_cache_key``."""
    return reason.by_cache_key() if source == PROMPT_CACHE_KEY else reason
