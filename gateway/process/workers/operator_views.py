"""The operator endpoints of a worker answer for all workers: /metrics, the dashboard's stats,
/admin/backends and /admin/reload.

A middleware lets the local handler answer first (it checks the admin key and gives this
worker's view), then asks the siblings over their private sockets and merges. A sibling that
does not answer (restarting) is left out; the dashboard JSON says how many workers it sums.
"""

import copy
import pickle
from collections import Counter
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.observability.dashboard_stats import dashboard_stats
from gateway.observability.metrics_merge import merge_expositions
from gateway.observability.stats_merge import merge_breaker_tables, merge_windows
from gateway.process.workers.private_app import worker_stats
from gateway.process.workers.siblings import Siblings
from gateway.wiring.state import GATEWAY

View = Callable[[web.Request, web.Response, Siblings], Awaitable[web.Response]]


def sum_over_workers(siblings: Siblings) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        view = _VIEWS.get((request.method, request.path))
        if view is None or response.status != 200 or not isinstance(response, web.Response):
            return response
        return await view(request, response, siblings)

    return middleware


async def _metrics(request: web.Request, local: web.Response, siblings: Siblings) -> web.Response:
    body = merge_expositions([_body(local), *await siblings.bodies("/metrics")])
    return web.Response(body=body, headers={"Content-Type": local.headers["Content-Type"]})


async def _stats(request: web.Request, local: web.Response, siblings: Siblings) -> web.Response:
    gateway = request.app[GATEWAY]
    parts = [worker_stats(gateway), *(pickle.loads(body) for body in await siblings.bodies("/stats"))]
    telemetry = copy.copy(gateway.telemetry)
    telemetry.stats = merge_windows([part["window"] for part in parts])
    stats = dashboard_stats(telemetry, gateway.pool, gateway.queue, gateway.router)
    waiting: Counter[str] = Counter()
    for part in parts:
        waiting.update(part["waiting"])
    stats["queue"] = {"depth": sum(waiting.values()), "by_tenant": dict(waiting)}
    for tenant in stats["tenants"]:
        tenant["queued"] = waiting.get(tenant["tenant"], 0)
    for replica in stats["replicas"]:
        loads = [part["in_flight"].get(replica["name"], (0, 0)) for part in parts]
        replica["in_flight"] = sum(load[0] for load in loads)
        replica["in_flight_prefill_tokens"] = sum(load[1] for load in loads)
    stats["prefix_breakers"] = merge_breaker_tables([part["breakers"] for part in parts])
    stats["workers"] = len(parts)
    body = orjson.dumps(stats, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})


async def _backends(request: web.Request, local: web.Response, siblings: Siblings) -> web.Response:
    views = [orjson.loads(_body(local)), *(orjson.loads(body) for body in await siblings.bodies("/backends"))]
    merged = views[0]
    for view in views[1:]:
        others = {backend["name"]: backend for backend in view["backends"]}
        for backend in merged["backends"]:
            other = others.get(backend["name"], {})
            backend["in_flight"] += other.get("in_flight", 0)
            backend["kv_reserved_blocks"] += other.get("kv_reserved_blocks", 0)
        for key in ("queued", "tenants_in_flight"):
            merged[key] = dict(Counter(merged[key]) + Counter(view[key]))
    merged["workers"] = len(views)
    return web.Response(body=orjson.dumps(merged), content_type="application/json")


async def _reload(request: web.Request, local: web.Response, siblings: Siblings) -> web.Response:
    """This worker reloaded; now every sibling re-reads the same file."""
    body = orjson.loads(_body(local))
    workers = {str(siblings.identity.index): "reloaded"}
    for index, reply in (await siblings.call("POST", f"/reload?{request.query_string}")).items():
        workers[str(index)] = "unreachable" if reply is None else orjson.loads(reply[1])["status"]
    body["workers"] = workers
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _body(response: web.Response) -> bytes:
    body = response.body
    return body if isinstance(body, bytes) else b""


_VIEWS: dict[tuple[str, str], View] = {
    ("GET", "/metrics"): _metrics,
    ("GET", "/dashboard/stats.json"): _stats,
    ("GET", "/admin/backends"): _backends,
    ("POST", "/admin/reload"): _reload,
}
