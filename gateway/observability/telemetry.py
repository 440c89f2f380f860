"""Where the request handler reports each finished request: metrics, dashboard stats, breakers, log.

The handler reports before aiohttp writes the answer, so only the record (timings, counts) is
made then; the metrics, stats, prefix breakers and log line are updated by a callback that runs
right after, once the answer is on its way. That takes their cost off every request's latency.
The callback runs on the next turn of the loop, before the loop reads any request sent after
the answer arrived, so a scrape that follows a request sees it.
"""

import asyncio
import time

from gateway.backends.proxy import UpstreamOutcome
from gateway.dispatch import Dispatched
from gateway.errors import OpenAIError
from gateway.gateway_request import GatewayRequest
from gateway.observability.config import ObservabilityConfig
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.prefix_breakers import PrefixBreakers
from gateway.observability.pricing import request_cost
from gateway.observability.request_log import RequestLog
from gateway.observability.rolling_stats import StatsWindow
from gateway.observability.telemetry_record import UNAUTHENTICATED, RequestRecord
from gateway.pd_dispatch import PdOutcome
from gateway.routing.types import RouteDecision, RouteRequest
from gateway.served_model import ServedModel
from normalize.segment_tokenizer import SegmentTokenizer
from protocol.usage import Usage

CLIENT_GONE = "client_gone"
"""Status (and, before a backend was chosen, error code) of a request whose client left."""


class Telemetry:
    def __init__(self, config: ObservabilityConfig, block_size: int) -> None:
        self.metrics = GatewayMetrics()
        self.stats = StatsWindow(config.stats_bucket_s, config.stats_window_s)
        self.breakers = PrefixBreakers(block_size, config.breaker_preview_chars, config.breaker_samples_per_s)
        self.log = RequestLog(config)
        self.pricing = config.pricing

    def observe_completion(self, request: GatewayRequest, dispatched: Dispatched) -> None:
        """A request a backend answered."""
        self._observe_answer(
            request,
            dispatched.decision,
            dispatched.outcome,
            dispatched.queued_s,
            dispatched.charged_tokens,
            dispatched.pd,
        )

    def _observe_answer(
        self,
        request: GatewayRequest,
        decision: RouteDecision,
        outcome: UpstreamOutcome,
        queued_s: float,
        charged_tokens: int | None,
        pd: PdOutcome | None,
    ) -> None:
        route, target, normalized = request.route, request.target, request.normalized
        assert route is not None and target is not None and normalized is not None, "an answered request was routed"
        record = _served_record(request, route, decision, outcome)
        _add_pd(record, pd)
        record.status = _status(outcome)
        record.queued_s = queued_s
        record.charged_tokens = charged_tokens
        record.normalized_rules = list(normalized.changed)
        record.trace_id = request.trace_id
        self._price(record)
        loop = asyncio.get_running_loop()
        loop.call_soon(self._observe_completion, record, normalized.body, target.served, route)

    def _price(self, record: RequestRecord) -> None:
        price = self.pricing.get(record.model or "")
        if price is None or record.status != "200":
            return
        priced = request_cost(price, record.prompt_tokens, record.cached_tokens or 0, record.completion_tokens or 0)
        record.cost, record.cache_savings = priced.cost, priced.savings

    def observe_client_gone(self, request: GatewayRequest) -> None:
        """A request whose client left before its handler returned (aiohttp cancelled it): with the
        backend and what it streamed when it got that far, else as a refusal with code ``client_gone``.

        A client that had the whole answer was served, not gone: SDKs close a stream's connection as
        soon as they read ``[DONE]``, often before the handler has returned."""
        route = request.route
        progress = request.forwarding.progress if request.forwarding is not None else None
        if progress is not None and progress.decision and progress.outcome and _relayed_in_full(progress.outcome):
            self._observe_answer(
                request, progress.decision, progress.outcome, progress.queued_s, progress.charged_tokens, progress.pd
            )
            return
        if route is not None and progress is not None and progress.decision and progress.outcome:
            record = _served_record(request, route, progress.decision, progress.outcome)
            record.queued_s = progress.queued_s
        else:
            record = RequestRecord(
                request_id=request.request_id,
                model=route.model if route else None,
                tenant=request.tenant_name or UNAUTHENTICATED,
                error_code=CLIENT_GONE,
                stream=request.stream,
                prompt_tokens=route.prompt_tokens if route else 0,
                e2e_s=time.perf_counter() - request.started,
            )
        record.status = CLIENT_GONE
        record.charged_tokens = progress.charged_tokens if progress is not None else None
        _add_pd(record, progress.pd if progress is not None else None)
        self._observe(record, None)

    def observe_rejection(self, request: GatewayRequest, error: OpenAIError) -> None:
        """A request the gateway answered with an error itself (bad input, caps, queue, no replica,
        a first-token timeout: the one refusal that may have been charged)."""
        forwarding = request.forwarding
        record = RequestRecord(
            request_id=request.request_id,
            model=None,
            tenant=request.tenant_name or UNAUTHENTICATED,
            status=str(error.status),
            error_code=error.code or error.type,
            e2e_s=time.perf_counter() - request.started,
            trace_id=request.trace_id,
            charged_tokens=forwarding.progress.charged_tokens if forwarding is not None else None,
        )
        asyncio.get_running_loop().call_soon(self._observe, record, None)

    def _observe_completion(
        self, record: RequestRecord, body: dict, model: ServedModel, route_request: RouteRequest
    ) -> None:
        self._observe(record, body)
        decode = model.tokenizer.chat.decode if isinstance(model.tokenizer, SegmentTokenizer) else None
        self.breakers.observe(model.name, route_request.token_ids, decode)

    def _observe(self, record: RequestRecord, body: dict | None) -> None:
        self.metrics.observe(record)
        self.stats.add(record)
        self.log.write(record.log_fields(), body)

    def close(self) -> None:
        self.log.close()


