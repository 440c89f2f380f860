"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Messages go down the one request path (gateway/handler.py) with the Anthropic front end;
``count_tokens`` runs its first half (auth, parse, normalize, template and tokenize) and answers
the count the router and the caps use, without routing anything.
"""

from aiohttp import web

from gateway.admission.input_limits import check_input
from gateway.anthropic.errors import anthropic_error_response
from gateway.anthropic.front_end import AnthropicFrontEnd
from gateway.anthropic.request import prompt_body
from gateway.errors import OpenAIError
from gateway.handler import client_request_id, handle_completion, read_json
from gateway.openai_request import Endpoint, parse_request
from gateway.wiring.state import GATEWAY
from protocol.anthropic import CountTokensRequest, validate_anthropic


async def messages(request: web.Request) -> web.StreamResponse:
    block_size = request.app[GATEWAY].config.block_size
    return await handle_completion(request, Endpoint.CHAT, AnthropicFrontEnd(block_size))


async def count_tokens(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    request_id = client_request_id(request)
    try:
        tenant = gateway.tenants.authenticate(request)
        anthropic = validate_anthropic(await read_json(request, gateway), CountTokensRequest)
        parsed = parse_request(prompt_body(anthropic).body, Endpoint.CHAT)
        check_input(parsed.body, gateway.config.limits)
        model = gateway.models.resolve(parsed.model, gateway.pool.reported_adapters()).served
        normalized = await model.normalizer.apply_async(parsed.body)
        bound = gateway.limits.prompt_bound(model.name, tenant.caps)
        async with gateway.tokenize_slots.hold(tenant.name):
            prompts = await model.token_ids(normalized.body, parsed, tenant.cache_salt(None), bound.check)
    except OpenAIError as error:
        return anthropic_error_response(error, {"x-request-id": request_id})
    return web.json_response({"input_tokens": len(prompts[0].ids)}, headers={"x-request-id": request_id})
