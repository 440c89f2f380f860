"""Parse the OpenAI request bodies the gateway accepts, with the shared schemas of ``protocol.openai``.

Only what the gateway itself needs is pulled out here (model, stream, token limits, ``n``); the
body is forwarded as the client sent it, unknown fields included. A field the gateway knows
with a bad value is a 400 naming it, as the backend would answer.
"""

from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from pydantic import BaseModel

from protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
    validate,
)
from protocol.openai_errors import bad_request
from protocol.sampling_bounds import check_sampling_bounds
from radix.hashing import TOKEN_ID_LIMIT


class Endpoint(Enum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    RESPONSES = "/v1/responses"


_SCHEMAS: dict[Endpoint, type[BaseModel]] = {
    Endpoint.CHAT: ChatCompletionRequest,
    Endpoint.COMPLETIONS: CompletionRequest,
    Endpoint.EMBEDDINGS: EmbeddingRequest,
    Endpoint.RESPONSES: ResponsesRequest,
}

ParsedBody = ChatCompletionRequest | CompletionRequest | EmbeddingRequest | ResponsesRequest


@dataclass
class ParsedRequest:
    """The validated request plus the body to forward (the client's JSON, unknown fields kept)."""

    endpoint: Endpoint
    body: dict[str, Any]
    parsed: ParsedBody
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    """The client's limit per sample (``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``)."""
    n: int
    """Sequences generated per prompt: ``n``, or a completions request's larger ``best_of``."""
    user: str | None
    cache_salt: str | None

    @property
    def generates(self) -> bool:
        """False for embeddings: no output tokens, no KV beyond the prompt's forward pass."""
        return self.endpoint is not Endpoint.EMBEDDINGS


def parse_request(body: Any, endpoint: Endpoint) -> ParsedRequest:
    parsed = cast(ParsedBody, validate(body, _SCHEMAS[endpoint]))
    if parsed.model is None:
        raise bad_request("Missing required parameter: 'model'", param="model", code="missing_required_parameter")
    stream = False
    include_usage = False
    max_tokens: int | None = None
    n = 1
    if isinstance(parsed, (ChatCompletionRequest, CompletionRequest)):
        stream, include_usage, n = parsed.stream, parsed.include_usage, parsed.n
        if isinstance(parsed, CompletionRequest):
            n = parsed.samples
        max_tokens = parsed.requested_max_tokens
        check_sampling_bounds(parsed.stop, parsed.logit_bias)
    elif isinstance(parsed, ResponsesRequest):
        stream, max_tokens = parsed.stream, parsed.max_output_tokens
    if isinstance(parsed, (CompletionRequest, EmbeddingRequest)):
        _check_token_ids(parsed.prompt if isinstance(parsed, CompletionRequest) else parsed.input, endpoint)
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        parsed=parsed,
        model=parsed.model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        n=n,
        user=parsed.user,
        cache_salt=getattr(parsed, "cache_salt", None),
    )


def _check_token_ids(value: Any, endpoint: Endpoint) -> None:
    """Prompt or input token ids must fit the block hash's token encoding (the engine checks its vocabulary)."""
    lists = [value] if value and isinstance(value[0], int) else [item for item in value if isinstance(item, list)]
    param = "prompt" if endpoint is Endpoint.COMPLETIONS else "input"
    for token_ids in lists:
        if any(not 0 <= token_id < TOKEN_ID_LIMIT for token_id in token_ids):
            raise bad_request(
                f"'{param}' token ids must be in [0, {TOKEN_ID_LIMIT})", param=param, code="invalid_value"
            )
