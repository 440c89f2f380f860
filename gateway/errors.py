"""The gateway's OpenAI errors: the shared error type (``protocol.openai_errors``) as aiohttp responses."""

import orjson
from aiohttp import web

from protocol.openai_errors import OpenAIError, bad_request, model_not_found

__all__ = [
    "OpenAIError",
    "bad_request",
    "error_response",
    "model_not_found",
    "service_unavailable",
    "too_many_requests",
]


def error_response(error: OpenAIError, extra_headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=error.status,
        body=orjson.dumps(error.body()),
        content_type="application/json",
        headers={**error.headers, **(extra_headers or {})},
    )


def service_unavailable(message: str, retry_after_s: int | None = None) -> OpenAIError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return OpenAIError(503, message, type_="service_unavailable", code="service_unavailable", headers=headers)


def too_many_requests(message: str, retry_after_s: int, code: str = "rate_limit_exceeded") -> OpenAIError:
    return OpenAIError(429, message, type_="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s)})
