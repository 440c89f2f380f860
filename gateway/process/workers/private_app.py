"""What one worker tells its siblings, on its private unix socket (the parent's 0700 folder).

The worker that answers an operator's /metrics, dashboard stats or /admin request asks the
others here and merges (gateway/process/workers/operator_views.py). Nothing here is reachable from the
network, so these routes carry no admin auth.
"""

import pickle

import orjson
from aiohttp import web

from gateway.admin.status import admission_status
from gateway.config import ConfigError
from gateway.wiring.reload import CONFIG_PATH, reload_config
from gateway.wiring.reload_guard import parse_allowance
from gateway.wiring.state import GATEWAY, Gateway


def private_app(public: web.Application) -> web.Application:
    """The private app of a worker whose public app ``public`` is set up (its Gateway built)."""
    app = web.Application()
    app[GATEWAY] = public[GATEWAY]
    if CONFIG_PATH in public:
        app[CONFIG_PATH] = public[CONFIG_PATH]
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/backends", admission_status)
    app.router.add_post("/reload", _reload)
    return app


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[GATEWAY].telemetry.metrics.exposition())


async def _stats(request: web.Request) -> web.Response:
    """The raw parts of this worker's dashboard stats, pickled (sibling processes of one parent)."""
    return web.Response(body=pickle.dumps(worker_stats(request.app[GATEWAY])))


def worker_stats(gateway: Gateway) -> dict:
    """What the dashboard needs from one worker to sum it with the others."""
    return {
        "window": gateway.telemetry.stats,
        "in_flight": {
            name: (backend.in_flight, backend.in_flight_prefill_tokens)
            for name, backend in gateway.pool.backends.items()
        },
        "waiting": gateway.queue.waiting_by_tenant(),
        "breakers": gateway.telemetry.breakers.table(),
    }


async def _reload(request: web.Request) -> web.Response:
    path = request.app.get(CONFIG_PATH)
    if path is None:
        return web.Response(status=409, body=orjson.dumps({"status": "no config file"}))
    try:
        await reload_config(request.app[GATEWAY], path, parse_allowance(request.query.getall("allow", [])))
    except ConfigError as exc:
        return web.Response(status=400, body=orjson.dumps({"status": "refused", "error": str(exc)}))
    return web.Response(body=orjson.dumps({"status": "reloaded"}))
