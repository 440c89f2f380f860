"""The Messages API as a front end of the request path (gateway/front_end.py): one object per request."""

from typing import Any

import orjson
from aiohttp import web

from gateway.anthropic.errors import anthropic_error_response, error_body, message_of_openai_error, with_request_id
from gateway.anthropic.request import Translated, chat_body, check_stop_sequences, prefix_messages
from gateway.anthropic.response import CacheAccounting, message_id, whole_message
from gateway.anthropic.stream import AnthropicEventStream, StreamTranslator
from gateway.dispatch import NativeForm
from gateway.errors import OpenAIError
from gateway.openai_request import Endpoint, ParsedRequest, parse_request
from gateway.served_model import ServedModel
from protocol.anthropic import MessagesRequest, validate_anthropic


class AnthropicFrontEnd:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.request: MessagesRequest | None = None
        self.translated: Translated | None = None
        self.breakpoint_tokens = 0
        self.prompt_tokens = 0
        self.received: dict[str, Any] = {}
        self.native = False
        """The replica that answers serves /v1/messages itself: its answer is relayed, not translated."""

    def parse(self, body: object) -> ParsedRequest:
        self.request = validate_anthropic(body, MessagesRequest)
        check_stop_sequences(self.request.stop_sequences)
        self.received = body if isinstance(body, dict) else {}
        self.translated = chat_body(self.request)
        return parse_request(self.translated.body, Endpoint.CHAT)

    async def prompt_known(
        self, model: ServedModel, body: dict[str, Any], salt: str | None, prompt_ids: list[int]
    ) -> None:
        """Count the prompt's tokens up to the last breakpoint: the prompt's common prefix with the
        chat rendered only that far (the template's closing of it is not part of the prompt)."""
        self.prompt_tokens = len(prompt_ids)
        breakpoint = self.translated.breakpoint if self.translated else None
        messages = body.get("messages") or []
        if breakpoint is None or breakpoint.message >= len(messages):
            return
        text = model.tokenizer.render_chat(prefix_messages(messages, breakpoint), body.get("tools"))
        prefix = (await model.tokenizer.encode_prompt_async(text, salt)).ids
        common = 0
        for ours, theirs in zip(prefix, prompt_ids, strict=False):
            if ours != theirs:
                break
            common += 1
        self.breakpoint_tokens = common

    @property
    def accounting(self) -> CacheAccounting:
        ttl = self.translated.ttl if self.translated else None
        return CacheAccounting(self.breakpoint_tokens, self.block_size, ttl)

    @property
    def stop_sequences(self) -> list[str]:
        return (self.request.stop_sequences if self.request else None) or []

    @property
    def model(self) -> str:
        return self.request.model if self.request else ""

    def stream_response(self, *, status: int, headers: dict[str, str]) -> web.StreamResponse:
        translator = StreamTranslator(
            message_id(), self.model, self.prompt_tokens, self.stop_sequences, self.accounting
        )
        return AnthropicEventStream(translator, status=status, headers=with_request_id(headers))

    def native_form(self, forwarded: dict[str, Any]) -> NativeForm:
        """The client's body as it came, with what routing and admission decided: the model as the
        replica knows it, the granted ``max_tokens`` and the tenant's ``cache_salt``. Normalization is
        not applied to it (see docs/anthropic.md)."""
        body = {**self.received, "model": forwarded["model"], "max_tokens": forwarded["max_tokens"]}
        if "cache_salt" in forwarded:
            body["cache_salt"] = forwarded["cache_salt"]
        return NativeForm("/v1/messages", body, "anthropic", self.native_stream_response, self._chosen)

    def _chosen(self, native: bool) -> None:
        self.native = native

    def native_stream_response(self, *, status: int, headers: dict[str, str]) -> web.StreamResponse:
        return web.StreamResponse(status=status, headers=with_request_id(_relayed(headers)))

    def finish(self, response: web.StreamResponse) -> web.StreamResponse:
        if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
            return response
        headers = {key: value for key, value in response.headers.items() if key.lower() != "content-type"}
        headers = with_request_id(_relayed(headers) if self.native else headers)
        status = response.status
        try:
            completion = orjson.loads(response.body) if status == 200 else None
        except orjson.JSONDecodeError:
            completion, status = None, 502
        if isinstance(completion, dict) and self.native:
            body = {**completion, "model": self.model}
        elif isinstance(completion, dict):
            body = whole_message(completion, self.model, self.stop_sequences, self.accounting)
        else:
            message = message_of_openai_error(response.body) if status != 200 else "backend answered no JSON object"
            status = 502 if status == 200 else status
            body = error_body(status, message, headers.get("x-request-id"))
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)

    def error_response(self, error: OpenAIError, extra_headers: dict[str, str]) -> web.Response:
        return anthropic_error_response(error, extra_headers)


def _relayed(headers: dict[str, str]) -> dict[str, str]:
    """Headers for a relayed native answer: no ``x-kvgate-normalized``, as the replica got the body unnormalized."""
    return {key: value for key, value in headers.items() if key.lower() != "x-kvgate-normalized"}
