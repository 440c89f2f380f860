"""vLLM's tokenizer endpoints at the gateway: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``.

They answer with the tokenizer the gateway routes the model with, on the text the backend would
get: a prompt or messages pass the model's normalization rules first, and ``x-kvgate-normalized``
(``true``/``false``) says whether that changed anything. The same input limits as the completion
endpoints apply (body size, nesting, messages, content length), and the tokenizer runs off the
event loop under the tenant's tokenization slots, as on the chat path.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.admission.input_limits import check_input
from gateway.errors import OpenAIError, bad_request, error_response
from gateway.handler import client_request_id, read_json
from gateway.served_model import ServedModel
from gateway.wiring.state import GATEWAY, Gateway
from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import SegmentTokenizer
from normalize.tokenizer_api import detokenize_body, tokenize_body, tokenize_text, tokenizer_info
from protocol.tokenize_api import parse_detokenize, parse_tokenize

_NORMALIZED_FIELDS = ("prompt", "messages", "tools")
"""What the normalization rules may rewrite in a ``/tokenize`` body."""


async def tokenize(request: web.Request) -> web.Response:
    async def answer(gateway: Gateway, tenant: str, received: Any) -> tuple[dict[str, Any], dict[str, str]]:
        check_input(received, gateway.config.limits)
        body = parse_tokenize(received)
        model = _served(gateway, body.model)
        chat = _chat_tokenizer(model)
        fields = {key: received[key] for key in _NORMALIZED_FIELDS if key in received}
        normalized = await model.normalizer.apply_async(fields)
        body = parse_tokenize({**received, **normalized.body}) if normalized.changed else body
        async with gateway.tokenize_slots.hold(tenant):
            text = await asyncio.to_thread(tokenize_text, body, chat)
            context = gateway.pool.context_length(model.name)
            answer = await asyncio.to_thread(tokenize_body, body, text, chat, context)
        return answer, {"x-kvgate-normalized": "true" if normalized.changed else "false"}

    return await _serve(request, answer)


async def detokenize(request: web.Request) -> web.Response:
    async def answer(gateway: Gateway, tenant: str, received: Any) -> tuple[dict[str, Any], dict[str, str]]:
        body = parse_detokenize(received)
        chat = _chat_tokenizer(_served(gateway, body.model))
        async with gateway.tokenize_slots.hold(tenant):
            return await asyncio.to_thread(detokenize_body, body, chat), {}

    return await _serve(request, answer)


async def tokenizer_info_endpoint(request: web.Request) -> web.Response:
    """The default model's tokenizer configuration (``?model=`` names another served model)."""
    gateway: Gateway = request.app[GATEWAY]
    request_id = client_request_id(request)
    try:
        gateway.tenants.authenticate(request)
        chat = _chat_tokenizer(_served(gateway, request.query.get("model")))
        info = await asyncio.to_thread(tokenizer_info, chat)
    except OpenAIError as error:
        return error_response(error, {"x-request-id": request_id})
    return _json(info, {"x-request-id": request_id})


Answer = Callable[[Gateway, str, Any], Awaitable[tuple[dict[str, Any], dict[str, str]]]]


async def _serve(request: web.Request, answer: Answer) -> web.Response:
    """Authenticate, read the body within the gateway's limits, and answer, or refuse in OpenAI's shape."""
    gateway: Gateway = request.app[GATEWAY]
    request_id = client_request_id(request)
    try:
        tenant = gateway.tenants.authenticate(request)
        received = await read_json(request, gateway)
        body, headers = await answer(gateway, tenant.name, received)
    except OpenAIError as error:
        return error_response(error, {"x-request-id": request_id})
    return _json(body, {"x-request-id": request_id, **headers})


def _served(gateway: Gateway, name: str | None) -> ServedModel:
    return gateway.models.resolve(name or gateway.config.model, gateway.pool.reported_adapters()).served


def _chat_tokenizer(model: ServedModel) -> ChatTokenizer:
    if not isinstance(model.tokenizer, SegmentTokenizer):
        raise bad_request(
            f"the gateway has no tokenizer for {model.name!r} (it routes it on approximate text blocks)",
            param="model",
            code="tokenizer_unavailable",
        )
    return model.tokenizer.chat


def _json(body: dict[str, Any], headers: dict[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)
