"""Per served model: how its requests are normalized and tokenized."""

from dataclasses import dataclass
from typing import Any

from gateway.config import KvgateConfig
from gateway.errors import bad_request, model_not_found
from gateway.openai_request import Endpoint
from normalize.chat_tokenizer import ChatTokenizer, TemplateError
from normalize.normalizer import Normalizer
from normalize.segment_tokenizer import SegmentTokenizer


@dataclass
class ServedModel:
    name: str
    normalizer: Normalizer
    tokenizer: SegmentTokenizer

    async def token_ids(self, body: dict[str, Any], endpoint: Endpoint) -> list[int]:
        """The prompt's token ids exactly as the backend will see them."""
        try:
            if endpoint is Endpoint.CHAT:
                return await self.tokenizer.encode_chat_async(body["messages"], body.get("tools"))
            prompt = body["prompt"]
            return prompt if isinstance(prompt, list) else self.tokenizer.encode_prompt(prompt)
        except TemplateError as exc:
            raise bad_request(str(exc), param="messages") from None


class ModelRegistry:
    """The models clients may name, each with its tokenizer and normalizer."""

    def __init__(self, models: dict[str, ServedModel]) -> None:
        self.models = models

    @classmethod
    def from_config(cls, config: KvgateConfig) -> "ModelRegistry":
        normalizer = Normalizer(config.normalize)
        tokenizer_of = {backend.model or config.model: backend.tokenizer for backend in config.backends}
        tokenizer_of[config.model] = config.tokenizer or tokenizer_of.get(config.model)
        models = {
            name: ServedModel(name, normalizer, SegmentTokenizer(ChatTokenizer.load(tokenizer or name)))
            for name, tokenizer in tokenizer_of.items()
        }
        return cls(models)

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise model_not_found(name)
        return model
