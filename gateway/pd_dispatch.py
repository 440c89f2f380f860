"""Disaggregated prefill/decode: whether a request's prefill runs on another replica, which one, and its leg.

Once the dispatcher has placed a request on a decode-capable replica (prefix-aware, weighing
its load), ``Disaggregation.plan`` routes a one-token copy of the request over the
prefill-capable replicas (prefix-aware, weighing their prefill load) and asks the decider
(gateway/routing/pd_decider.py) whether moving the prefill pays: not when the decode replica
already holds most of the prompt, nor when the uncached part is short; a request it splits then
decodes where the split costs least, which may be another replica (gateway/routing/pd_decode.py).
``run_leg`` then sends the prefill leg (gateway/backends/prefill_leg.py) under the prefill
replica's occupancy and router ticket, both settled once whatever happens, and returns the
``kv_transfer_params`` the decode leg carries. A prefill leg that fails (unreachable, 5xx,
timeout, no params) leaves the decode replica to prefill locally; a 4xx the request's content
caused is relayed to the client (``PrefillRefused``) and counts against no replica.

Only requests with one sequence to generate on chat or text completions disaggregate: ``n`` or
``best_of`` above 1, several prompts, embeddings and Responses requests run as before.
"""

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from aiohttp import web

from gateway.backends.answered_errors import AnsweredErrors
from gateway.backends.pool import Backend, BackendPool
from gateway.backends.prefill_leg import prefill_body, read_prefill_answer, refuses_transfer
from gateway.backends.proxy import ProxyCall, UpstreamAnswered, UpstreamFailed, UpstreamOutcome, forward
from gateway.backends.upstream_client import UpstreamClient
from gateway.config import TimeoutsConfig
from gateway.in_flight import InFlight
from gateway.routing.pd_decider import PdDecision
from gateway.routing.pd_decode import split_decode_placement
from gateway.routing.pd_leg import place_prefill_leg
from gateway.routing.placement import Placement
from gateway.routing.router import Router
from gateway.routing.types import RouteDecision, RouteRequest

log = logging.getLogger("kvgate.pd")

PREFILL_BACKEND_HEADER = "x-kvgate-prefill-backend"
ESTIMATE_HEADER = "x-kvgate-pd-estimate"
REQUEST_ID_HEADER = "X-Request-Id"
_DISAGGREGABLE_PATHS = ("/v1/chat/completions", "/v1/completions")
_BUSY = (408, 429)
"""4xx answers a prefill replica gives for its own state, not the request's content: prefill locally."""


class PdChoice(StrEnum):
    """What happened to a request's prefill on a model with P/D roles: the ``pd=`` of its route reason
    (a label of few values; the decider's estimate is the ``x-kvgate-pd-estimate`` header)."""

    DISAGGREGATED = "disaggregated"
    LOCAL_WARM = "local-prefill-warm"
    """The decider kept it local and the decode replica holds most of the prompt."""
    LOCAL_SHORT = "local-prefill-short"
    """The decider kept it local and the uncached part is short (under ``stall_free_tokens``)."""
    LOCAL_CHEAPER = "local-prefill-cheaper"
    """The decider kept it local for its estimate: a busy prefill replica, a slow link."""
    LOCAL_NEVER = "local-prefill-never"
    """``routing.disaggregation.mode: never``."""
    LOCAL_NO_PREFILL_REPLICA = "local-prefill-no-replica"
    """No prefill-capable replica other than the decode one is healthy with room."""
    LOCAL_RETRY = "local-prefill-retry"
    """A retry after the decode replica failed: prefilled where it lands."""
    PREFILL_FAILED = "prefill-leg-failed"
    """The prefill leg failed (unreachable, 5xx, timeout, no ``kv_transfer_params``): prefilled locally."""


@dataclass
class PdOutcome:
    """One request's P/D decision and its prefill leg, for the route reason, metrics and the request log."""

    decision: PdChoice
    prefill_backend: str | None = None
    """The replica the prefill leg was sent to (also when it failed)."""
    prefill_prompt_tokens: int | None = None
    prefill_cached_tokens: int | None = None
    """The prefill replica's own prefix hit (its answer's ``cached_tokens``)."""
    prefill_s: float | None = None
    """How long the prefill leg took."""
    estimate: str | None = None
    """The decider's reason, with its cost estimates (``pd-split: est 0.42s vs local 1.10s``)."""

    @property
    def disaggregated(self) -> bool:
        return self.decision is PdChoice.DISAGGREGATED

    def route_reason(self, decode: RouteDecision) -> str:
        """The decode decision's reason with the P/D decision and both replicas named."""
        reason = f"{decode.reason}; pd={self.decision}"
        if self.prefill_backend is not None and self.decision in (PdChoice.DISAGGREGATED, PdChoice.PREFILL_FAILED):
            reason += f"; prefill={self.prefill_backend}; decode={decode.backend}"
        return reason


