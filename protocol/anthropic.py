"""Anthropic Messages API request bodies (``POST /v1/messages`` and ``/v1/messages/count_tokens``).

Validation is strict and closed, as Anthropic's own API is: a field it does not name is a 400
naming the field, so nothing a client asks for is dropped silently. Content blocks the gateway
cannot translate for a text model (images, documents, thinking) are refused by type.
"""

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol.openai_errors import OpenAIError, bad_request

SUPPORTED_BLOCKS = ("text", "tool_use", "tool_result")

RequestT = TypeVar("RequestT", bound=BaseModel)


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CacheControl(_Closed):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class TextBlock(_Closed):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Closed):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Closed):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(_Closed):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Closed):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: CacheControl | None = None
    type: Literal["custom"] | None = None


class ToolChoice(_Closed):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(_Closed):
    user_id: Annotated[str, Field(max_length=256)] | None = None


class JsonOutputFormat(_Closed):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Closed):
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class CountTokensRequest(_Closed):
    """What ``count_tokens`` reads: the prompt side of a Messages request."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    """A breakpoint on the last cacheable block (the last message's last block)."""


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    speed: Literal["standard", "fast"] | None = None
    inference_geo: str | None = None
    """``service_tier``, ``speed`` and ``inference_geo`` ask for capacity and placement; accepted and
    without effect (one tier, one speed, one place here), as Anthropic answers where it has no choice."""


def validate_anthropic(data: Any, schema: type[RequestT]) -> RequestT:
    """``data`` as ``schema``, or a 400 naming the first bad field (in Anthropic's words where it has them)."""
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _first_problem(exc) from None


_TYPE_ERRORS = {"string_type", "list_type", "dict_type", "model_type", "int_type", "float_type", "bool_type"}


def _first_problem(exc: ValidationError) -> OpenAIError:
    """The error to report: within a union (``str | list[block]``), the branch that matches the
    input's JSON type rather than pydantic's first branch."""
    errors = exc.errors()
    error = next((error for error in errors if error["type"] not in _TYPE_ERRORS), errors[0])
    param = _param(error["loc"])
    if error["type"] == "missing":
        return bad_request(f"{param}: Field required", param=param, code="missing_required_parameter")
    if error["type"] == "extra_forbidden":
        return bad_request(f"{param}: Extra inputs are not permitted", param=param, code="unsupported_parameter")
    if error["type"] == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        return bad_request(
            f"{param}: content blocks of type {tag!r} are not supported by this gateway "
            f"(it serves text models: {', '.join(SUPPORTED_BLOCKS)})",
            param=param,
            code="unsupported_value",
        )
    return bad_request(f"{param}: {error['msg']}", param=param, code="invalid_value")


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The field path of an error, without the union branches and block tags pydantic puts in it
    (``str``, ``list[tagged-union[...]]``, ``TextBlock``, the ``text`` tag after a block's index)."""
    parts: list[str] = []
    tag_at = -1
    for index, part in enumerate(loc):
        if isinstance(part, str) and "tagged-union" in part:
            tag_at = index + 2
        if index == tag_at or (isinstance(part, str) and (part in {"str", "list", "dict"} or "[" in part)):
            continue
        if isinstance(part, str) and part[:1].isupper():
            continue
        parts.append(str(part))
    return ".".join(parts) or None


def chat_usage_of_anthropic(usage: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``usage`` in chat-completion terms. Anthropic's ``input_tokens`` excludes the
    tokens read from and written to the cache, so the prompt is all three together, and the
    cache reads are OpenAI's ``cached_tokens``."""
    counts = {
        key: value if isinstance(value := usage.get(key), int) else 0
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    prompt = counts["input_tokens"] + counts["cache_read_input_tokens"] + counts["cache_creation_input_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": counts["output_tokens"],
        "total_tokens": prompt + counts["output_tokens"],
        "prompt_tokens_details": {"cached_tokens": counts["cache_read_input_tokens"]},
    }
