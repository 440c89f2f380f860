"""Per served model: how its requests are normalized and tokenized."""

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config import KvgateConfig
from gateway.errors import bad_request, model_not_found
from gateway.openai_request import Endpoint
from normalize.chat_tokenizer import ChatTokenizer, TemplateError
from normalize.model_files import ModelNotFoundError
from normalize.normalizer import Normalizer
from normalize.segment_tokenizer import SegmentTokenizer
from normalize.text_blocks import CHUNK_CHARS, approximate_chat_text, approximate_token_ids

log = logging.getLogger("kvgate.models")

APPROXIMATE = "approximate"
"""The `tokenizer:` value that asks for text-block hashing instead of the model's tokenizer."""


class PromptTokenizer(Protocol):
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str: ...

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of ``text``, far cheaper than tokenizing it."""
        ...

    def min_chat_tokens(self, messages: list[dict[str, Any]]) -> int:
        """A lower bound on the tokens of the rendered chat, before rendering it."""
        ...

    async def encode_prompt_async(self, prompt: str, salt: str | None = None) -> list[int]:
        """Token ids of a prompt or rendered chat; ``salt`` keys any cache per isolation domain."""
        ...


class ApproximateTokenizer:
    """Pseudo-tokens from the normalized text, for backends whose tokenizer is not available here.

    Prefix matches are then estimates (see normalize/text_blocks.py), never token-exact.
    """

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return approximate_chat_text(messages, tools)

    def min_tokens(self, text: str) -> int:
        return math.ceil(len(text) / CHUNK_CHARS)

    def min_chat_tokens(self, messages: list[dict[str, Any]]) -> int:
        chars = sum(len(message["content"]) for message in messages if isinstance(message.get("content"), str))
        return math.ceil(chars / CHUNK_CHARS)

    async def encode_prompt_async(self, prompt: str, salt: str | None = None) -> list[int]:
        return approximate_token_ids(prompt)


@dataclass
class ServedModel:
    name: str
    normalizer: Normalizer
    tokenizer: PromptTokenizer

    async def token_ids(
        self, body: dict[str, Any], endpoint: Endpoint, salt: str | None, check_bound: Callable[[int], None]
    ) -> list[int]:
        """The prompt's token ids exactly as the backend will see them.

        ``check_bound`` gets a lower bound on the count first and raises to refuse a prompt that
        cannot fit, before the tokenizer runs; ``salt`` keeps cached segments per isolation domain.
        """
        prompt = body.get("prompt")
        if endpoint is Endpoint.COMPLETIONS and isinstance(prompt, list):
            check_bound(len(prompt))
            return prompt
        if endpoint is Endpoint.CHAT:
            check_bound(self.tokenizer.min_chat_tokens(body["messages"]))
        try:
            text = (
                self.tokenizer.render_chat(body["messages"], body.get("tools"))
                if endpoint is Endpoint.CHAT
                else str(prompt)
            )
        except TemplateError as exc:
            raise bad_request(str(exc), param="messages") from None
        check_bound(self.tokenizer.min_tokens(text))
        return await self.tokenizer.encode_prompt_async(text, salt)


def load_tokenizer(model: str, tokenizer: str | None) -> PromptTokenizer:
    """The model's own tokenizer, or approximate text blocks when asked for or when none is found."""
    if tokenizer == APPROXIMATE:
        return ApproximateTokenizer()
    try:
        return SegmentTokenizer(ChatTokenizer.load(tokenizer or model))
    except ModelNotFoundError as exc:
        log.warning("no local tokenizer for %s (%s): routing on approximate text blocks", model, exc)
        return ApproximateTokenizer()


class ModelRegistry:
    """The models clients may name, each with its tokenizer and normalizer."""

    def __init__(self, models: dict[str, ServedModel]) -> None:
        self.models = models

    @classmethod
    def from_config(cls, config: KvgateConfig) -> "ModelRegistry":
        normalizer = Normalizer(config.normalize)
        tokenizer_of = {config.backend_model(backend): backend.tokenizer for backend in config.backends}
        tokenizer_of[config.model] = config.tokenizer or tokenizer_of.get(config.model)
        models = {
            name: ServedModel(name, normalizer, load_tokenizer(name, tokenizer))
            for name, tokenizer in tokenizer_of.items()
        }
        return cls(models)

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise model_not_found(name)
        return model
