"""Per served model: how its requests are normalized and tokenized; and what a client's `model` names.

A client may name a served model, an alias of one (`model_aliases:`), or a LoRA adapter some
backend declares (`adapters:`) or lists in its /v1/models; the registry resolves each to a
``ModelTarget``.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.block_hash_memo import BlockHashMemo
from gateway.config import KvgateConfig
from gateway.errors import bad_request, model_not_found
from gateway.openai_request import Endpoint, ParsedRequest
from normalize.chat_tokenizer import TemplateError
from normalize.normalizer import Normalizer
from normalize.prompt_tokenizer import PromptTokenizer, load_tokenizer
from normalize.segment_tokenizer import EncodedPrompt
from protocol.openai import ResponsesRequest, responses_chat_tools, responses_messages, validate


@dataclass
class ServedModel:
    name: str
    normalizer: Normalizer
    tokenizer: PromptTokenizer
    hash_memo: BlockHashMemo = field(default_factory=BlockHashMemo)

    async def token_ids(
        self, body: dict[str, Any], request: ParsedRequest, salt: str | None, check_bound: Callable[[int], None]
    ) -> list[EncodedPrompt]:
        """The prompt's token ids exactly as the backend will see them (with the known prefixes the
        block-hash memo reuses): one ``EncodedPrompt`` per prompt or input.

        ``check_bound`` gets a lower bound on the count first and raises to refuse a prompt that
        cannot fit, before the tokenizer runs; ``salt`` keeps cached segments per isolation domain.
        A Responses request is rendered as chat messages (``instructions`` first) through the chat
        template, as the backend renders it: from ``body``, normalized as chat messages are, with its
        function tools in chat's shape. Several completion prompts count together toward the
        bound; embedding inputs each on their own (the context applies per input).
        """
        if request.endpoint is Endpoint.CHAT:
            return [await self._chat_ids(body["messages"], body.get("tools"), salt, check_bound, "messages")]
        if isinstance(request.parsed, ResponsesRequest):
            messages = responses_messages(_as_forwarded(request.parsed, request.body, body))
            tools = responses_chat_tools(body.get("tools"))
            return [await self._chat_ids(messages, tools, salt, check_bound, "input")]
        cumulative = request.endpoint is Endpoint.COMPLETIONS
        prompts: list[EncodedPrompt] = []
        counted = 0
        for item in _one_or_many(body["prompt" if cumulative else "input"]):
            if isinstance(item, list):
                check_bound(counted + len(item))
                prompts.append(EncodedPrompt(item))
            else:
                check_bound(counted + self.tokenizer.min_tokens(str(item)))
                prompts.append(await self.tokenizer.encode_prompt_async(str(item), salt))
            counted += len(prompts[-1].ids) if cumulative else 0
        return prompts

    async def _chat_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        salt: str | None,
        check_bound: Callable[[int], None],
        param: str,
    ) -> EncodedPrompt:
        check_bound(self.tokenizer.min_chat_tokens(messages))
        try:
            text = self.tokenizer.render_chat(messages, tools)
        except TemplateError as exc:
            raise bad_request(str(exc), param=param) from None
        check_bound(self.tokenizer.min_tokens(text))
        return await self.tokenizer.encode_prompt_async(text, salt)


def _as_forwarded(parsed: ResponsesRequest, sent: dict[str, Any], body: dict[str, Any]) -> ResponsesRequest:
    """The Responses request as forwarded: ``parsed`` itself unless normalization changed its
    ``instructions`` or ``input`` (the normalizer keeps what it did not change as the same object).
    A 400 if the rules left nothing of it (a whitespace-only `input` with user messages normalized)."""
    if all(body.get(key) is sent.get(key) for key in ("instructions", "input")):
        return parsed
    return validate(body, ResponsesRequest)


def _one_or_many(value: Any) -> list[Any]:
    """A prompt or input given as one text or token list, or as a list of them."""
    if isinstance(value, str) or not value or isinstance(value[0], int):
        return [value]
    return list(value)


@dataclass(frozen=True)
class ModelTarget:
    """What a client's `model` resolves to: the served model, and the LoRA adapter if it named one."""

    requested: str
    served: ServedModel
    adapter: str | None = None

    @property
    def upstream_name(self) -> str:
        """The `model` the backend is sent: the adapter's name, else the served model's (aliases resolved)."""
        return self.adapter or self.served.name


class ModelRegistry:
    """The models clients may name, each with its tokenizer and normalizer, their aliases and adapters."""

    def __init__(
        self,
        models: dict[str, ServedModel],
        aliases: dict[str, str] | None = None,
        adapters: dict[str, str] | None = None,
    ) -> None:
        self.models = models
        self.aliases = aliases or {}
        self.adapters = adapters or {}
        """Adapter name -> the served model it adapts."""
        self.created = int(time.time())
        """The ``created`` of every model object: when this config was loaded (stable between loads)."""

    @classmethod
    def from_config(cls, config: KvgateConfig) -> "ModelRegistry":
        normalizer = Normalizer(config.normalize)
        tokenizer_of = {config.backend_model(backend): backend.tokenizer for backend in config.backends}
        tokenizer_of[config.model] = config.tokenizer or tokenizer_of.get(config.model)
        models = {
            name: ServedModel(name, normalizer, load_tokenizer(name, tokenizer))
            for name, tokenizer in tokenizer_of.items()
        }
        adapters = {
            adapter: config.backend_model(backend) for backend in config.backends for adapter in backend.adapters
        }
        return cls(models, dict(config.model_aliases), adapters)

    def resolve(self, name: str, reported_adapters: dict[str, str] | None = None) -> ModelTarget:
        """The target `name` stands for; ``reported_adapters`` are those replicas list (adapter -> model)."""
        target = self.aliases.get(name, name)
        if target in self.models:
            return ModelTarget(name, self.models[target])
        base = self.adapters.get(target) or (reported_adapters or {}).get(target)
        if base is not None and base in self.models:
            return ModelTarget(name, self.models[base], adapter=target)
        raise model_not_found(name)

    def get(self, name: str) -> ServedModel:
        return self.resolve(name).served

    def listing(
        self, reported_adapters: dict[str, str], context_length: Callable[[str], int | None] = lambda _: None
    ) -> list[dict[str, Any]]:
        """`/v1/models` entries: served models, then adapters (with their `parent`), then aliases; each
        with its `root` (the model it runs on) and the `max_model_len` its replicas report (None: unknown)."""
        entries: list[dict[str, Any]] = [{"id": name, "root": name, "parent": None} for name in self.models]
        adapters = {**reported_adapters, **self.adapters}
        entries += [{"id": adapter, "root": base, "parent": base} for adapter, base in sorted(adapters.items())]
        entries += [
            {"id": alias, "root": target, "parent": None, "alias_of": target} for alias, target in self.aliases.items()
        ]
        return [
            {
                **entry,
                "object": "model",
                "created": self.created,
                "owned_by": "kvgate",
                "max_model_len": context_length(entry["root"]),
            }
            for entry in entries
        ]
