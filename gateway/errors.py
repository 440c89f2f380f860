"""OpenAI-shaped errors: every failure a client sees is `{"error": {message, type, param, code}}`."""

import orjson
from aiohttp import web


class OpenAIError(Exception):
    """An error to return to the client with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, extra_headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers={**self.headers, **(extra_headers or {})},
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")


def service_unavailable(message: str, retry_after_s: int | None = None) -> OpenAIError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return OpenAIError(503, message, type_="service_unavailable", code="service_unavailable", headers=headers)


def too_many_requests(message: str, retry_after_s: int, code: str = "rate_limit_exceeded") -> OpenAIError:
    return OpenAIError(429, message, type_="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s)})
