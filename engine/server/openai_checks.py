"""The engine's own checks on OpenAI requests: model name, prompt tokens, context length, sampling.

The request schemas and the error type are shared with the gateway (``protocol.openai``);
what is here depends on this engine's model: its name, vocabulary and maximum context length.
"""

import math
import re
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

from engine.model.lora_modules import LoRARef
from engine.model.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer, TemplateError
from protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationRequest,
    ResponsesRequest,
    chat_messages,
    responses_chat_tools,
    responses_messages,
    validate,
)
from protocol.openai_errors import bad_request, model_not_found
from protocol.sampling_bounds import check_sampling_bounds

RequestT = TypeVar("RequestT", bound=BaseModel)


def parse_request(body: bytes, schema: type[RequestT]) -> RequestT:
    return validate(parse_json(body), schema)


def parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None


def check_model(
    requested: str | None, served_model_name: str, adapters: dict[str, LoRARef] | None = None
) -> LoRARef | None:
    """The LoRA adapter ``requested`` names (None: the base model); an unknown name is a 404, as in vLLM."""
    if requested is None or requested == served_model_name:
        return None
    adapter = (adapters or {}).get(requested)
    if adapter is None:
        served = f"the LoRA adapters {', '.join(map(repr, adapters))}" if adapters else "no LoRA adapters"
        raise model_not_found(requested, f"; this engine serves {served_model_name!r} and {served}")
    return adapter


def _checked_ids(token_ids: list[int], tokenizer: ChatTokenizer, param: str) -> list[int]:
    if not token_ids:
        raise bad_request(f"{param} is empty", param)
    if any(token_id < 0 or token_id >= tokenizer.vocab_size for token_id in token_ids):
        raise bad_request(f"{param} token ids must be in [0, {tokenizer.vocab_size})", param)
    return token_ids


def completion_prompt_ids(request: CompletionRequest, tokenizer: ChatTokenizer) -> list[int]:
    """Token ids of a completion prompt given as text or as token ids (one prompt only)."""
    prompts = _one_or_many(request.prompt)
    if len(prompts) != 1:
        raise bad_request("only one prompt per request is supported", "prompt")
    prompt = prompts[0]
    token_ids = tokenizer.encode_text(prompt) if isinstance(prompt, str) else prompt
    return _checked_ids(token_ids, tokenizer, "prompt")


def _one_or_many(value: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """A prompt or input given as one text or token list, or as a list of them."""
    if isinstance(value, str) or not value or isinstance(value[0], int):
        return [value]  # type: ignore[list-item]
    return list(value)


def _render(messages: list[dict], tools: list[dict] | None, tokenizer: ChatTokenizer, param: str) -> list[int]:
    try:
        token_ids = tokenizer.encode_chat(messages, tools)
    except TemplateError as exc:
        raise bad_request(str(exc), param) from None
    if not token_ids:
        raise bad_request(f"{param} render to an empty prompt", param)
    return token_ids


def chat_prompt_ids(request: ChatCompletionRequest, tokenizer: ChatTokenizer) -> list[int]:
    """Render the messages with the model's chat template and tokenize them (text parts only)."""
    for message in request.messages:
        if isinstance(message.content, list) and any(part.type != "text" for part in message.content):
            raise bad_request("this engine reads only text content parts", "messages", "unsupported_value")
    return _render(chat_messages(request), request.tools, tokenizer, "messages")


def responses_prompt_ids(request: ResponsesRequest, tokenizer: ChatTokenizer) -> list[int]:
    return _render(responses_messages(request), responses_chat_tools(request.tools), tokenizer, "input")


def embedding_inputs(request: EmbeddingRequest, tokenizer: ChatTokenizer, max_model_len: int) -> list[list[int]]:
    """Token ids of each input (a string, token ids, or a list of either)."""
    inputs = []
    for item in _one_or_many(request.input):
        token_ids = tokenizer.encode_text(item) if isinstance(item, str) else list(item)
        _checked_ids(token_ids, tokenizer, "input")
        if len(token_ids) > max_model_len:
            raise bad_request(
                f"an input has {len(token_ids)} tokens; the maximum context length is {max_model_len}",
                "input",
                "context_length_exceeded",
            )
        inputs.append(token_ids)
    return inputs


def sampling_params(
    request: GenerationRequest | ResponsesRequest, num_prompt_tokens: int, max_model_len: int, vocab_size: int
) -> SamplingParams:
    """Sampling parameters; without a token limit a request may fill the rest of the context."""
    param = "input" if isinstance(request, ResponsesRequest) else "prompt"
    if isinstance(request, ChatCompletionRequest):
        param = "messages"
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"prompt has {num_prompt_tokens} tokens; this engine's maximum context length is {max_model_len} "
            "(prompt plus at least one output token)",
            param,
            "context_length_exceeded",
        )
    if isinstance(request, ResponsesRequest):
        return _responses_sampling(request, room)
    max_tokens = request.requested_max_tokens
    if max_tokens is not None and max_tokens > room:
        raise bad_request(
            f"max_tokens {max_tokens} plus {num_prompt_tokens} prompt tokens exceeds "
            f"the maximum context length {max_model_len}",
            "max_tokens",
            "context_length_exceeded",
        )
    check_sampling_bounds(request.stop, request.logit_bias)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=min(max(request.top_k or 0, 0), vocab_size),  # past the vocabulary: no cut (and no int64 overflow)
        seed=request.seed,
        max_tokens=max_tokens or room,
        stop=stop,
        ignore_eos=request.ignore_eos,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        logit_bias=_logit_bias(request.logit_bias or {}, vocab_size),
        logprobs=request.num_logprobs,
    )


def _responses_sampling(request: ResponsesRequest, room: int) -> SamplingParams:
    max_tokens = request.max_output_tokens
    if max_tokens is not None and max_tokens > room:
        raise bad_request(
            f"max_output_tokens {max_tokens} exceeds the {room} tokens left in the context",
            "max_output_tokens",
            "context_length_exceeded",
        )
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        max_tokens=max_tokens or room,
    )


_TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")
"""A logit_bias key: ASCII decimal digits only (``str.isdigit`` also takes "²", which ``int`` refuses)."""
_MAX_ABS_BIAS = 100.0


def _logit_bias(bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` with keys checked against this model's vocabulary and biases
    finite within OpenAI's [-100, 100]; anything else is a 400 naming ``logit_bias``."""
    checked = {}
    for key, value in bias.items():
        if _TOKEN_ID_KEY.fullmatch(key) is None or int(key) >= vocab_size:
            raise bad_request(f"logit_bias key {key[:32]!r} is not a token id in [0, {vocab_size})", "logit_bias")
        if not math.isfinite(value) or abs(value) > _MAX_ABS_BIAS:
            raise bad_request(f"logit_bias value for {key} must be a number in [-100, 100]", "logit_bias")
        checked[int(key)] = float(value)
    return checked
