"""The gateway's long-lived parts, built from the config and shared by every request."""

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.backend_pool import Backend, BackendPool
from gateway.config import KvgateConfig
from gateway.dispatch import Dispatcher
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

    @classmethod
    def build(cls, config: KvgateConfig) -> "Gateway":
        models = ModelRegistry.from_config(config)
        pool = BackendPool(
            [Backend(spec, config.backend_model(spec)) for spec in config.backends], config.health
        )
        router = Router(config.routing, config.block_size, replica_specs(config))
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        return cls(config, models, pool, router, session, Dispatcher(pool, router, session, config.timeouts))

    def default_max_tokens(self, endpoint: Endpoint) -> int:
        return DEFAULT_MAX_TOKENS[endpoint]

    async def start(self) -> None:
        await self.router.start()
        await self.pool.start(self.session)

    async def stop(self) -> None:
        await self.pool.stop()
        await self.router.stop()
        await self.session.close()


def replica_specs(config: KvgateConfig) -> list[ReplicaSpec]:
    return [
        ReplicaSpec(backend.name, config.backend_model(backend), backend.kv_events, backend.kv_capacity_blocks)
        for backend in config.backends
    ]


GATEWAY = web.AppKey("gateway", Gateway)
