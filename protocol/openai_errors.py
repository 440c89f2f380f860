"""OpenAI-shaped errors: every failure a client sees is ``{"error": {message, type, param, code}}``.

One exception type for gateway and engine; each renders it with its own HTTP library.
"""

from typing import Any


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class OpenAIError(Exception):
    """An error to return to the client with an HTTP status (and headers such as ``Retry-After``)."""

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

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str, detail: str = "") -> OpenAIError:
    message = f"The model '{model}' does not exist{detail}"
    return OpenAIError(404, message, param="model", code="model_not_found")
