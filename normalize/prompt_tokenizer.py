"""What the gateway tokenizes a served model's prompts with: the model's own tokenizer (segment
cached), or approximate text blocks when asked for (``tokenizer: approximate``) or when no local
tokenizer is found."""

import logging
import math
from typing import Any, Protocol

from normalize.chat_tokenizer import ChatTokenizer
from normalize.model_files import ModelNotFoundError
from normalize.segment_tokenizer import EncodedPrompt, SegmentTokenizer
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

    async def encode_prompt_async(self, prompt: str, salt: str | None = None) -> EncodedPrompt:
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

    async def encode_prompt_async(self, prompt: str, salt: str | None = None) -> EncodedPrompt:
        return EncodedPrompt(approximate_token_ids(prompt))


def load_tokenizer(model: str, tokenizer: str | None) -> PromptTokenizer:
    """The model's own tokenizer, or approximate text blocks when asked for or when none is found."""
    if tokenizer == APPROXIMATE:
        return ApproximateTokenizer()
    try:
        return SegmentTokenizer(ChatTokenizer.load(tokenizer or model))
    except ModelNotFoundError as exc:
        log.warning("no local tokenizer for %s (%s): routing on approximate text blocks", model, exc)
        return ApproximateTokenizer()
