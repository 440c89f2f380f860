"""The request path of the gateway, top to bottom as the README's "What runs where" draws it.

Every request is recorded once (request log, metrics) however it ends: answered, refused, or
abandoned by its client (aiohttp cancels the handler; the record says ``client_gone``).

One path serves chat, completions, responses and embeddings. A request with ``n`` samples is
routed once: its prompt counts once toward the caps, its output ``n x max_tokens`` toward the
token and KV budgets. Embeddings generate nothing and share no prefix cache, so they are routed
on load alone (no block hashes) under the same prompt caps and tenants.
"""

import asyncio
import re
import secrets
from functools import partial
from typing import Any

import orjson
from aiohttp import web
from opentelemetry import trace as otel

from gateway.admission.forwarded_body import forwarded_body
from gateway.admission.input_limits import check_input, check_raw_body
from gateway.dispatch import Forwarding
from gateway.errors import OpenAIError, bad_request, error_response
from gateway.front_end import FrontEnd
from gateway.gateway_request import GatewayRequest
from gateway.openai_request import Endpoint, parse_request
from gateway.routing.cache_keys import named_session
from gateway.routing.retention_keys import client_session_key
from gateway.routing.types import RouteRequest
from gateway.served_model import ModelTarget
from gateway.state import GATEWAY, Gateway
from protocol.trace_context import continue_trace
from protocol.tracing import remote_parent, span, tracing_enabled

OFFLOAD_BODY_BYTES = 1 << 20
"""Bodies larger than this have their containers counted on a worker thread (numpy releases the GIL)."""

_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
"""An `x-request-id` the gateway echoes and logs; any other gets an id of the gateway's own."""

_LIMIT_KEYS = {Endpoint.RESPONSES: "max_output_tokens"}
"""The body field that carries a granted token limit, where it is not ``max_tokens``."""


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.COMPLETIONS)


async def responses(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.RESPONSES)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.EMBEDDINGS)


async def handle_completion(
    request: web.Request, endpoint: Endpoint, front: FrontEnd | None = None
) -> web.StreamResponse:
    """One request, under a `kvgate.request` span continuing the caller's trace when tracing is on.

    ``front``: the protocol front end that translates the request and its answer (gateway/front_end.py);
    None for OpenAI's API, which the core speaks."""
    if not tracing_enabled():
        return await _handle(request, endpoint, None, front)
    with span("kvgate.request", context=remote_parent(request.headers), kind=otel.SpanKind.SERVER) as root:
        assert root is not None
        root.set_attribute("kvgate.endpoint", endpoint.value)
        return await _handle(request, endpoint, root, front)


async def _handle(
    request: web.Request, endpoint: Endpoint, root: otel.Span | None, front: FrontEnd | None
) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    trace = continue_trace(request.headers)
    trace_id = trace.trace_id if root is None else format(root.get_span_context().trace_id, "032x")
    req = GatewayRequest(client_request_id(request), trace_id)
    try:
        with span("gateway.auth"):
            tenant = req.tenant = gateway.tenants.authenticate(request)
            priority = tenant.priority(request.headers)
        async with tenant.hold_slot():
            with span("gateway.normalize"):
                received = await read_json(request, gateway)
                parsed = req.parsed = front.parse(received) if front else parse_request(received, endpoint)
                check_input(parsed.body, gateway.config.limits)
                target = req.target = gateway.models.resolve(parsed.model, gateway.pool.reported_adapters())
                model = target.served
                cache_salt = tenant.cache_salt(parsed.cache_salt)
                normalized = req.normalized = await model.normalizer.apply_async(
                    parsed.body, responses=endpoint is Endpoint.RESPONSES
                )
                session = named_session(
                    partial(header_text, request), gateway.config.routing.session_headers, parsed.body, parsed.user
                )
            bound = gateway.limits.prompt_bound(model.name, tenant.caps)
            with span("gateway.tokenize"):
                async with gateway.tokenize_slots.hold(tenant.name):
                    req.prompts = await model.token_ids(normalized.body, parsed, cache_salt, bound.check)
                    if front:
                        await front.prompt_known(model, normalized.body, cache_salt, req.prompts[0].ids)
            prompt_tokens = sum(len(prompt.ids) for prompt in req.prompts)
            if parsed.generates:
                grant = gateway.limits.check(
                    model.name,
                    tenant.caps,
                    prompt_tokens,
                    parsed.max_tokens,
                    gateway.default_max_tokens(endpoint),
                    parsed.n,
                )
                limit_key = _LIMIT_KEYS.get(endpoint, "max_tokens")
                body = forwarded_body(normalized.body, grant, cache_salt, limit_key, model=target.upstream_name)
                hashes = model.hash_memo.block_hashes(
                    req.prompts[0], gateway.config.block_size, model.name, cache_salt, target.adapter
                )
                output_tokens = grant.max_tokens * parsed.n * len(req.prompts)
            else:
                longest = max(len(prompt.ids) for prompt in req.prompts)
                gateway.limits.check_prompt(model.name, tenant.caps, prompt_tokens, longest)
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
            forwarding = req.forwarding = Forwarding(
                path=endpoint.value,
                body=body,
                stream=parsed.stream,
                include_usage=parsed.include_usage,
                headers=response_headers(req.request_id, normalized.changed),
                client_request=request,
                upstream_headers=trace.headers(),
                stream_format="responses" if endpoint is Endpoint.RESPONSES else "chat",
                stream_response=front.stream_response if front else web.StreamResponse,
                native=front.native_form(body) if front else None,
            )
            dispatched = await gateway.dispatcher.dispatch(route, tenant, forwarding, priority)
    except OpenAIError as error:
        gateway.telemetry.observe_rejection(req, error)
        return (front.error_response if front else error_response)(error, {"x-request-id": req.request_id})
    except asyncio.CancelledError:
        gateway.telemetry.observe_client_gone(req)
        raise
    gateway.telemetry.observe_completion(req, dispatched)
    return front.finish(dispatched.response) if front else dispatched.response


