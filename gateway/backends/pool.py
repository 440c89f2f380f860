"""The replicas behind the gateway: their health, their load (reported and in flight) and their stats."""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from gateway.admission.kv_blocks import fits
from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.load_feed import LoadFeed, read_metrics_load, read_stats
from gateway.backends.load_view import LoadView, SentRequest
from gateway.backends.secret_redaction import Redactor, backend_secrets, redactor_for
from gateway.config import BackendSpec, HealthConfig
from gateway.routing.config import DisaggregationConfig
from gateway.routing.pd_decider import fleet_disaggregates
from gateway.routing.prefill_overflow import client_candidates
from gateway.routing.types import ReplicaState
from protocol.load_mark import LoadMark
from protocol.replica_stats import ReplicaLoad, ReplicaStats

LOAD_SOCKET_STALE_S = 1.0
"""A load-socket report older than this (the engine sends one every 50 ms) no longer counts."""

log = logging.getLogger("kvgate.backends")


@dataclass(eq=False)
class Backend:
    """One replica and what the gateway knows of it right now."""

    spec: BackendSpec
    model: str
    breaker: CircuitBreaker
    healthy: bool = False
    removed: bool = False
    """Gone from the config: takes no new requests, leaves the pool once idle."""
    in_flight: int = 0
    in_flight_prefill_tokens: int = 0
    kv_reserved_blocks: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    reported: ReplicaStats | None = None
    """The replica's own numbers from its /stats (bundled engine), refreshed by health checks."""
    load: LoadView = field(default_factory=lambda: LoadView(LOAD_SOCKET_STALE_S))
    """Its total load: the latest report (load socket, /stats or vLLM's /metrics) and this gateway's requests."""
    feed: LoadFeed | None = None
    """The task reading its load socket, when it has one."""
    max_model_len: int | None = None
    """The context length its /v1/models reports (bundled engine, vLLM), read when it turns healthy."""
    reported_adapters: frozenset[str] = frozenset()
    """LoRA adapters its /v1/models lists (vLLM: entries with a `parent`), read when it turns healthy."""
    last_checked: float = 0.0
    started_at: float | None = None
    """The latest process start time the replica reported (``ReplicaLoad.started_at``)."""
    restarts: int = 0
    """Restarts seen from its start time since this gateway started."""

    def serves_adapter(self, adapter: str | None) -> bool:
        return adapter is None or adapter in self.spec.adapters or adapter in self.reported_adapters

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def redactor(self) -> Redactor:
        """Keeps this replica's configured secrets (API key, credential headers) out of what is relayed."""
        return redactor_for(backend_secrets(self.spec.upstream_api_key(), self.spec.headers))

    @property
    def draining(self) -> bool:
        return self.removed or self.spec.drain

    @property
    def has_room(self) -> bool:
        limit = self.spec.max_concurrency
        return limit is None or self.in_flight < limit

    @property
    def kv_capacity_blocks(self) -> int | None:
        return self.spec.kv_capacity_blocks or (self.reported.num_blocks if self.reported is not None else None)

    @property
    def takes_retention_hints(self) -> bool:
        """Gets ``kvgate_session``: as configured, else when it is a bundled engine (it has /stats)."""
        configured = self.spec.retention_hints
        return bool(self.reported) if configured is None else configured

    @property
    def usable(self) -> bool:
        """May take a new request at all (load aside)."""
        return self.healthy and not self.draining and self.breaker.allows_request()

    @property
    def takes_client_requests(self) -> bool:
        """Serves a client's whole request (or a decode leg): every role but ``prefill`` (which does too
        past ``prefill_overflow_s``: ``BackendPool.usable``)."""
        return self.spec.role != "prefill"

    @property
    def takes_prefill_legs(self) -> bool:
        """Serves the prefill leg of a disaggregated request: every role but ``decode``."""
        return self.spec.role != "decode"

    def fits(self, kv_blocks: int) -> bool:
        return self.has_room and fits(self.kv_reserved_blocks, kv_blocks, self.kv_capacity_blocks)

    @property
    def latest_report(self) -> ReplicaLoad | None:
        return self.load.report or self.reported

    def state(self) -> ReplicaState:
        load = self.load.now()
        report = self.latest_report
        return ReplicaState(
            name=self.name,
            model=self.model,
            healthy=self.healthy,
            in_flight=self.in_flight,
            in_flight_prefill_tokens=self.in_flight_prefill_tokens,
            max_concurrency=self.spec.max_concurrency,
            num_running=load.running,
            num_waiting=load.waiting,
            queued_prefill_tokens=load.queued_prefill_tokens,
            prefix_waits=load.prefix_waits,
            kv_usage=report.kv_cache_usage if report is not None else None,
            prefill_tokens_per_s=report.prefill_tokens_per_s if report is not None else None,
            decodes=load.decodes,
        )

    def occupy(self, prefill_tokens: int, kv_blocks: int, waiting_tokens: int) -> "Occupancy":
        """Count a request as in flight here, holding its KV reservation, for the duration of the block;
        ``waiting_tokens``: what the replica's load report counts for it while it waits
        (``LoadView``).

        Yields ``prefill_done``: call it at the first token, when the replica has finished the
        request's prefill, so routing stops counting those tokens as queued work here.
        """
        return Occupancy(self, prefill_tokens, kv_blocks, waiting_tokens)

    def record_check(self, ok: bool, config: HealthConfig) -> bool:
        """Apply one health-check result with the configured thresholds; True when it turned healthy."""
        self.last_checked = time.monotonic()
        if ok:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            if not self.healthy and self.consecutive_successes >= config.healthy_after:
                log.info("backend %s is healthy", self.name)
                self.healthy = True
                self.breaker.reset()
                return True
        else:
            self.consecutive_successes = 0
            self.consecutive_failures += 1
            if self.healthy and self.consecutive_failures >= config.unhealthy_after:
                log.warning("backend %s is unhealthy", self.name)
                self.healthy = False
        return False


