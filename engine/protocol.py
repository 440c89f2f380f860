"""OpenAI request bodies: validation, prompt tokens and sampling parameters, and error bodies.

Validation is strict (no string-to-number coercion) and every failure becomes an OpenAI-shaped
``{"error": {...}}`` with a 4xx status. Fields the engine does not use are accepted and ignored,
as OpenAI-compatible servers do.
"""

from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer, TemplateError


class ProtocolError(Exception):
    """A request the engine refuses; ``body`` is the OpenAI error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    model: str | None = None
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    kvgate_session: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The client's session key, forwarded by the gateway: a retention hint (engine/session_retention.py)."""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


RequestT = TypeVar("RequestT", bound=_GenerationRequest)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[TextPart] | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: Annotated[int, Field(gt=0)] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_request(body: bytes, model_type: type[RequestT]) -> RequestT:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ProtocolError("request body must be a JSON object")
    try:
        return model_type.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        location = ".".join(str(part) for part in error["loc"])
        param = str(error["loc"][0]) if error["loc"] else None
        raise ProtocolError(f"{location or 'body'}: {error['msg']}", param) from exc


def check_model(request: _GenerationRequest, served_model_name: str) -> None:
    if request.model is not None and request.model != served_model_name:
        message = f"The model {request.model!r} does not exist; this engine serves {served_model_name!r}"
        raise ProtocolError(message, "model", 404, "model_not_found")


def completion_prompt_ids(request: CompletionRequest, tokenizer: ChatTokenizer) -> list[int]:
    """Token ids of a completion prompt given as text or as token ids (one prompt only)."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ProtocolError("only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    token_ids = tokenizer.encode_text(prompt) if isinstance(prompt, str) else list(prompt)
    if not token_ids:
        raise ProtocolError("prompt is empty", "prompt")
    if any(token_id < 0 or token_id >= tokenizer.vocab_size for token_id in token_ids):
        raise ProtocolError(f"prompt token ids must be in [0, {tokenizer.vocab_size})", "prompt")
    return token_ids


def chat_prompt_ids(request: ChatCompletionRequest, tokenizer: ChatTokenizer) -> list[int]:
    """Render the messages with the model's chat template and tokenize them."""
    messages = [_flatten_content(message) for message in request.messages]
    try:
        token_ids = tokenizer.encode_chat(messages, request.tools)
    except TemplateError as exc:
        raise ProtocolError(str(exc), "messages") from exc
    if not token_ids:
        raise ProtocolError("messages render to an empty prompt", "messages")
    return token_ids


def sampling_params(request: _GenerationRequest, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    """Sampling parameters; without ``max_tokens`` a request may fill the rest of the context."""
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise ProtocolError(
            f"prompt has {num_prompt_tokens} tokens; this engine's maximum context length is {max_model_len} "
            "(prompt plus at least one output token)",
            "prompt" if isinstance(request, CompletionRequest) else "messages",
            code="context_length_exceeded",
        )
    max_tokens = request.requested_max_tokens
    if max_tokens is not None and max_tokens > room:
        raise ProtocolError(
            f"max_tokens {max_tokens} plus {num_prompt_tokens} prompt tokens exceeds "
            f"the maximum context length {max_model_len}",
            "max_tokens",
            code="context_length_exceeded",
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(request.top_k or 0, 0),
        seed=request.seed,
        max_tokens=max_tokens or room,
        stop=stop,
        ignore_eos=request.ignore_eos,
    )


def _flatten_content(message: ChatMessage) -> dict[str, Any]:
    """A message as the chat template expects it: content parts joined into one string."""
    data = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        data["content"] = "".join(part.text for part in message.content)
    return data
