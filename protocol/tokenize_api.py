"""vLLM's tokenizer endpoints as gateway and engine both read them: ``/tokenize``, ``/detokenize``.

Strict schemas: a field these endpoints cannot honour (a custom ``chat_template``, multimodal
kwargs) is a 400 naming it rather than silently ignored.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict

from protocol.openai import ChatMessage, validate


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TokenizeCompletionRequest(_Closed):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Closed):
    """The messages rendered by the model's chat template, then tokenized (special tokens come from the template)."""

    model: str | None = None
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool | None = False


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class DetokenizeRequest(_Closed):
    model: str | None = None
    tokens: list[int]


def parse_tokenize(data: Any) -> TokenizeRequest:
    """A ``/tokenize`` body: ``messages`` makes it a chat request, else a prompt (400 naming the bad field)."""
    if isinstance(data, dict) and "messages" in data:
        return validate(data, TokenizeChatRequest)
    return validate(data, TokenizeCompletionRequest)


def parse_detokenize(data: Any) -> DetokenizeRequest:
    return validate(data, DetokenizeRequest)