_NO_OVERFLOW = DisaggregationConfig()
"""No ``prefill_overflow_s``: a ``prefill`` replica takes no client request."""


def _takes_client_requests(backend: Backend) -> bool:
    return backend.takes_client_requests


class BackendPool:
    """All backends by name, with an active health checker."""

    def __init__(self, backends: list[Backend], health: HealthConfig) -> None:
        self.backends: dict[str, Backend] = {backend.name: backend for backend in backends}
        self.health = health
        self._listeners: list[Callable[[], None]] = []
        self._checker: asyncio.Task | None = None
        self._started = False
        self.on_pending: Callable[[str, list[list[bytes]]], None] = lambda name, chains: None
        """Takes the prefixes a replica says it is about to cache (its load socket's ``pending_prefixes``)."""
        self.on_restarted: Callable[[str], None] = lambda name: None
        """Told the name of a replica that reports a later start time than before: its KV cache is empty."""

    @classmethod
    def from_specs(cls, specs: list[tuple[BackendSpec, str]], health: HealthConfig) -> "BackendPool":
        return cls([Backend(spec, model, CircuitBreaker(spec.name, health)) for spec, model in specs], health)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every health-check round and config update (capacity may differ)."""
        self._listeners.append(listener)

    def serving(self, model: str) -> list[Backend]:
        return [backend for backend in self.backends.values() if backend.model == model]

    def usable(
        self, model: str, settings: DisaggregationConfig | None = None, assumed_tokens_per_s: float = 1.0
    ) -> list[Backend]:
        """The replicas of ``model`` that may take a client's request (healthy, not draining, breaker
        closed, not prefill-only; prefill-only ones too while ``settings`` says the fleet is past
        capacity, gateway/routing/prefill_overflow.py, at ``assumed_tokens_per_s`` where a replica
        reports no prefill rate).

        This is the routing pipeline's filter stage, in the one place that knows these facts;
        the dispatcher then keeps those with a free slot and hands them to the router.
        """
        usable = [backend for backend in self.serving(model) if backend.usable]
        return client_candidates(
            usable, _takes_client_requests, Backend.state, settings or _NO_OVERFLOW, assumed_tokens_per_s
        )

    def prefill_usable(self, model: str) -> list[Backend]:
        """The replicas of ``model`` that may take a prefill leg now (role ``prefill`` or ``both``)."""
        return [backend for backend in self.serving(model) if backend.usable and backend.takes_prefill_legs]

    def disaggregates(self, model: str, settings: DisaggregationConfig) -> bool:
        """The model's requests may run their prefill on one replica and their decode on another
        (``fleet_disaggregates``)."""
        return fleet_disaggregates((backend.spec.role for backend in self.serving(model)), settings)

    def reported_adapters(self) -> dict[str, str]:
        """LoRA adapters the replicas list in their /v1/models, each with the model it adapts."""
        return {adapter: backend.model for backend in self.backends.values() for adapter in backend.reported_adapters}

    def context_length(self, model: str) -> int | None:
        """The smallest context length the model's replicas report."""
        reported = [backend.max_model_len for backend in self.serving(model) if backend.max_model_len]
        return min(reported) if reported else None

    async def update(
        self, specs: list[tuple[BackendSpec, str]], health: HealthConfig, session: aiohttp.ClientSession
    ) -> None:
        """Adopt a new config: add new backends, update changed ones, drain removed (and `drain:`) ones.

        A new backend (or one moved to a new URL) is health-checked before it joins, so a reload
        never leaves the pool with only replicas it has not checked yet.
        """
        wanted = {spec.name: (spec, model) for spec, model in specs}
        fresh = [
            Backend(spec, model, CircuitBreaker(name, health))
            for name, (spec, model) in wanted.items()
            if name not in self.backends or self.backends[name].spec.url != spec.url
        ]
        await asyncio.gather(*(self._check(session, backend) for backend in fresh))
        self.health = health
        self.backends.update({backend.name: backend for backend in fresh})
        for name, backend in self.backends.items():
            if name in wanted:
                backend.spec, backend.model = wanted[name]
                backend.removed = False
                backend.breaker.config = health
            elif not backend.removed:
                log.info("backend %s removed from the config: draining", name)
                backend.removed = True
        await self._drop_drained()
        await self._sync_feeds()
        self._changed()

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._started = True
        await self.check_all(session)
        self._checker = asyncio.create_task(self._check_forever(session))

    async def stop(self) -> None:
        self._started = False
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
        await asyncio.gather(*(self._set_feed(backend, None) for backend in self.backends.values()))

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._check(session, backend) for backend in list(self.backends.values())))
        await self._drop_drained()
        await self._sync_feeds()
        self._changed()

    async def _sync_feeds(self) -> None:
        """Follow the load socket of each backend that declares one (and only those)."""
        if self._started:
            await asyncio.gather(
                *(self._set_feed(backend, backend.spec.load_events) for backend in self.backends.values())
            )

    async def _set_feed(self, backend: Backend, endpoint: str | None) -> None:
        if backend.feed is not None and backend.feed.endpoint != endpoint:
            await backend.feed.stop()
            backend.feed = None
        if endpoint is not None and backend.feed is None:
            name = backend.name
            backend.feed = LoadFeed(endpoint, backend.load, lambda chains: self.on_pending(name, chains))
            backend.feed.start()

    async def _check_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.health.interval_s)
            await self.check_all(session)

    async def _check(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        timeout = aiohttp.ClientTimeout(total=self.health.timeout_s)
        url = backend.spec.url
        headers = backend.spec.upstream_headers()
        try:
            async with session.get(f"{url}/health", timeout=timeout, headers=headers) as response:
                ok = response.status == 200
            if ok:
                await self._read_load(session, backend, timeout, headers)
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        if backend.record_check(ok, self.health):
            models = await _get_json(session, f"{url}/v1/models", timeout, headers)
            backend.max_model_len = _max_model_len(models)
            backend.reported_adapters = _adapters(models)

    async def _read_load(
        self,
        session: aiohttp.ClientSession,
        backend: Backend,
        timeout: aiohttp.ClientTimeout,
        headers: dict[str, str],
    ) -> None:
        """Stats from /stats (bundled engine), else load from /metrics (vLLM, SGLang); a report for the load view
        unless its load socket reports far more often. ``headers``: the replica's upstream headers."""
        url = backend.spec.url
        backend.reported = await read_stats(session, url, timeout, headers)
        report: ReplicaLoad | None = backend.reported
        if report is None:
            report = await read_metrics_load(session, url, timeout, headers)
        if report is not None:
            self._note_start(backend, report.started_at)
        if report is not None and backend.spec.load_events is None:
            backend.load.stale_after_s = self.health.report_stale_after_s
            backend.load.on_report(report)

    def _note_start(self, backend: Backend, started_at: float | None) -> None:
        """A start time later than any the replica reported before is a restart (however quick:
        the health checks need not have seen it down). Only a later one: a URL that reaches
        several processes in turn (a Service in front of pods) reports a restart once, not every check."""
        if started_at is None:
            return
        if backend.started_at is not None and started_at > backend.started_at:
            log.warning("backend %s restarted: forgetting the prefixes it held", backend.name)
            backend.restarts += 1
            self.on_restarted(backend.name)
        backend.started_at = max(started_at, backend.started_at or started_at)

    async def _drop_drained(self) -> None:
        for name in [name for name, backend in self.backends.items() if backend.removed and not backend.in_flight]:
            log.info("backend %s drained and removed", name)
            await self._set_feed(self.backends.pop(name), None)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()


async def _get_json(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout, headers: dict[str, str]
) -> dict | None:
    """A JSON object from ``url``, or None."""
    try:
        async with session.get(url, timeout=timeout, headers=headers) as response:
            if response.status == 200:
                value = await response.json(content_type=None)
                return value if isinstance(value, dict) else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        pass
    return None


def _max_model_len(models: dict | None) -> int | None:
    data = (models or {}).get("data")
    entries = [entry.get("max_model_len") for entry in data or [] if isinstance(entry, dict)]
    lengths = [length for length in entries if isinstance(length, int) and length > 0]
    return min(lengths) if lengths else None


def _adapters(models: dict | None) -> frozenset[str]:
    data = (models or {}).get("data")
    entries = [entry for entry in data or [] if isinstance(entry, dict)]
    return frozenset(entry["id"] for entry in entries if entry.get("parent") and isinstance(entry.get("id"), str))


class Occupancy:
    """One request in flight on a backend (``Backend.occupy``); a plain class, not a generator
    context manager, as it is entered once per request."""

    __slots__ = ("_backend", "_kv_blocks", "_pending_prefill", "_sent", "_waiting_tokens")
    _sent: SentRequest
    """Set on entering."""

    def __init__(self, backend: Backend, prefill_tokens: int, kv_blocks: int, waiting_tokens: int) -> None:
        self._backend = backend
        self._kv_blocks = kv_blocks
        self._pending_prefill = prefill_tokens
        self._waiting_tokens = waiting_tokens

    def __enter__(self) -> Callable[[], None]:
        backend, prefill_tokens = self._backend, self._pending_prefill
        backend.in_flight += 1
        backend.in_flight_prefill_tokens += prefill_tokens
        backend.kv_reserved_blocks += self._kv_blocks
        backend.breaker.on_request()
        self._sent = backend.load.on_sent(prefill_tokens, self._waiting_tokens)
        return self.prefill_done

    @property
    def load_mark(self) -> LoadMark:
        """The request's number in the backend's load view, for its ``x-kvgate-load-mark`` header."""
        return self._sent.mark

    def add_prefill(self, tokens: int) -> None:
        """``tokens`` more of the request's prompt are to be prefilled here than it was counted with."""
        self._backend.in_flight_prefill_tokens += tokens
        self._pending_prefill += tokens
        self._backend.load.add_prefill(self._sent, tokens)

    def prefill_done(self) -> None:
        backend = self._backend
        backend.in_flight_prefill_tokens -= self._pending_prefill
        self._pending_prefill = 0
        backend.load.on_prefilled(self._sent)

    def __exit__(self, *exc_info: object) -> None:
        backend = self._backend
        backend.in_flight -= 1
        self.prefill_done()
        backend.load.on_finished(self._sent)
        backend.kv_reserved_blocks -= self._kv_blocks
