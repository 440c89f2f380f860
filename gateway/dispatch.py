"""Pick a replica for a routed request and forward it, retrying elsewhere while that is safe."""

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.backend_pool import BackendPool
from gateway.config import TimeoutsConfig
from gateway.errors import service_unavailable
from gateway.proxy import ProxyCall, UpstreamFailed, UpstreamOutcome, forward
from gateway.routing.router import Router
from gateway.routing.types import RouteDecision, RouteRequest

log = logging.getLogger("kvgate.dispatch")

MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.05


@dataclass
class Dispatched:
    response: web.StreamResponse
    outcome: UpstreamOutcome
    decision: RouteDecision


class Dispatcher:
    def __init__(
        self, pool: BackendPool, router: Router, session: aiohttp.ClientSession, timeouts: TimeoutsConfig
    ) -> None:
        self.pool = pool
        self.router = router
        self.session = session
        self.timeouts = timeouts

    async def dispatch(
        self,
        request: RouteRequest,
        path: str,
        body: dict,
        stream: bool,
        include_usage: bool,
        headers: dict[str, str],
        client_request: web.Request,
    ) -> Dispatched:
        """Route, forward, and on a failure before the first byte try the next replica."""
        tried: set[str] = set()
        for attempt in range(MAX_ATTEMPTS):
            candidates = [b for b in self.pool.available(request.model) if b.name not in tried]
            if not candidates:
                break
            decision = self.router.route(request, [backend.state() for backend in candidates])
            if attempt:
                decision = RouteDecision(decision.backend, "retry", decision.predicted_cached_tokens, decision.ranked)
            backend = self.pool.backends[decision.backend]
            self.router.on_routed(request, backend.name)
            call = ProxyCall(
                session=self.session,
                url=f"{backend.spec.url}{path}",
                body=body,
                stream=stream,
                include_usage=include_usage,
                headers={**headers, **decision_headers(decision)},
                timeouts=self.timeouts,
            )
            uncached = request.prompt_tokens - decision.predicted_cached_tokens
            with backend.occupy(uncached):
                try:
                    response, outcome = await forward(call, client_request)
                except UpstreamFailed as exc:
                    log.warning("request %s failed on %s before any byte: %s", request.request_id, backend.name, exc)
                    self.router.on_finished(request, backend.name, None, ok=False)
                    tried.add(backend.name)
                    await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
                    continue
            self.router.on_finished(request, backend.name, _cached_tokens(outcome), ok=outcome.completed)
            return Dispatched(response, outcome, decision)
        raise service_unavailable(f"no healthy replica of '{request.model}' could take the request", retry_after_s=1)


def decision_headers(decision: RouteDecision) -> dict[str, str]:
    return {
        "x-kvgate-backend": decision.backend,
        "x-kvgate-route-reason": decision.reason,
        "x-kvgate-predicted-cached-tokens": str(decision.predicted_cached_tokens),
    }


def _cached_tokens(outcome: UpstreamOutcome) -> int | None:
    if not outcome.usage:
        return None
    details = outcome.usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return cached if isinstance(cached, int) else None
