"""The ``/admin`` sub-app: its routes behind one admin-auth middleware."""

from aiohttp import web
from pydantic import SecretStr

from gateway.admin.status import admission_status
from gateway.admission.auth import admin_only
from gateway.wiring.reload import reload_endpoint
from gateway.wiring.state import GATEWAY


def admin_app() -> web.Application:
    """/admin/*: one sub-app behind one admin-auth middleware."""
    admin = web.Application(middlewares=[admin_only(_admin_key)])
    admin.router.add_post("/reload", reload_endpoint)
    admin.router.add_get("/backends", admission_status)
    return admin


def _admin_key(request: web.Request) -> SecretStr | None:
    return request.config_dict[GATEWAY].config.admin.api_key
