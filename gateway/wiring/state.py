"""The composition root: the gateway's long-lived parts, built from the config and shared by every request.

Only the app factory and the request handlers import this module; every other part is handed
the parts it reads. ``Gateway.build`` makes the parts and ``Gateway.apply`` swaps a reloaded
config into them, so what a reload changes is decided in one place beside what a start builds.
"""

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from gateway.admission.caps import RequestCaps
from gateway.admission.limiter import LimiterCollector, TenantLimiter
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.parent_limiter import ParentLimiter
from gateway.admission.queue import AdmissionQueue
from gateway.admission.redis_limiter import RedisLimiter
from gateway.admission.tenants import TenantRegistry
from gateway.admission.tokenize_slots import TokenizeSlots
from gateway.backends.discovery import Discovery
from gateway.backends.pool import BackendPool
from gateway.config import BackendSpec, ConfigError, KvgateConfig
from gateway.dispatch import Dispatcher
from gateway.observability.live_metrics import LiveStateCollector
from gateway.observability.telemetry import Telemetry
from gateway.openai_request import Endpoint
from gateway.process.workers.identity import WorkerIdentity
from gateway.routing.router import ReplicaSpec, Router
from gateway.served_model import ModelRegistry

log = logging.getLogger("kvgate.gateway")

DEFAULT_MAX_TOKENS = {Endpoint.CHAT: 256, Endpoint.COMPLETIONS: 16, Endpoint.RESPONSES: 256, Endpoint.EMBEDDINGS: 0}
"""What a request without max_tokens is assumed to need (OpenAI's completions default is 16)."""


