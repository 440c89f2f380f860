"""The request path of the gateway, top to bottom as DESIGN.md draws it."""

import uuid

import orjson
from aiohttp import web

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
    try:
        parsed = parse_request(await read_json(request), endpoint)
        model = gateway.models.get(parsed.model)
        normalized = model.normalizer.apply(parsed.body)
        token_ids = await model.token_ids(normalized.body, endpoint)
        route_request = RouteRequest(
            request_id=request_id,
            model=model.name,
            block_hashes=block_hashes(token_ids, gateway.config.block_size, model.name, parsed.cache_salt),
            prompt_tokens=len(token_ids),
            max_tokens=parsed.max_tokens or gateway.default_max_tokens(endpoint),
            session_key=request.headers.get("x-session-id") or parsed.user,
            cache_salt=parsed.cache_salt,
            token_ids=token_ids,
        )
        dispatched = await gateway.dispatcher.dispatch(
            route_request,
            path=endpoint.value,
            body=normalized.body,
            stream=parsed.stream,
            include_usage=parsed.include_usage,
            headers=response_headers(request_id, normalized.changed),
            client_request=request,
        )
    except OpenAIError as error:
        return error.response({"x-request-id": request_id})
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
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "kvgate"} for name in gateway.models.models]
    return web.json_response({"object": "list", "data": data}, dumps=lambda value: orjson.dumps(value).decode())


async def health(request: web.Request) -> web.Response:
    """Liveness of the gateway itself, with the replicas it can reach right now."""
    gateway: Gateway = request.app[GATEWAY]
    healthy = [backend.name for backend in gateway.pool.backends.values() if backend.healthy]
    return web.json_response({"status": "ok", "healthy_backends": healthy})
