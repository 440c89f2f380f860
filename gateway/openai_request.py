"""Parse and validate the OpenAI request bodies the gateway accepts.

Only what the gateway itself needs is checked here; fields it does not know are kept and
forwarded, as OpenAI ignores unknown fields. Every problem becomes a 400 naming the field.
"""

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from gateway.errors import bad_request
from radix.hashing import TOKEN_ID_LIMIT


class Endpoint(Enum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[_ContentPart] | None = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class _CommonBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens; either is read on both endpoints, and wins when both are set."""
    n: StrictInt = Field(1, ge=1, le=1)
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    user: StrictStr | None = None
    cache_salt: StrictStr | None = Field(None, min_length=1)


class _ChatBody(_CommonBody):
    messages: list[_Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


class _CompletionBody(_CommonBody):
    prompt: StrictStr | list[Annotated[StrictInt, Field(ge=0, lt=TOKEN_ID_LIMIT)]] = Field(min_length=1)


@dataclass
class ParsedRequest:
    """The validated request plus the body to forward (the client's JSON, unknown fields kept)."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    user: str | None
    cache_salt: str | None


def parse_request(body: Any, endpoint: Endpoint) -> ParsedRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    schema = _ChatBody if endpoint is Endpoint.CHAT else _CompletionBody
    try:
        parsed = schema.model_validate(body)
    except ValidationError as exc:
        raise _first_problem(exc) from None
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=parsed.model,
        stream=parsed.stream,
        include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
        max_tokens=max_tokens,
        user=parsed.user,
        cache_salt=parsed.cache_salt,
    )


def _first_problem(exc: ValidationError) -> Exception:
    error = exc.errors()[0]
    param = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return bad_request(f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    if param == "n":
        return bad_request("Only n=1 is supported", param="n", code="unsupported_value")
    return bad_request(f"Invalid value for '{param}': {error['msg']}", param=param, code="invalid_value")