@dataclass
class PdPlan:
    """What ``Disaggregation.plan`` decided for one attempt; ``outcome`` None: P/D does not apply."""

    outcome: PdOutcome | None = None
    prefill: Placement[Backend] | None = None
    decode: Placement[Backend] | None = None
    """Where a split request decodes: the router's placement or a cheaper one for the split."""
    params: dict[str, Any] | None = field(default=None, repr=False)
    """The prefill answer's ``kv_transfer_params``, once its leg succeeded."""

    def decode_decision(self, decision: RouteDecision) -> RouteDecision:
        if self.outcome is None:
            return decision
        return dataclasses.replace(decision, reason=self.outcome.route_reason(decision))

    def upstream_headers(self, request: RouteRequest) -> dict[str, str]:
        """Headers both legs of a disaggregated request carry: one ``X-Request-Id``, as vLLM's P/D
        proxies send it (its connectors may match the legs by it)."""
        return {REQUEST_ID_HEADER: request.request_id} if self.prefill is not None else {}

    def headers(self) -> dict[str, str]:
        """The client's response headers this plan adds: the prefill replica, the decider's estimate."""
        outcome = self.outcome
        headers = {ESTIMATE_HEADER: outcome.estimate} if outcome is not None and outcome.estimate else {}
        if outcome is not None and outcome.disaggregated and outcome.prefill_backend is not None:
            headers[PREFILL_BACKEND_HEADER] = outcome.prefill_backend
        return headers


class PrefillRefused(Exception):
    """The prefill replica answered 4xx for the request's content: relayed to the client as is."""

    def __init__(self, response: web.StreamResponse, outcome: UpstreamOutcome) -> None:
        super().__init__(f"prefill leg answered {outcome.status}")
        self.response = response
        self.outcome = outcome


@dataclass(frozen=True)
class LegForm:
    """What the prefill leg is sent as: the client's path and forwarded body, headers both ways."""

    path: str
    body: dict[str, Any]
    response_headers: dict[str, str]
    upstream_headers: dict[str, str]


def disaggregable(path: str, body: dict[str, Any], native: bool) -> bool:
    """One sequence to generate, on an endpoint P/D engines serve, in the form the replica gets translated."""
    if native or path not in _DISAGGREGABLE_PATHS:
        return False
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return False
    prompt = body.get("prompt")
    return not (isinstance(prompt, list) and len(prompt) > 1 and not all(isinstance(token, int) for token in prompt))


def local_choice(verdict: PdDecision, prompt_tokens: int, decode_cached: int, stall_free_tokens: int) -> PdChoice:
    """The decider's verdict as a ``PdChoice``: why a request stays local, in few words."""
    if verdict.disaggregate:
        return PdChoice.DISAGGREGATED
    if verdict.reason == "pd-never":
        return PdChoice.LOCAL_NEVER
    if 2 * decode_cached >= prompt_tokens > 0:
        return PdChoice.LOCAL_WARM
    if prompt_tokens - decode_cached < stall_free_tokens:
        return PdChoice.LOCAL_SHORT
    return PdChoice.LOCAL_CHEAPER


