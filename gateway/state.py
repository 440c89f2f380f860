"""The gateway's long-lived parts, built from the config and shared by every request."""

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.admission.caps import RequestCaps
from gateway.admission.tenants import TenantRegistry
from gateway.backends.pool import BackendPool
from gateway.config import BackendSpec, KvgateConfig
from gateway.dispatch import Dispatcher
from gateway.observability.live_metrics import LiveStateCollector
from gateway.observability.telemetry import Telemetry
from gateway.openai_request import Endpoint
from gateway.routing.router import ReplicaSpec, Router
from gateway.served_model import ModelRegistry

DEFAULT_MAX_TOKENS = {Endpoint.CHAT: 256, Endpoint.COMPLETIONS: 16}
"""What a request without max_tokens is assumed to need (OpenAI's completions default is 16)."""


@dataclass
class Gateway:
    config: KvgateConfig
    models: ModelRegistry
    pool: BackendPool
    router: Router
    session: aiohttp.ClientSession
    dispatcher: Dispatcher
    tenants: TenantRegistry
    limits: RequestCaps
    telemetry: Telemetry

    @classmethod
    def build(cls, config: KvgateConfig) -> "Gateway":
        models = ModelRegistry.from_config(config)
        pool = BackendPool.from_specs(backend_specs(config), config.health)
        router = Router(config.routing, config.block_size, replica_specs(config))
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        dispatcher = Dispatcher(pool, router, session, config.timeouts, config.limits, config.block_size)
        limits = RequestCaps(config.limits, pool.context_length)
        telemetry = Telemetry(config.observability, config.block_size)
        return cls(config, models, pool, router, session, dispatcher, TenantRegistry(config.tenants), limits, telemetry)

    def default_max_tokens(self, endpoint: Endpoint) -> int:
        return DEFAULT_MAX_TOKENS[endpoint]

    async def start(self) -> None:
        self.telemetry.metrics.register(LiveStateCollector(self))
        self.pool.on_change(self.sync_router_capacity)
        await self.router.start()
        await self.pool.start(self.session)

    def sync_router_capacity(self) -> None:
        """Give the router each replica's KV size as soon as the replica reports it (predicted mode)."""
        specs = replica_specs(self.config, self.pool)
        if specs != self.router.replicas:
            self.router.update(self.config.routing, specs)

    async def stop(self) -> None:
        await self.pool.stop()
        await self.router.stop()
        await self.session.close()
        self.telemetry.close()


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
        )
        for backend in config.backends
    ]


def _reported_capacity(pool: BackendPool | None, name: str) -> int | None:
    backend = pool.backends.get(name) if pool is not None else None
    return backend.kv_capacity_blocks if backend is not None else None


GATEWAY = web.AppKey("gateway", Gateway)
