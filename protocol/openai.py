"""OpenAI request bodies as gateway and engine both read them: one schema per endpoint.

Validation is strict (no string-to-number coercion); fields a schema does not name are kept
(``extra="allow"``), so the gateway forwards them and the engine ignores them, as OpenAI-compatible
servers do. What only one side must check (the gateway's caps and routing, the engine's context
length and vocabulary) stays on that side.
"""

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol.openai_errors import OpenAIError, bad_request

MAX_N = 128
"""Most samples one request may ask for (vLLM has no fixed cap; this bounds one request's work)."""
MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on ``top_logprobs`` (chat); completions' ``logprobs`` uses the same here."""

Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class GenerationRequest(_Strict):
    """What chat and text completions share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    max_completion_tokens: Annotated[int, Field(gt=0)] | None = None
    """OpenAI's newer name for max_tokens; read on both endpoints, and it wins when both are set."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    ignore_eos: bool = False
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    kvgate_session: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The client's session key, forwarded by the gateway: a retention hint (engine/session_retention.py)."""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """None when no logprobs are asked for, else how many alternatives per token."""
        return None


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(_Strict):
    type: str
    text: str | None = None


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ChatMessage(_Strict):
    role: Role
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class EmbeddingRequest(_Strict):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(gt=0)] | None = None
    user: str | None = None


class ResponseInputPart(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str


class ResponseInputMessage(_Strict):
    """A message item of ``input``; items of other types (function calls, images) are refused."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ResponseInputPart]


class ResponsesRequest(_Strict):
    """``POST /v1/responses`` for text in and text out."""

    model: str | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[ResponseInputMessage], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None


RequestT = TypeVar("RequestT", bound=BaseModel)


def validate(data: Any, schema: type[RequestT]) -> RequestT:
    """``data`` as ``schema``, or a 400 that names the first bad field."""
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _first_problem(exc) from None


def _first_problem(exc: ValidationError) -> OpenAIError:
    error = exc.errors()[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "missing":
        return bad_request(f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    return bad_request(f"Invalid value for '{param}': {error['msg']}", param=param, code="invalid_value")


def chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A usage object in chat-completion terms; a Responses usage (``input_tokens``...) is renamed."""
    if "input_tokens" not in usage:
        return usage
    details = usage.get("input_tokens_details") or {}
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens")},
    }


def text_of(content: str | list[ContentPart] | list[ResponseInputPart] | None) -> str | None:
    """Content parts joined into one string (non-text parts contribute nothing)."""
    if content is None or isinstance(content, str):
        return content
    return "".join(part.text or "" for part in content)


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as a chat template expects them: each message's text parts joined."""
    messages = []
    for message in request.messages:
        data = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            data["content"] = text_of(message.content)
        messages.append(data)
    return messages


def responses_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages, as OpenAI's Responses API frames them."""
    if request.previous_response_id is not None:
        raise bad_request(
            "previous_response_id is not supported: responses are not stored; send the whole conversation as input",
            param="previous_response_id",
            code="unsupported_parameter",
        )
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        messages.extend({"role": item.role, "content": text_of(item.content)} for item in request.input)
    return messages
