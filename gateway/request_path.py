"""A request's way from its JSON body to what routing and forwarding need: the steps the HTTP
handler (gateway/handler.py) and the endpoint picker (gateway/epp/) share, in one order.

Parse and validate, resolve the model, normalize, name the session, tokenize under the tenant's
tokenize slot within the prompt bound, apply the caps, then build the forwarded body (granted
limit, upstream model, cache salt), the block hashes and the ``RouteRequest``. Each step fills in
its part of the ``GatewayRequest``, so a refusal at any step is recorded with what was known.
"""

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.admission.config import LimitsConfig
from gateway.admission.forwarded_body import forwarded_body
from gateway.admission.input_limits import check_input, check_raw_body
from gateway.admission.tenants import Tenant
from gateway.errors import bad_request
from gateway.front_end import FrontEnd
from gateway.gateway_request import GatewayRequest
from gateway.openai_request import Endpoint, ParsedRequest, parse_request
from gateway.routing.cache_keys import named_session
from gateway.routing.retention_keys import client_session_key
from gateway.routing.types import RouteRequest
from gateway.routing_core import RoutingCore
from gateway.served_model import ModelTarget
from normalize.normalizer import NormalizedRequest
from protocol.tracing import span

OFFLOAD_BODY_BYTES = 1 << 20
"""Bodies larger than this have their containers counted on a worker thread (numpy releases the GIL)."""

_LIMIT_KEYS = {Endpoint.RESPONSES: "max_output_tokens"}
"""The body field that carries a granted token limit, where it is not ``max_tokens``."""


@dataclass(frozen=True)
class PreparedRoute:
    route: RouteRequest
    body: dict[str, Any]
    """What the replica gets: the normalized body with the granted limit, the upstream model and
    the cache salt."""
    parsed: ParsedRequest
    normalized: NormalizedRequest


async def parse_json_body(raw: bytes, limits: LimitsConfig) -> object:
    """The body as JSON, its containers, values and keys bounded before it is parsed."""
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object")
    if len(raw) > OFFLOAD_BODY_BYTES:
        await asyncio.to_thread(check_raw_body, raw, limits)
    else:
        check_raw_body(raw, limits)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None


async def prepare_route(
    core: RoutingCore,
    req: GatewayRequest,
    tenant: Tenant,
    endpoint: Endpoint,
    received: object,
    header: Callable[[str], str | None],
    front: FrontEnd | None = None,
) -> PreparedRoute:
    """The route request and the body the replica should get; fills in ``req`` step by step.
    ``header`` reads the client's headers (session headers); ``front`` is another API's front
    end (Anthropic's), None for OpenAI's."""
    with span("gateway.normalize"):
        parsed = req.parsed = front.parse(received) if front else parse_request(received, endpoint)
        check_input(parsed.body, core.config.limits)
        target = req.target = core.models.resolve(parsed.model, core.pool.reported_adapters())
        model = target.served
        cache_salt = tenant.cache_salt(parsed.cache_salt)
        normalized = req.normalized = await model.normalizer.apply_async(
            parsed.body, responses=endpoint is Endpoint.RESPONSES
        )
        session = named_session(header, core.config.routing.session_headers, parsed.body, parsed.user)
    bound = core.limits.prompt_bound(model.name, tenant.caps)
    with span("gateway.tokenize"):
        async with core.tokenize_slots.hold(tenant.name):
            req.prompts = await model.token_ids(normalized.body, parsed, cache_salt, bound.check)
            if front:
                await front.prompt_known(model, normalized.body, cache_salt, req.prompts[0].ids)
    prompt_tokens = sum(len(prompt.ids) for prompt in req.prompts)
    if parsed.generates:
        grant = core.limits.check(
            model.name, tenant.caps, prompt_tokens, parsed.max_tokens, core.default_max_tokens(endpoint), parsed.n
        )
        limit_key = _LIMIT_KEYS.get(endpoint, "max_tokens")
        body = forwarded_body(normalized.body, grant, cache_salt, limit_key, model=target.upstream_name)
        hashes = model.hash_memo.block_hashes(
            req.prompts[0], core.config.block_size, model.name, cache_salt, target.adapter
        )
        output_tokens = grant.max_tokens * parsed.n * len(req.prompts)
    else:
        longest = max(len(prompt.ids) for prompt in req.prompts)
        core.limits.check_prompt(model.name, tenant.caps, prompt_tokens, longest)
        body, hashes, output_tokens = _named_upstream(normalized.body, target), [], 0
    route = req.route = RouteRequest(
        request_id=f"gw-{secrets.token_hex(16)}",
        model=model.name,
        block_hashes=hashes,
        prompt_tokens=prompt_tokens,
        max_tokens=output_tokens,
        session_key=client_session_key(tenant.name, cache_salt, session.key if session else None),
        session_source=session.source if session else None,
        cache_salt=cache_salt,
        token_ids=req.prompts[0].ids,
        adapter=target.adapter,
        tenant=tenant.name,
    )
    return PreparedRoute(route, body, parsed, normalized)


def _named_upstream(body: dict[str, Any], target: ModelTarget) -> dict[str, Any]:
    """The body with `model` as the backend knows it (an alias resolved to its model or adapter)."""
    return body if body.get("model") == target.upstream_name else {**body, "model": target.upstream_name}
