"""A backend's 4xx as an OpenAI error: bodies that are not ``{"error": {...}}`` are wrapped in one.

vLLM answers an endpoint it does not serve for its model (``/v1/embeddings`` on a generating
replica, chat on a pooling one) with FastAPI's ``{"detail": "Not Found"}``; other servers send
plain text. A client of a drop-in OpenAI endpoint expects ``{"error": {message, type, param,
code}}``, so such a body is rewritten, keeping the status, into one that says what the backend
answered to which endpoint. OpenAI-shaped bodies pass through unchanged.
"""

from http import HTTPStatus

import orjson

from gateway.errors import OpenAIError

_MAX_DETAIL_CHARS = 300


def openai_error_body(status: int, data: bytes, endpoint: str, model: object) -> bytes:
    """``data`` if it already is an OpenAI error body, else an OpenAI error that quotes it."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return data
    detail = parsed.get("detail") if isinstance(parsed, dict) else None
    if isinstance(detail, str):
        text = detail
    elif detail is not None:
        text = orjson.dumps(detail).decode()
    else:
        text = data.decode(errors="replace").strip()
    text = text[:_MAX_DETAIL_CHARS] or _phrase(status)
    message = f"the backend serving model '{model}' answered {status} to {endpoint}: {text}"
    param = None
    if status == HTTPStatus.NOT_FOUND:
        message += f" (it does not serve {endpoint} for this model)"
        param = "model"
    return orjson.dumps(OpenAIError(status, message, param=param).body())


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "no detail"
