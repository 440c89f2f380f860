"""Admit a routed request, forward it to a replica, and retry elsewhere while that is safe.

Per request: the tenant's concurrency and token budget (429), then a place on a replica that
has both a free concurrency slot and room for the request's KV blocks, waiting in the fair
admission queue when none has; then the proxy call. A failure before the first byte reached
the client counts against the replica's circuit breaker and is retried on another replica
(bounded, with backoff); after the first byte it never is. A replica that took the request but
sent no first token within ``first_token_s`` is not retried elsewhere: the client gets 504 at
once. The gateway cannot tell a stalled replica from a request that is slow by its own content
(a long prompt, many samples); retrying the latter costs every replica the same prefill and the
client ``first_token_s`` per replica, and the stalled replica is ejected by its breaker anyway.

The tenant is charged what the request used however it ends: the engine's usage, or, when the
client left mid-stream (the handler is cancelled), its prompt plus the token-bearing chunks it
was sent. A request whose prefill may have started is charged at least its prompt: once the
gateway began forwarding it to a replica and its client left before any answer, once that
replica timed out before a first token, or once a replica answered it 5xx (the engine took it;
two such answers mean its content is the cause) (``Progress.prefill_started``). A request no
replica could be reached for is not charged. ``Forwarding.progress`` keeps the latest attempt
readable for the request log then.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from gateway.admission.forwarded_body import with_retention_hint, without_retention_hint
from gateway.admission.kv_blocks import check_fits_some_replica
from gateway.admission.queue import AdmissionQueue
from gateway.admission.tenants import Tenant
from gateway.backends.answered_errors import AnsweredErrors
from gateway.backends.pool import Backend, BackendPool
from gateway.backends.prefill_leg import decode_body
from gateway.backends.proxy import ProxyCall, UpstreamAnswered, UpstreamFailed, UpstreamOutcome, forward
from gateway.backends.upstream_client import UpstreamClient
from gateway.config import TimeoutsConfig
from gateway.errors import OpenAIError, service_unavailable
from gateway.in_flight import InFlight
from gateway.pd_dispatch import Disaggregation, LegForm, PdOutcome, PdPlan, PrefillRefused, disaggregable
from gateway.routing.held_requests import HeldRequests
from gateway.routing.placement import Placement, place
from gateway.routing.retention_keys import retention_hint
from gateway.routing.router import Router
from gateway.routing.types import RouteDecision, RouteReason, RouteRequest
from protocol.tracing import span

log = logging.getLogger("kvgate.dispatch")

MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.05
"""Wait before the n-th retry: RETRY_BACKOFF_S * 2**(n-1)."""


@dataclass
class Dispatched:
    response: web.StreamResponse
    outcome: UpstreamOutcome
    decision: RouteDecision
    queued_s: float = 0.0
    """Time spent waiting in the admission queue, over all attempts."""
    charged_tokens: int | None = None
    """Tokens charged to the tenant's budget, known once the request has ended."""
    pd: PdOutcome | None = None
    """Its disaggregated prefill/decode decision and prefill leg, on a model with P/D roles."""


@dataclass
class Progress:
    """How far a request got: its latest attempt, readable even after the handler is cancelled."""

    decision: RouteDecision | None = None
    outcome: UpstreamOutcome | None = None
    queued_s: float = 0.0
    prefill_started: bool = False
    """A replica may have prefilled the prompt: the client left while it was being forwarded, the
    replica timed out before its first token, or it answered 5xx. The tenant is charged the prompt
    at least."""
    charged_tokens: int | None = None
    """Tokens charged to the tenant's budget, set when the request ends however it ends."""
    pd: PdOutcome | None = None
    """The latest attempt's P/D decision and prefill leg (gateway/pd_dispatch.py)."""


@dataclass(frozen=True)
class NativeForm:
    """The request in its client's protocol, for replicas that serve that protocol themselves
    (``backends[].anthropic_messages``); the others get the translated ``Forwarding.body``."""

    path: str
    body: dict
    stream_format: str
    stream_response: Callable[..., web.StreamResponse]
    on_chosen: Callable[[bool], None]
    """Told, per attempt, whether the replica got this form (True) or the translated one."""