def _served_record(
    request: GatewayRequest, route: RouteRequest, decision: RouteDecision, outcome: UpstreamOutcome
) -> RequestRecord:
    usage = outcome.usage or Usage()
    stream = request.stream
    completion_tokens = outcome.generated_at_least if stream else usage.completion_tokens
    granted = route.max_tokens
    over_cap = completion_tokens - granted if isinstance(completion_tokens, int) and granted else 0
    return RequestRecord(
        request_id=request.request_id,
        model=route.model,
        tenant=request.tenant_name or UNAUTHENTICATED,
        backend=decision.backend,
        reason=decision.reason,
        stream=stream,
        prompt_tokens=route.prompt_tokens,
        predicted_cached_tokens=decision.predicted_cached_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=completion_tokens,
        over_cap_tokens=max(over_cap, 0),
        retention="client" if route.session_key else "inferred" if decision.retention_key else None,
        error_code=outcome.error_code,
        ttft_s=None if outcome.first_token_at is None else outcome.first_token_at - request.started,
        e2e_s=time.perf_counter() - request.started,
    )


def _add_pd(record: RequestRecord, pd: PdOutcome | None) -> None:
    if pd is None:
        return
    record.pd = pd.decision.value
    record.prefill_backend = pd.prefill_backend if pd.prefill_s is not None else None
    record.prefill_prompt_tokens, record.prefill_cached_tokens = pd.prefill_prompt_tokens, pd.prefill_cached_tokens


def _relayed_in_full(outcome: UpstreamOutcome) -> bool:
    """The backend finished the answer and every byte of it was handed to the client's connection."""
    return outcome.completed and not outcome.client_gone


def _status(outcome: UpstreamOutcome) -> str:
    if outcome.client_gone:
        return CLIENT_GONE
    if outcome.status == 200 and not outcome.completed:
        return "incomplete"
    return str(outcome.status)