@dataclass
class Gateway:
    config: KvgateConfig
    models: ModelRegistry
    pool: BackendPool
    router: Router
    session: aiohttp.ClientSession
    queue: AdmissionQueue
    dispatcher: Dispatcher
    tenants: TenantRegistry
    limits: RequestCaps
    telemetry: Telemetry
    tokenize_slots: TokenizeSlots
    discovery: Discovery = field(init=False)
    """Replicas found in DNS or through the Kubernetes API (``discovery``), served beside the config's ``backends``."""
    _applying: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    """One change of the backend set at a time: a reload or a discovery."""

    def __post_init__(self) -> None:
        self.discovery = Discovery(self.apply_discovered)
        self.discovery.configure(self.config.discovery)

    @classmethod
    def build(cls, config: KvgateConfig) -> "Gateway":
        models = ModelRegistry.from_config(config)
        pool = BackendPool.from_specs(backend_specs(config), config.health)
        router = Router(config.routing, config.block_size, replica_specs(config))
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        queue = AdmissionQueue(config.limits.max_queue, config.limits.queue_timeout_s)
        dispatcher = Dispatcher(pool, router, queue, config.timeouts, config.block_size)
        limits = RequestCaps(config.limits, pool.context_length)
        telemetry = Telemetry(config.observability, config.block_size)
        tenants = TenantRegistry(config.tenants, limiter=tenant_limiter(config))
        return cls(
            config, models, pool, router, session, queue, dispatcher, tenants, limits, telemetry, TokenizeSlots()
        )

    async def apply(self, config: KvgateConfig, source: str) -> None:
        """Swap a reloaded config in; ConfigError (naming ``source``) leaves everything as it was.

        New backends are added and removed ones drain; policies, limits, tenants and timeouts
        apply to the requests that arrive next. Tenants keep their in-flight counts and token
        budgets. block_size cannot change live; listen and shared_state changes wait for the
        next restart.
        """
        async with self._applying:
            await self._apply(config, source)

    async def _apply(self, config: KvgateConfig, source: str) -> None:
        if config.block_size != self.config.block_size:
            raise ConfigError(f"invalid config {source}: block_size cannot change without a restart")
        if config.listen != self.config.listen:
            log.warning("listen changes in %s take effect at the next restart", source)
            config.listen = self.config.listen
        if config.shared_state != self.config.shared_state:
            log.warning("shared_state changes in %s take effect at the next restart", source)
            config.shared_state = self.config.shared_state
        if config.workers != self.config.workers:
            log.warning("a workers change in %s takes effect at the next restart", source)
            config.workers = self.config.workers
        try:
            tenants = TenantRegistry(config.tenants, self.tenants)
        except ValueError as exc:
            raise ConfigError(f"invalid config {source}: {exc}") from None
        models = self.models
        if _model_sources(config) != _model_sources(self.config):
            models = await asyncio.to_thread(ModelRegistry.from_config, config)
        try:
            self.router.update(config.routing, replica_specs(self._with_discovered(config), self.pool))
        except ValueError as exc:
            raise ConfigError(f"invalid config {source}: routing: {exc}") from None
        if config.discovery != self.config.discovery:
            self.discovery.configure(config.discovery)
            self.router.update(config.routing, replica_specs(self._with_discovered(config), self.pool))
        self.config = config
        self.models = models
        self.tenants = tenants
        self.limits = RequestCaps(config.limits, self.pool.context_length)
        self.queue.configure(config.limits.max_queue, config.limits.queue_timeout_s)
        self.dispatcher.timeouts = config.timeouts
        self.telemetry.pricing = config.observability.pricing
        await self._update_backends(config)

    async def apply_discovered(self) -> None:
        """Serve the replicas discovery found now, beside the config's backends."""
        async with self._applying:
            self.router.update(self.config.routing, replica_specs(self._with_discovered(self.config), self.pool))
            await self._update_backends(self.config)

    async def _update_backends(self, config: KvgateConfig) -> None:
        await self.pool.update(backend_specs(self._with_discovered(config)), config.health, self.session)

    def _with_discovered(self, config: KvgateConfig) -> KvgateConfig:
        """``config`` with the discovered replicas added to its backends (a name it lists wins)."""
        listed = {backend.name for backend in config.backends}
        found = [backend for backend in self.discovery.backends if backend.name not in listed]
        return config.model_copy(update={"backends": [*config.backends, *found]}) if found else config

    def default_max_tokens(self, endpoint: Endpoint) -> int:
        return DEFAULT_MAX_TOKENS[endpoint]

    async def start(self) -> None:
        self.telemetry.metrics.register(LiveStateCollector(self.pool, self.router, self.queue, self.dispatcher.held))
        self.telemetry.metrics.register(LimiterCollector(self.tenants.limiter))
        await self.tenants.limiter.start()
        self.pool.on_change(self.sync_router_capacity)
        self.pool.on_pending = self.router.tracker.record_pending
        self.pool.on_restarted = self.router.on_restarted
        await self.router.start()
        await self.pool.start(self.session)
        await self.discovery.start()

    def sync_router_capacity(self) -> None:
        """Give the router each replica's KV size as soon as the replica reports it (predicted mode)."""
        specs = replica_specs(self._with_discovered(self.config), self.pool)
        if specs != self.router.replicas:
            self.router.update(self.config.routing, specs)

    async def stop(self) -> None:
        await self.discovery.stop()
        await self.pool.stop()
        await self.router.stop()
        await self.session.close()
        self.dispatcher.upstream.close()
        await self.tenants.limiter.stop()
        self.telemetry.close()


def tenant_limiter(config: KvgateConfig) -> TenantLimiter:
    """Where tenant caps are counted: Redis shared by every gateway when configured, else the parent
    of this worker's siblings, else this process."""
    if config.shared_state:
        return RedisLimiter(config.shared_state)
    worker = WorkerIdentity.from_env()
    return ParentLimiter(worker.limits_socket, worker.count) if worker is not None else LocalLimiter()


def backend_specs(config: KvgateConfig) -> list[tuple[BackendSpec, str]]:
    """Each backend with the model it serves."""
    return [(backend, config.backend_model(backend)) for backend in config.backends]


def replica_specs(config: KvgateConfig, pool: BackendPool | None = None) -> list[ReplicaSpec]:
    """What the router needs of each backend; capacity from the config, else as the replica reports it."""
    return [
        ReplicaSpec(
            backend.name,
            config.backend_model(backend),
            backend.kv_events,
            backend.kv_capacity_blocks or _reported_capacity(pool, backend.name),
            backend.kv_events_replay,
        )
        for backend in config.backends
    ]


def _model_sources(config: KvgateConfig) -> tuple:
    """What the model registry is built from."""
    backends = tuple((backend.model, backend.tokenizer) for backend in config.backends)
    return config.model, config.tokenizer, config.normalize, backends


def _reported_capacity(pool: BackendPool | None, name: str) -> int | None:
    backend = pool.backends.get(name) if pool is not None else None
    return backend.kv_capacity_blocks if backend is not None else None


GATEWAY = web.AppKey("gateway", Gateway)
