"""Access to the operator endpoints (/admin/*, /metrics, the dashboard's stats).

With `admin.api_key` configured a request must carry it as a Bearer key; without one, only
loopback clients are served. ``admin_only`` is the /admin sub-app's middleware; the operator
endpoints outside /admin call ``require_admin`` with the same key.
"""

import ipaddress
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import SecretStr

from gateway.admission.bearer import bearer_token, key_matches, unauthorized
from gateway.errors import OpenAIError

AdminKeyOf = Callable[[web.Request], SecretStr | None]
"""The admin key in force for a request (it can change on reload)."""


def require_admin(request: web.Request, admin_key: SecretStr | None) -> None:
    """Raise 401/403 unless the caller may use operator endpoints."""
    if admin_key is None:
        if not _is_loopback(request.remote):
            raise OpenAIError(
                403, "Admin endpoints answer loopback clients only unless admin.api_key is set.", code="forbidden"
            )
        return
    given = bearer_token(request)
    if given is None or not key_matches(given, admin_key.get_secret_value()):
        raise unauthorized("This endpoint needs the admin API key.")


def admin_only(admin_key_of: AdminKeyOf) -> Middleware:
    """The middleware that guards every route of the admin sub-app."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        require_admin(request, admin_key_of(request))
        return await handler(request)

    return guard


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
