"""The request path of the gateway, top to bottom as the README's "What runs where" draws it."""

import time
import uuid

import orjson
from aiohttp import web

from gateway.admission.forwarded_body import forwarded_body
from gateway.admission.input_limits import check_input
from gateway.admission.tenants import Tenant
from gateway.dispatch import Forwarding
from gateway.errors import OpenAIError, bad_request
from gateway.openai_request import Endpoint, parse_request
from gateway.routing.types import RouteRequest
from gateway.state import GATEWAY, Gateway
from radix.hashing import block_hashes


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await handle_completion(request, Endpoint.COMPLETIONS)


async def handle_completion(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    request_id = request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex}"
    started = time.perf_counter()
    tenant: Tenant | None = None
    try:
        tenant = gateway.tenants.authenticate(request)
        parsed = parse_request(await read_json(request), endpoint)
        check_input(parsed.body, gateway.config.limits)
        model = gateway.models.get(parsed.model)
        normalized = model.normalizer.apply(parsed.body)
        token_ids = await model.token_ids(normalized.body, endpoint)
        grant = gateway.limits.check(
            model.name, tenant.caps, len(token_ids), parsed.max_tokens, gateway.default_max_tokens(endpoint)
        )
        cache_salt = tenant.cache_salt(parsed.cache_salt)
        route_request = RouteRequest(
            request_id=request_id,
            model=model.name,
            block_hashes=block_hashes(token_ids, gateway.config.block_size, model.name, cache_salt),
            prompt_tokens=len(token_ids),
            max_tokens=grant.max_tokens,
            session_key=request.headers.get("x-session-id") or parsed.user,
            cache_salt=cache_salt,
            token_ids=token_ids,
        )
        forwarding = Forwarding(
            path=endpoint.value,
            body=forwarded_body(normalized.body, grant, cache_salt),
            stream=parsed.stream,
            include_usage=parsed.include_usage,
            headers=response_headers(request_id, normalized.changed),
            client_request=request,
        )
        dispatched = await gateway.dispatcher.dispatch(route_request, tenant, forwarding)
    except OpenAIError as error:
        gateway.telemetry.observe_rejection(request_id, error, tenant.name if tenant else None, started)
        return error.response({"x-request-id": request_id})
    gateway.telemetry.observe_completion(
        route_request, model, normalized, parsed.stream, dispatched, tenant.name, started
    )
    return dispatched.response


async def read_json(request: web.Request) -> object:
    """The body as JSON; size limits are aiohttp's client_max_size (413 in the error middleware)."""
    raw = await request.read()
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object")
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
    gateway: Gateway = request.app[GATEWAY]
    gateway.tenants.authenticate(request)
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "kvgate"} for name in gateway.models.models]
    return web.json_response({"object": "list", "data": data}, dumps=lambda value: orjson.dumps(value).decode())


async def health(request: web.Request) -> web.Response:
    """Liveness of the gateway itself, with the replicas it can reach right now."""
    gateway: Gateway = request.app[GATEWAY]
    healthy = [backend.name for backend in gateway.pool.backends.values() if backend.healthy]
    return web.json_response({"status": "ok", "healthy_backends": healthy})
