"""`GET /admin/backends`: what admission sees right now, per replica, queue and tenant."""

import orjson
from aiohttp import web

from gateway.wiring.state import GATEWAY


async def admission_status(request: web.Request) -> web.Response:
    gateway = request.config_dict[GATEWAY]
    backends = [
        {
            "name": backend.name,
            "url": backend.spec.url,
            "healthy": backend.healthy,
            "draining": backend.draining,
            "breaker": backend.breaker.state.value,
            "in_flight": backend.in_flight,
            "kv_reserved_blocks": backend.kv_reserved_blocks,
            "kv_capacity_blocks": backend.kv_capacity_blocks,
            "max_model_len": backend.max_model_len,
        }
        for backend in gateway.pool.backends.values()
    ]
    tenants = [gateway.tenants.anonymous, *gateway.tenants.by_name.values()]
    body = {
        "backends": backends,
        "queued": gateway.queue.waiting_by_tenant(),
        "tenants_in_flight": {tenant.name: tenant.usage.in_flight for tenant in tenants},
        "shared_state": await gateway.tenants.limiter.shared_status(tenants),
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")
