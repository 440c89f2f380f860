"""The session a generation request is retained under, and for how long (engine/core/session_retention.py).

``kvgate_session`` (what the gateway sends: the client's key scoped to its tenant) wins; a client
talking to the engine directly may name its session with OpenAI's ``prompt_cache_key`` instead
(in the namespace ``""``). The TTL is ``kvgate_session_ttl_s`` (the gateway's reading of
``prompt_cache_retention`` or Anthropic's ``cache_control.ttl``), else ``prompt_cache_retention``:
``in_memory`` is this engine's ``--session-ttl-s``, ``24h`` is 86400 s. Either is capped at
``--max-session-ttl-s``. Any other ``prompt_cache_retention`` is a 400 naming it (protocol/openai.py).
"""

from dataclasses import dataclass

from protocol.openai import GenerationRequest
from protocol.openai_errors import bad_request

MAX_KEY_CHARS = 1024
RETENTION_TTL_S: dict[str, float | None] = {"in_memory": None, "24h": 86400.0}
"""OpenAI's ``prompt_cache_retention`` values as session TTLs (None: the engine's default)."""


@dataclass(frozen=True)
class SessionHint:
    key: str
    ttl_s: float | None = None
    """None: the engine's ``--session-ttl-s``."""


def session_hint(request: GenerationRequest) -> SessionHint | None:
    key = request.kvgate_session or _cache_key(request)
    if key is None:
        return None
    ttl_s = request.kvgate_session_ttl_s
    if ttl_s is None and request.prompt_cache_retention is not None:
        ttl_s = RETENTION_TTL_S[request.prompt_cache_retention]
    return SessionHint(key, ttl_s)


def _cache_key(request: GenerationRequest) -> str | None:
    key = (request.model_extra or {}).get("prompt_cache_key")
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise bad_request(f"prompt_cache_key must be a string of 1 to {MAX_KEY_CHARS} characters", "prompt_cache_key")
    return key
