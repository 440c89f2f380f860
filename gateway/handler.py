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

import orjson
from aiohttp import web
from opentelemetry import trace as otel

from gateway.dispatch import Forwarding
from gateway.errors import OpenAIError, bad_request, error_response
from gateway.front_end import FrontEnd
from gateway.gateway_request import GatewayRequest
from gateway.openai_request import Endpoint
from gateway.request_path import parse_json_body, prepare_route
from gateway.wiring.state import GATEWAY, Gateway
from protocol.trace_context import continue_trace
from protocol.tracing import remote_parent, span, tracing_enabled

_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
"""An `x-request-id` the gateway echoes and logs; any other gets an id of the gateway's own."""


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
            received = await read_json(request, gateway)
            prepared = await prepare_route(
                gateway, req, tenant, endpoint, received, partial(header_text, request), front
            )
            body = prepared.body
            forwarding = req.forwarding = Forwarding(
                path=endpoint.value,
                body=body,
                stream=prepared.parsed.stream,
                include_usage=prepared.parsed.include_usage,
                headers=response_headers(req.request_id, prepared.normalized.changed),
                client_request=request,
                upstream_headers=trace.headers(),
                stream_format="responses" if endpoint is Endpoint.RESPONSES else "chat",
                stream_response=front.stream_response if front else web.StreamResponse,
                native=front.native_form(body) if front else None,
            )
            dispatched = await gateway.dispatcher.dispatch(prepared.route, tenant, forwarding, priority)
    except OpenAIError as error:
        gateway.telemetry.observe_rejection(req, error)
        return (front.error_response if front else error_response)(error, {"x-request-id": req.request_id})
    except asyncio.CancelledError:
        gateway.telemetry.observe_client_gone(req)
        raise
    gateway.telemetry.observe_completion(req, dispatched)
    return front.finish(dispatched.response) if front else dispatched.response


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
    return await parse_json_body(raw, gateway.config.limits)


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
