"""One request's way from Envoy's headers and body to what routing needs, on the gateway's own steps.

The same steps, in the same order and with the same objects, as ``_handle`` in gateway/handler.py:
parse and validate, resolve the model, normalize, name the session, tokenize under the tenant's
tokenize slot within the prompt bound, apply the caps, build the forwarded body (granted limit,
upstream model, cache salt) and the block hashes. What differs is only where the request comes
from: ext_proc headers and a body Envoy streamed, instead of an aiohttp request.
"""

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from multidict import CIMultiDictProxy

from gateway.admission.forwarded_body import forwarded_body
from gateway.admission.input_limits import check_input, check_raw_body
from gateway.admission.tenants import Tenant
from gateway.epp.core import RoutingCore
from gateway.errors import OpenAIError, bad_request
from gateway.gateway_request import GatewayRequest
from gateway.openai_request import Endpoint, parse_request
from gateway.routing.cache_keys import named_session
from gateway.routing.retention_keys import client_session_key
from gateway.routing.types import RouteRequest

OFFLOAD_BODY_BYTES = 1 << 20
"""Bodies larger than this have their containers counted on a worker thread, as the HTTP gateway does."""

_LIMIT_KEYS = {Endpoint.RESPONSES: "max_output_tokens"}
_ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}


@dataclass
class PreparedRequest:
    route: RouteRequest
    body: dict[str, Any]
    """What the replica should get: the normalized body with the granted limit and the upstream model."""
    changed: bool
    """Whether ``body`` differs from what the client sent (normalized, capped or renamed)."""


def endpoint_of(headers: CIMultiDictProxy[str]) -> Endpoint:
    """The OpenAI endpoint the ``:path`` names; 404 for a path the picker does not route."""
    path = urlsplit(headers.get(":path", "")).path
    method = headers.get(":method", "POST")
    endpoint = _ENDPOINTS.get(path)
    if endpoint is None or method != "POST":
        routed = ", ".join(_ENDPOINTS)
        raise OpenAIError(404, f"kvgate epp routes POST {routed}, not {method} {path}", code="not_found")
    return endpoint


async def prepare(
    core: RoutingCore,
    req: GatewayRequest,
    tenant: Tenant,
    endpoint: Endpoint,
    headers: CIMultiDictProxy[str],
    raw: bytes,
) -> PreparedRequest:
    """Fill ``req`` in step by step (parsed, target, normalized, prompts, route) and return the route."""
    received = await _json_body(core, raw)
    parsed = req.parsed = parse_request(received, endpoint)
    check_input(parsed.body, core.config.limits)
    target = req.target = core.models.resolve(parsed.model, core.pool.reported_adapters())
    model = target.served
    cache_salt = tenant.cache_salt(parsed.cache_salt)
    normalized = req.normalized = await model.normalizer.apply_async(
        parsed.body, responses=endpoint is Endpoint.RESPONSES
    )
    session = named_session(headers.get, core.config.routing.session_headers, parsed.body, parsed.user)
    bound = core.limits.prompt_bound(model.name, tenant.caps)
    async with core.tokenize_slots.hold(tenant.name):
        req.prompts = await model.token_ids(normalized.body, parsed, cache_salt, bound.check)
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
        body = normalized.body
        if body.get("model") != target.upstream_name:
            body = {**body, "model": target.upstream_name}
        hashes, output_tokens = [], 0
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
    return PreparedRequest(route, body, changed=body is not received and body != received)


async def _json_body(core: RoutingCore, raw: bytes) -> object:
    """The body as JSON, bounded before it is parsed (the HTTP gateway's ``read_json`` rules)."""
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object")
    if len(raw) > OFFLOAD_BODY_BYTES:
        await asyncio.to_thread(check_raw_body, raw, core.config.limits)
    else:
        check_raw_body(raw, core.config.limits)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