@dataclass(frozen=True)
class Forwarding:
    """What goes to the backend and back to the client, whatever replica serves it."""

    path: str
    body: dict
    stream: bool
    include_usage: bool
    headers: dict[str, str]
    client_request: web.Request
    progress: Progress = field(default_factory=Progress)
    upstream_headers: dict[str, str] = field(default_factory=dict)
    """Headers for the backend (the trace context); the replica's own (API key) are added per replica."""
    stream_format: str = "chat"
    stream_response: Callable[..., web.StreamResponse] = web.StreamResponse
    """Makes the client's streamed response (a front end's translates what the proxy writes)."""
    native: NativeForm | None = None


class Dispatcher:
    def __init__(
        self,
        pool: BackendPool,
        router: Router,
        queue: AdmissionQueue,
        timeouts: TimeoutsConfig,
        block_size: int,
    ) -> None:
        self.pool = pool
        self.router = router
        self.upstream = UpstreamClient()
        """Keep-alive connections to the replicas that requests are forwarded on."""
        self.queue = queue
        self.timeouts = timeouts
        self.block_size = block_size
        self.held = HeldRequests()
        """Requests late binding holds for their busy owner (routing.late_binding)."""
        self.disaggregation = Disaggregation(pool, router, self.upstream, block_size, self._freed)
        """Where a request's prefill runs on a model whose replicas have P/D roles."""
        pool.on_change(self.queue.notify)
        pool.on_change(self.held.notify_all)

    async def dispatch(
        self, request: RouteRequest, tenant: Tenant, forwarding: Forwarding, priority: int = 0
    ) -> Dispatched:
        """Charge the tenant's budget (its concurrency slot is already held), then place and forward.

        ``priority`` is the request's admission class (higher leaves the queue first).
        """
        serving = self.pool.serving(request.model)
        capacities = [backend.kv_capacity_blocks for backend in serving if backend.takes_client_requests]
        check_fits_some_replica(request.model, request.prompt_tokens, request.max_tokens, self.block_size, capacities)
        async with tenant.charge(request.prompt_tokens + request.max_tokens) as charge:
            progress = forwarding.progress
            try:
                dispatched = await self._dispatch_with_retries(request, tenant, forwarding, priority)
            finally:
                charge.used = tokens_used(request, progress.outcome, charge.taken, progress.prefill_started)
                progress.charged_tokens = charge.used
            dispatched.charged_tokens = charge.used
            return dispatched

    async def _dispatch_with_retries(
        self, request: RouteRequest, tenant: Tenant, forwarding: Forwarding, priority: int
    ) -> Dispatched:
        tried: set[str] = set()
        answered = AnsweredErrors()
        queued_s = 0.0
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))
            waiting_since = time.perf_counter()
            try:
                with span("gateway.queue"):
                    placement = await self.admit(request, tenant.name, tried, priority)
            except OpenAIError as exc:
                if answered and exc.status == 503:
                    raise answered.client_error() from None
                raise
            finally:
                queued_s += time.perf_counter() - waiting_since
                forwarding.progress.queued_s = queued_s
            decision = placement.decision
            if attempt:
                decision = RouteDecision(
                    decision.backend,
                    RouteReason.RETRY,
                    decision.predicted_cached_tokens,
                    decision.ranked,
                    retention_key=decision.retention_key,
                )
            plan = self._plan(request, placement, decision, forwarding)
            if plan.decode is not None:
                placement, decision = plan.decode, plan.decode.decision
            try:
                response, outcome = await self._forward(request, placement, decision, plan, forwarding, answered)
            except PrefillRefused as refused:
                progress = forwarding.progress
                return Dispatched(
                    refused.response, refused.outcome, progress.decision or decision, queued_s, pd=progress.pd
                )
            except UpstreamFailed as exc:
                log.warning("request %s failed on %s before any byte: %s", request.request_id, decision.backend, exc)
                if isinstance(exc.__cause__, TimeoutError):
                    forwarding.progress.prefill_started = True
                    raise first_token_timeout(decision.backend, self.timeouts.first_token_s) from None
                if isinstance(exc, UpstreamAnswered):
                    forwarding.progress.prefill_started = True
                    answered.add(placement.backend, exc)
                tried.add(decision.backend)
                continue
            answered.served_elsewhere()
            pd = forwarding.progress.pd
            return Dispatched(response, outcome, forwarding.progress.decision or decision, queued_s, pd=pd)
        if answered:
            raise answered.client_error()
        raise service_unavailable(
            f"'{request.model}' failed on {len(tried)} replicas in a row; retry shortly", retry_after_s=1
        )

    async def admit(self, request: RouteRequest, tenant: str, tried: set[str], priority: int = 0) -> Placement[Backend]:
        """A place for the request, once one is free: through the admission queue, then, when routing
        holds it for its busy owner, through late binding (gateway/routing/held_requests.py); past
        ``max_wait_s`` there, it is routed as if never held."""
        placement = await self.queue.admit(tenant, lambda: self._place(request, tried), priority)
        hold = placement.decision.hold
        if hold is None:
            return placement
        max_wait_s = self.router.config.late_binding.max_wait_s
        held = await self.held.wait(hold, max_wait_s, lambda: self._place_unheld(request, tried))
        if held is not None:
            return held
        return await self.queue.admit(tenant, lambda: self._place(request, tried, may_hold=False), priority)

    def _place_unheld(self, request: RouteRequest, tried: set[str]) -> Placement[Backend] | None:
        """A placement once routing no longer says to keep holding the request."""
        placement = self._place(request, tried)
        return placement if placement is not None and placement.decision.hold is None else None

    def _place(self, request: RouteRequest, tried: set[str], may_hold: bool = True) -> Placement[Backend] | None:
        """A replica with a free slot and room for the request's KV blocks, or a hold for its owner
        (late binding); None when all are full (gateway/routing/placement.py)."""
        config = self.router.config
        usable = [
            backend
            for backend in self.pool.usable(request.model, config.disaggregation, config.prefill_tokens_per_s)
            if backend.name not in tried and backend.serves_adapter(request.adapter)
        ]
        if not usable:
            serving = f"adapter '{request.adapter}' of '{request.model}'" if request.adapter else f"'{request.model}'"
            raise service_unavailable(f"No healthy replica of {serving} is available.", retry_after_s=1)
        with span("gateway.route"):
            return place(
                self.router, request, [backend for backend in usable if backend.has_room], self.block_size, may_hold
            )

    def _plan(
        self, request: RouteRequest, placement: Placement[Backend], decision: RouteDecision, forwarding: Forwarding
    ) -> PdPlan:
        """Where the request's prefill runs and, when elsewhere, where it decodes (gateway/pd_dispatch.py):
        only a request sent in the OpenAI form disaggregates, so it decodes only where it stays in it."""
        native = forwarding.native is not None and placement.backend.spec.anthropic_messages
        eligible = disaggregable(forwarding.path, forwarding.body, native)
        retry = decision.reason == RouteReason.RETRY

        def keeps_form(backend: Backend) -> bool:
            return forwarding.native is None or not backend.spec.anthropic_messages

        return self.disaggregation.plan(request, placement, eligible, retry, keeps_form)

    async def _forward(
        self,
        request: RouteRequest,
        placement: Placement[Backend],
        decision: RouteDecision,
        plan: PdPlan,
        forwarding: Forwarding,
        answered: AnsweredErrors,
    ) -> tuple[web.StreamResponse, UpstreamOutcome]:
        """One attempt on one replica, with its bookkeeping (router, breaker, queue) settled on every exit.

        The router hears of the request (its index insert) as soon as it is written to the replica,
        before the gateway yields to any other request, so none routes without seeing it; or, for one
        that failed before it was sent, before its failure undoes it (a ticket is settled once).
        On a model with P/D roles the request's prefill may run on another replica first
        (gateway/pd_dispatch.py): the decode replica's slot and KV are held meanwhile, its queued
        prefill is not counted (unless the leg fails and it prefills the prompt itself), and its
        reported ``cached_tokens`` (transferred KV included) does not calibrate the router's
        prediction."""
        backend = placement.backend
        native = forwarding.native if backend.spec.anthropic_messages else None
        routed_decision, decision = decision, plan.decode_decision(decision)
        forwarding.progress.pd = plan.outcome

        outcome: UpstreamOutcome | None = None
        prefill_tokens = 0 if plan.prefill is not None else placement.uncached_tokens
        flight = InFlight(self.router, placement, prefill_tokens)

        def first_token() -> None:
            flight.first_token()
            self.held.notify(backend.name)

        try:
            if forwarding.native is not None:
                forwarding.native.on_chosen(native is not None)
            if native is not None:
                body = native.body
            elif backend.takes_retention_hints:
                body = with_retention_hint(forwarding.body, retention_hint(request, decision))
            else:
                body = without_retention_hint(forwarding.body)
            forwarding.progress.decision = decision
            if plan.prefill is not None:
                flight.sent()  # the decode replica will hold the prompt's blocks however the leg ends
                body = await self._prefill_elsewhere(request, plan, decision, forwarding, body, answered)
                if plan.params is None:
                    flight.add_prefill(placement.uncached_tokens)  # the leg failed: it prefills here
                decision = forwarding.progress.decision = plan.decode_decision(routed_decision)
            call = ProxyCall(
                client=self.upstream,
                url=f"{backend.spec.url}{native.path if native else forwarding.path}",
                body=body,
                stream=forwarding.stream,
                include_usage=forwarding.include_usage,
                headers={**forwarding.headers, **decision_headers(decision), **plan.headers()},
                timeouts=self.timeouts,
                max_tokens=request.max_tokens,
                prompt_tokens=request.prompt_tokens,
                on_first_token=first_token,
                on_sent=flight.sent,
                upstream_headers={
                    **backend.spec.upstream_headers(),
                    **forwarding.upstream_headers,
                    **plan.upstream_headers(request),
                    **flight.load_mark_header(),
                },
                stream_format=native.stream_format if native else forwarding.stream_format,
                stream_response=native.stream_response if native else forwarding.stream_response,
                redactor=backend.redactor,
            )
            forwarding.progress.outcome = call.outcome
            try:
                response, outcome = await forward(call, forwarding.client_request)
            except asyncio.CancelledError:
                forwarding.progress.prefill_started = True
                outcome = call.outcome  # as far as it got: a client that left after its first token left it prefilled
                raise
        except UpstreamFailed as exc:
            if not isinstance(exc, UpstreamAnswered):
                backend.breaker.record_failure()
            raise
        finally:
            prefilled = outcome is not None and outcome.prefilled
            cached = outcome.usage.cached_tokens if outcome and outcome.usage and plan.params is None else None
            flight.finish(cached, prefilled, outcome.completed_output_tokens if outcome else None)
            self._freed(backend.name)
        if outcome.completed or outcome.status != 200:
            backend.breaker.record_success()
        elif not outcome.client_gone:
            backend.breaker.record_failure()
        return response, outcome

    async def _prefill_elsewhere(
        self,
        request: RouteRequest,
        plan: PdPlan,
        decision: RouteDecision,
        forwarding: Forwarding,
        body: dict,
        answered: AnsweredErrors,
    ) -> dict:
        """Run the plan's prefill leg; the decode leg's ``body``: with the leg's ``kv_transfer_params``,
        or as it was when the leg failed (the decode replica prefills locally). The leg carries no
        retention hint: the conversation is kept where it decodes."""
        form = LegForm(
            path=forwarding.path,
            body=without_retention_hint(forwarding.body),
            response_headers={**forwarding.headers, **decision_headers(decision), **plan.headers()},
            upstream_headers=forwarding.upstream_headers,
        )
        try:
            await self.disaggregation.run_leg(plan, request, form, forwarding.client_request, answered, self.timeouts)
        except asyncio.CancelledError:
            forwarding.progress.prefill_started = True
            raise
        except PrefillRefused as refused:
            forwarding.progress.outcome = refused.outcome
            raise
        return decode_body(body, plan.params) if plan.params is not None else body

    def _freed(self, name: str) -> None:
        """A request left replica ``name``: queued and held requests may fit now."""
        self.queue.notify()
        self.held.notify(name)


