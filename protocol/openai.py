"""OpenAI request bodies as gateway and engine both read them: one schema per endpoint.

Validation is strict (no string-to-number coercion); fields a schema does not name are kept
(``extra="allow"``), so the gateway forwards them and the engine ignores them, as OpenAI-compatible
servers do. What only one side must check (the gateway's caps and routing, the engine's context
length and vocabulary) stays on that side.
"""

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

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


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: the schema the answer must match (``strict`` or not, it is enforced)."""

    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: exactly one of these constrains the output."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None


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
    """The client's session key, forwarded by the gateway: a retention hint (engine/core/session_retention.py)."""
    kvgate_session_ttl_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """How long the session's turn is retained (the gateway's reading of ``prompt_cache_retention`` or
    Anthropic's ``cache_control.ttl``); None: the engine's ``--session-ttl-s``."""
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    """OpenAI's: ``in_memory`` is the engine's session TTL, ``24h`` a 24 h one (engine/core/session_hint.py)."""
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    """vLLM's older names for ``structured_outputs``' json, regex and choice."""

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
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    """0 only scores the prompt (with ``echo`` or ``prompt_logprobs``: lm-eval's loglikelihood), as in vLLM."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    """vLLM's: each prompt token's logprob with this many alternatives, in ``choices[i].prompt_logprobs``."""
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    """Sequences generated server-side, of which ``n`` are returned (legacy OpenAI, vLLM)."""

    @property
    def samples(self) -> int:
        """Sequences the backend may generate: ``n``, or ``best_of`` when larger."""
        return max(self.n, self.best_of or 1)

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


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
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
    """A message item of ``input`` (text parts only; images and files are refused)."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ResponseInputPart]


class ResponseFunctionCall(_Strict):
    """A ``function_call`` item: a call the model made earlier in the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class ResponseFunctionCallOutput(_Strict):
    """A ``function_call_output`` item: the result of the call with ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ResponseInputPart]


def _item_type(item: Any) -> str:
    return item.get("type", "message") if isinstance(item, dict) else "message"


ResponseInputItem = Annotated[
    Annotated[ResponseInputMessage, Tag("message")]
    | Annotated[ResponseFunctionCall, Tag("function_call")]
    | Annotated[ResponseFunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_type),
]


class ResponseTextFormat(_Strict):
    """``text.format``: free text, any JSON object, or JSON valid against ``schema``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseText(_Strict):
    format: ResponseTextFormat | None = None


class ResponsesRequest(_Strict):
    """``POST /v1/responses``: text in, text or function calls out."""

    model: str | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[ResponseInputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    """Responses' flat tools (``{"type": "function", "name", "parameters"}``); see ``responses_chat_tools``."""
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponseText | None = None


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
        return messages
    for item in request.input:
        if isinstance(item, ResponseFunctionCall):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, ResponseFunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)})
        else:
            messages.append({"role": item.role, "content": text_of(item.content)})
    return messages


def responses_chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A Responses request's function tools in chat's shape (``{"type": "function", "function": {...}}``),
    as gateway and engine both render them; other tool types are left out (an engine refuses them)."""
    if not isinstance(tools, list):
        return None
    functions = [tool for tool in tools if isinstance(tool, dict) and tool.get("type") == "function"]
    rendered = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in functions]
    return rendered or None