def _named_upstream(body: dict[str, Any], target: ModelTarget) -> dict[str, Any]:
    """The body with `model` as the backend knows it (an alias resolved to its model or adapter)."""
    return body if body.get("model") == target.upstream_name else {**body, "model": target.upstream_name}


def client_request_id(request: web.Request) -> str:
    """The client's `x-request-id` when it is a plain token, else one of the gateway's own.

    It is only echoed and logged: the gateway keys its own state by ids it makes itself, so two
    requests that send the same id never share anything.
    """
    given = request.headers.get("x-request-id", "")
    return given if _CLIENT_REQUEST_ID.fullmatch(given) else f"req-{secrets.token_hex(16)}"


def header_text(request: web.Request, name: str) -> str | None:
    """A header as text; bytes that are not UTF-8 become U+FFFD instead of failing later."""
    value = request.headers.get(name)
    return None if value is None else value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


async def read_json(request: web.Request, gateway: Gateway) -> object:
    """The body as JSON, read within `timeouts.client_body_s` (408) and bounded before it is parsed.

    The size limit is aiohttp's client_max_size (413); a body aiohttp cannot decompress is a 400.
    Both are raised as OpenAIError so the request is recorded like any other refusal.
    """
    timeout_s = gateway.config.timeouts.client_body_s
    try:
        if request.content.is_eof():  # the body arrived with the head: no wait, so no timer to arm
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()
    except TimeoutError:
        raise OpenAIError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None
    except web.RequestPayloadError:
        raise bad_request("The request body could not be read or decompressed.") from None
    except web.HTTPRequestEntityTooLarge as exc:
        raise OpenAIError(413, exc.text or "The request body is too large.", code="request_too_large") from None
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object")
    if len(raw) > OFFLOAD_BODY_BYTES:
        await asyncio.to_thread(check_raw_body, raw, gateway.config.limits)
    else:
        check_raw_body(raw, gateway.config.limits)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None


def response_headers(request_id: str, normalized_rules: list[str]) -> dict[str, str]:
    headers = {"x-request-id": request_id}
    if normalized_rules:
        headers["x-kvgate-normalized"] = ",".join(normalized_rules)
    return headers


async def list_models(request: web.Request) -> web.Response:
    """Served models, the LoRA adapters backends declare or list, and the aliases."""
    gateway: Gateway = request.app[GATEWAY]
    gateway.tenants.authenticate(request)
    data = gateway.models.listing(gateway.pool.reported_adapters(), gateway.pool.context_length)
    return web.json_response({"object": "list", "data": data}, dumps=lambda value: orjson.dumps(value).decode())


async def health(request: web.Request) -> web.Response:
    """Liveness of the gateway itself, with the replicas it can reach right now."""
    gateway: Gateway = request.app[GATEWAY]
    healthy = [backend.name for backend in gateway.pool.backends.values() if backend.healthy]
    return web.json_response({"status": "ok", "healthy_backends": healthy})