class Disaggregation:
    def __init__(
        self,
        pool: BackendPool,
        router: Router,
        upstream: UpstreamClient,
        block_size: int,
        on_freed: Callable[[str], None],
    ) -> None:
        """``on_freed(name)`` runs when a prefill leg leaves replica ``name`` (queued requests may fit)."""
        self.pool = pool
        self.router = router
        self.upstream = upstream
        self.block_size = block_size
        self.on_freed = on_freed

    def plan(
        self,
        request: RouteRequest,
        routed: Placement[Backend],
        eligible: bool,
        retry: bool,
        may_decode: Callable[[Backend], bool],
    ) -> PdPlan:
        """Decide, synchronously (nothing else routes meanwhile), where the request's prefill runs and,
        when it runs elsewhere, where it decodes: ``routed`` (the router's placement) or the replica
        ``may_decode`` allows where the split costs least (gateway/routing/pd_decode.py)."""
        if not eligible or not self.pool.disaggregates(request.model, self.router.config.disaggregation):
            return PdPlan()
        if retry:
            return PdPlan(PdOutcome(PdChoice.LOCAL_RETRY))
        decode, decode_cached = routed.backend, routed.decision.predicted_cached_tokens
        candidates = [
            backend
            for backend in self.pool.prefill_usable(request.model)
            if backend is not decode and backend.has_room and backend.serves_adapter(request.adapter)
        ]
        leg, verdict = place_prefill_leg(
            self.router,
            request,
            decode.state(),
            decode_cached,
            candidates,
            self.block_size,
            lambda backend: backend.spec.role == "both" or bool(backend.state().decodes),
            decode_prefills=decode.spec.role == "both",
        )
        if leg is None:
            return PdPlan(PdOutcome(PdChoice.LOCAL_NO_PREFILL_REPLICA))
        config = self.router.config
        choice = local_choice(verdict, request.prompt_tokens, decode_cached, config.disaggregation.stall_free_tokens)
        if not verdict.disaggregate:
            return PdPlan(PdOutcome(choice, leg.backend.name, estimate=verdict.reason))
        decoders = [
            backend
            for backend in self.pool.usable(request.model, config.disaggregation, config.prefill_tokens_per_s)
            if backend.has_room and backend.serves_adapter(request.adapter) and may_decode(backend)
        ]
        placed, verdict = split_decode_placement(
            self.router,
            request,
            routed,
            verdict,
            leg,
            decoders,
            self.block_size,
            Backend.state,
        )
        return PdPlan(PdOutcome(choice, leg.backend.name, estimate=verdict.reason), leg, placed)

    async def run_leg(
        self,
        plan: PdPlan,
        request: RouteRequest,
        form: LegForm,
        client: web.Request,
        answered: AnsweredErrors,
        timeouts: TimeoutsConfig,
    ) -> None:
        """Send the prefill leg; on success ``plan.params`` holds the decode leg's transfer params,
        on failure ``plan.outcome`` says so (the decode replica prefills locally).

        Raises ``PrefillRefused`` for a 4xx of the request's own; a 5xx is held in ``answered``
        (gateway/backends/answered_errors.py): counted against the prefill replica once the decode
        replica serves the request, taken as the request's fault if the decode replica answers 5xx too."""
        prefill, outcome = plan.prefill, plan.outcome
        assert prefill is not None and outcome is not None, "run_leg follows a plan that disaggregates"
        backend = prefill.backend
        started = time.perf_counter()
        cached: int | None = None
        ok = False
        flight = InFlight(self.router, prefill, prefill.uncached_tokens)
        try:
            call = ProxyCall(
                client=self.upstream,
                url=f"{backend.spec.url}{form.path}",
                body=prefill_body(form.body),
                stream=False,
                include_usage=False,
                headers=form.response_headers,
                timeouts=timeouts,
                max_tokens=1,
                prompt_tokens=request.prompt_tokens,
                on_sent=flight.sent,
                upstream_headers={
                    **backend.spec.upstream_headers(),
                    **form.upstream_headers,
                    **plan.upstream_headers(request),
                    **flight.load_mark_header(),
                },
                redactor=backend.redactor,
            )
            response, answer = await forward(call, client)
            if answer.status in _BUSY:
                log.warning("prefill leg of %s answered %s on %s", request.request_id, answer.status, backend.name)
                outcome.decision = PdChoice.PREFILL_FAILED
                return
            if answer.status != 200:
                body = response.body if isinstance(response, web.Response) else None
                if isinstance(body, bytes) and refuses_transfer(body):
                    log.warning("replica %s refused a prefill leg: it runs without a KV connector", backend.name)
                    backend.breaker.record_failure()
                    outcome.decision = PdChoice.PREFILL_FAILED
                    return
                raise PrefillRefused(response, answer)
            body = response.body if isinstance(response, web.Response) else None
            read = read_prefill_answer(body if isinstance(body, bytes) else b"")
            if read.usage is not None:
                outcome.prefill_prompt_tokens, cached = read.usage.prompt_tokens, read.usage.cached_tokens
                outcome.prefill_cached_tokens = cached
            ok = True
            backend.breaker.record_success()
            if read.params is None:
                log.warning("prefill leg on %s answered without kv_transfer_params", backend.name)
                outcome.decision = PdChoice.PREFILL_FAILED
                return
            plan.params = read.params
        except UpstreamAnswered as exc:
            log.warning("prefill leg of %s answered %s on %s", request.request_id, exc.status, backend.name)
            outcome.decision = PdChoice.PREFILL_FAILED
            answered.add(backend, exc)
        except UpstreamFailed as exc:
            log.warning("prefill leg of %s failed on %s: %s", request.request_id, backend.name, exc)
            backend.breaker.record_failure()
            outcome.decision = PdChoice.PREFILL_FAILED
        finally:
            outcome.prefill_s = time.perf_counter() - started
            flight.finish(cached, ok)
            self.on_freed(backend.name)
