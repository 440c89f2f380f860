"""API keys: read from the Authorization header (Bearer) or, as Anthropic's clients send them, from
``x-api-key``; compared in constant time, never logged."""

import hmac

from aiohttp import web

from gateway.errors import OpenAIError


def bearer_token(request: web.Request) -> str | None:
    """The Bearer token, else the ``x-api-key`` header's key; None without either."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        return token
    return request.headers.get("x-api-key", "").strip() or None


def key_matches(given: str, expected: str) -> bool:
    """Constant-time comparison; a header byte that is not UTF-8 (aiohttp keeps it as a surrogate)
    simply fails to match."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="kvgate"'})
