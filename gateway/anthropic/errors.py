"""Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

Every error on the Messages routes is sent so, whether the gateway raised it (auth, validation,
admission) or a backend answered it in OpenAI's shape.
"""

from typing import Any

import orjson
from aiohttp import web

from gateway.errors import OpenAIError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (``api_error`` for other server errors)."""
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, request_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type(status), "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def anthropic_error_response(error: OpenAIError, extra_headers: dict[str, str] | None = None) -> web.Response:
    """``error`` in Anthropic's shape, with its headers (``Retry-After``) and ``extra_headers``."""
    headers = with_request_id({**error.headers, **(extra_headers or {})})
    body = error_body(error.status, error.message, headers.get("x-request-id"))
    return web.Response(status=error.status, body=orjson.dumps(body), content_type="application/json", headers=headers)


def with_request_id(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the gateway's ``x-request-id`` also as ``request-id``, where Anthropic's SDKs read it."""
    request_id = headers.get("x-request-id")
    return headers if request_id is None else {**headers, "request-id": request_id}


def message_of_openai_error(data: bytes) -> str:
    """The message of an OpenAI-shaped error body (the proxy wraps every backend error in one)."""
    try:
        error = orjson.loads(data).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return data.decode("utf-8", "replace")[:500] or "backend error"
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else "backend error"