def decision_headers(decision: RouteDecision) -> dict[str, str]:
    return {
        "x-kvgate-backend": decision.backend,
        "x-kvgate-route-reason": decision.reason,
        "x-kvgate-predicted-cached-tokens": str(decision.predicted_cached_tokens),
    }


def first_token_timeout(backend: str, first_token_s: float) -> OpenAIError:
    return OpenAIError(
        504,
        f"Replica '{backend}' sent no first token within {first_token_s:g} s; the request was not retried "
        "elsewhere (a slow prompt would be as slow there). Retry later or reduce the prompt, n or max_tokens.",
        type_="server_error",
        code="upstream_timeout",
    )


def tokens_used(
    request: RouteRequest, outcome: UpstreamOutcome | None, taken: int, prefill_started: bool = False
) -> int:
    """What to charge: the backend's reported total; for an answer that ended early (the client
    left, the stream broke) the prompt plus the chunks relayed; all of ``taken`` for a finished
    answer without usage; the prompt when no answer came but a replica may have prefilled it
    (``prefill_started``); nothing when no backend got the request or it refused it."""
    if outcome is None or outcome.first_token_at is None or outcome.status != 200:
        return request.prompt_tokens if prefill_started else 0
    total = outcome.usage.total_tokens if outcome.usage else None
    if total is not None:
        return total
    if outcome.completed:
        return taken
    return request.prompt_tokens + outcome.generated_at_least
