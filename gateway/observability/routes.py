"""HTTP endpoints for operators: /metrics (Prometheus), /dashboard and its stats JSON.

/metrics and the stats JSON are operator endpoints (`require_admin`): with `admin.api_key` set they
need it as a Bearer key, without one they answer loopback clients only. The dashboard's page and
static files are public (they hold no data); the page asks for the key when its stats call gets a 401.
"""

from pathlib import Path

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.admission.auth import require_admin
from gateway.observability.dashboard_stats import dashboard_stats
from gateway.wiring.state import GATEWAY

STATIC_DIR = Path(__file__).parent / "dashboard" / "static"


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    require_admin(request, gateway.config.admin.api_key)
    body = gateway.telemetry.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def dashboard_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def stats_json(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    require_admin(request, gateway.config.admin.api_key)
    stats = dashboard_stats(gateway.telemetry, gateway.pool, gateway.queue, gateway.router)
    body = orjson.dumps(stats, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/dashboard", dashboard_page)
    app.router.add_get("/dashboard/stats.json", stats_json)
    app.router.add_static("/dashboard/static", STATIC_DIR)
