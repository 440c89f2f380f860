"""A pick: the request admitted and placed on a replica, holding what it holds until Envoy is done.

What the HTTP gateway holds for the length of a proxied request (gateway/dispatch.py), a pick
holds from Envoy's request phase to the end of its response (or the stream's cancellation): the
tenant's concurrency slot and token charge, the replica's slot and KV reservation, and the
router's ticket. ``settle`` gives all of it back exactly once, charging the tenant what the
answer used and telling the router, the breaker, the queue and telemetry how it ended.
"""

import asyncio
import re
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import cast

import orjson
from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.admission.forwarded_body import with_retention_hint, without_retention_hint
from gateway.admission.kv_blocks import check_fits_some_replica
from gateway.admission.limiter import TokenCharge
from gateway.backends.pool import Backend
from gateway.backends.proxy import UpstreamOutcome
from gateway.dispatch import Dispatched, decision_headers, tokens_used
from gateway.epp.placement import address, place
from gateway.epp.request_path import PreparedRequest, endpoint_of, prepare
from gateway.errors import OpenAIError
from gateway.gateway_request import GatewayRequest
from gateway.in_flight import InFlight
from gateway.routing.placement import Placement
from gateway.routing.retention_keys import retention_hint
from gateway.routing_core import RoutingCore

_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


@dataclass
class Pick:
    core: RoutingCore
    req: GatewayRequest
    placement: Placement[Backend]
    flight: InFlight
    prepared: PreparedRequest
    charge: TokenCharge
    held: AsyncExitStack
    queued_s: float
    endpoints: str
    """The primary endpoint, then any fallbacks, comma-separated (``ip:port,ip:port``)."""
    body: bytes | None
    """The body the replica should get when it differs from the client's, else None."""
    settled: bool = field(default=False)
    served_elsewhere: str | None = None
    """The fallback replica the data plane says served the request, when it was not the pick."""

    @property
    def response_headers(self) -> dict[str, str]:
        """What the client's answer carries, as the HTTP gateway's does (``x-kvgate-*``, the request id)."""
        headers = {"x-request-id": self.req.request_id, **decision_headers(self.placement.decision)}
        normalized = self.req.normalized
        if normalized is not None and normalized.changed:
            headers["x-kvgate-normalized"] = ",".join(normalized.changed)
        return headers

    def sent(self) -> None:
        """The pick is on its way to Envoy: the router counts the request on its replica from now on."""
        self.flight.sent()

    def served_by(self, endpoint: str) -> None:
        """The data plane reports the endpoint that served the request: when it is a fallback, the
        blocks predicted on the pick are undone (the ticket is settled as failed there), and the
        fallback is credited with them once it has prefilled the prompt (``settle``)."""
        if endpoint == address(self.placement.backend):
            return
        self.core.router.on_finished(self.placement.ticket, None, prefilled=False)
        model = self.placement.backend.model
        self.served_elsewhere = next(
            (backend.name for backend in self.core.pool.serving(model) if address(backend) == endpoint), None
        )

    async def settle(self, outcome: UpstreamOutcome) -> None:
        """Give everything back once; ``outcome``: the answer as the response phase read it."""
        if self.settled:
            return
        self.settled = True
        core, placement = self.core, self.placement
        route = self.prepared.route
        try:
            cached = outcome.usage.cached_tokens if outcome.usage else None
            self.flight.finish(cached, outcome.prefilled, outcome.completed_output_tokens)
            if self.served_elsewhere is not None and outcome.prefilled:
                core.router.on_served_elsewhere(placement.ticket, self.served_elsewhere)
            sent = placement.ticket.sent_to is not None
            self.charge.used = tokens_used(route, outcome, self.charge.taken, prefill_started=sent)
            if outcome.completed:
                placement.backend.breaker.record_success()
        finally:
            await self.held.aclose()
            core.queue.notify()
            core.dispatcher.held.notify(placement.backend.name)
        answered = Dispatched(web.Response(status=outcome.status or 200), outcome, placement.decision, self.queued_s)
        answered.charged_tokens = self.charge.used
        core.telemetry.observe_completion(self.req, answered)


async def pick(
    core: RoutingCore,
    headers: CIMultiDictProxy[str],
    raw: bytes,
    subset: frozenset[str] | None,
    fallbacks: int,
    request_id: str,
) -> Pick:
    """Admit and place the request Envoy describes; OpenAIError (recorded as a refusal) when refused.

    Whatever the pick took is given back if it does not complete, cancellation included."""
    req = GatewayRequest(request_id)
    held = AsyncExitStack()
    try:
        tenant = req.tenant = core.tenants.authenticate(cast(web.Request, _HeadersOnly(headers)))
        priority = tenant.priority(headers)
        endpoint = endpoint_of(headers)
        await held.enter_async_context(tenant.hold_slot())
        prepared = await prepare(core, req, tenant, endpoint, headers, raw)
        route = prepared.route
        capacities = [backend.kv_capacity_blocks for backend in core.pool.serving(route.model)]
        check_fits_some_replica(route.model, route.prompt_tokens, route.max_tokens, core.config.block_size, capacities)
        charge = await held.enter_async_context(tenant.charge(route.prompt_tokens + route.max_tokens))
        waiting_since = time.perf_counter()
        placement = await core.queue.admit(tenant.name, lambda: place(core, route, subset), priority)
        queued_s = time.perf_counter() - waiting_since
        flight = InFlight(core.router, placement, placement.uncached_tokens)
        held.callback(flight.finish, None, False)
        ranked = [core.pool.backends[name] for name in placement.decision.ranked if name in core.pool.backends]
        endpoints = ",".join(dict.fromkeys(address(backend) for backend in ranked[: fallbacks + 1]))
        body = _forwarded(prepared, placement)
    except OpenAIError as error:
        await held.aclose()
        core.telemetry.observe_rejection(req, error)
        raise
    except asyncio.CancelledError:
        await held.aclose()
        core.telemetry.observe_client_gone(req)
        raise
    except BaseException:
        await held.aclose()
        raise
    return Pick(core, req, placement, flight, prepared, charge, held, queued_s, endpoints, body)


def _forwarded(prepared: PreparedRequest, placement: Placement[Backend]) -> bytes | None:
    """The body for the picked replica, with its retention hint as the dispatcher gives it; None when
    it is the client's unchanged."""
    if placement.backend.takes_retention_hints:
        body = with_retention_hint(prepared.body, retention_hint(prepared.route, placement.decision))
    else:
        body = without_retention_hint(prepared.body)
    if not prepared.changed and body is prepared.body:
        return None
    return orjson.dumps(body)


def client_request_id(headers: CIMultiDictProxy[str]) -> str:
    """The client's ``x-request-id`` when it is a plain token, else one of the picker's own
    (the rule of gateway/handler.py's ``client_request_id``)."""
    given = headers.get("x-request-id", "")
    return given if _CLIENT_REQUEST_ID.fullmatch(given) else f"req-{secrets.token_hex(16)}"


class _HeadersOnly:
    """What ``TenantRegistry.authenticate`` reads of an aiohttp request: its headers (the Bearer key)."""

    __slots__ = ("headers",)

    def __init__(self, headers: CIMultiDictProxy[str]) -> None:
        self.headers = headers
