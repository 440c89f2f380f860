"""One request's way from Envoy's headers and body to what routing needs: the HTTP gateway's own
steps (gateway/request_path.py), fed from ext_proc headers and a body Envoy streamed instead of an
aiohttp request.
"""

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from multidict import CIMultiDictProxy

from gateway.admission.tenants import Tenant
from gateway.errors import OpenAIError
from gateway.gateway_request import GatewayRequest
from gateway.openai_request import Endpoint
from gateway.request_path import parse_json_body, prepare_route
from gateway.routing.types import RouteRequest
from gateway.routing_core import RoutingCore

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
    received = await parse_json_body(raw, core.config.limits)
    prepared = await prepare_route(core, req, tenant, endpoint, received, headers.get)
    body = prepared.body
    return PreparedRequest(prepared.route, body, changed=body is not received and body != received)
